#!/bin/sh
# The image's entrypoint: runs `grouper node` by default, any other `grouper` sub-command on request.
#
#   docker run grouper:dev                         -> grouper node
#   docker run grouper:dev --peers a:5674,...      -> grouper node --peers a:5674,...
#   docker run grouper:dev cluster status          -> grouper cluster status
#
# The node is configured by GROUPER_* environment variables and flags (flags win). A config file
# (queue definitions) mounted at $GROUPER_CONFIG, default /etc/grouper/grouper.toml, is passed as
# --config unless the arguments name one. exec: the node becomes PID 1 and gets docker stop's
# SIGTERM itself; it installs its own SIGTERM handler, which PID 1 needs (no default action there).
set -eu

config_file="${GROUPER_CONFIG:-/etc/grouper/grouper.toml}"

case "${1:-}" in
    "" | -*) set -- node "$@" ;;
esac

if [ "$1" = node ] && [ -f "$config_file" ]; then
    case " $* " in
        *" --config "* | *" --config="*) ;;
        *) shift; set -- node --config "$config_file" "$@" ;;
    esac
fi

exec grouper "$@"
