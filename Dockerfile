# The Grouper node image. Build it with `python3 deploy/docker/build.py` (offline: the base image is a
# local debootstrap of Debian bookworm, the wheels are built on the host and staged in build/docker/).
#
# Runs `grouper node` as the non-root user grouper (uid/gid 10001) with its journal and raft log on
# the volume /var/lib/grouper, configured by GROUPER_* environment variables and flags; a config file
# mounted at /etc/grouper/grouper.toml is read too (see deploy/docker/entrypoint.sh).
ARG BASE_IMAGE=grouper-base:bookworm
FROM ${BASE_IMAGE}

ENV VIRTUAL_ENV=/opt/grouper/venv \
    PATH=/opt/grouper/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LANG=C.UTF-8

# One layer for the user, the directories and the venv: the vfs driver copies every layer whole.
RUN groupadd --system --gid 10001 grouper \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/grouper --no-create-home \
        --shell /usr/sbin/nologin grouper \
 && mkdir -p /var/lib/grouper /etc/grouper \
 && chown 10001:10001 /var/lib/grouper \
 && chmod 0700 /var/lib/grouper \
 && python3 -m venv "$VIRTUAL_ENV"

# Dependencies first: they change rarely, so this layer stays cached while the project changes.
COPY build/docker/wheels/deps/ /opt/grouper/wheels/deps/
RUN pip install --no-index --no-cache-dir --disable-pip-version-check --find-links /opt/grouper/wheels/deps \
        /opt/grouper/wheels/deps/*.whl \
 && rm -rf /opt/grouper/wheels/deps

COPY build/docker/wheels/grouper/ /opt/grouper/wheels/grouper/
COPY deploy/docker/entrypoint.sh /usr/local/bin/grouper-entrypoint
COPY deploy/docker/healthcheck.py /usr/local/bin/grouper-healthcheck
RUN pip install --no-index --no-cache-dir --disable-pip-version-check --no-deps /opt/grouper/wheels/grouper/*.whl \
 && rm -rf /opt/grouper/wheels \
 && chmod 0755 /usr/local/bin/grouper-entrypoint /usr/local/bin/grouper-healthcheck \
 && grouper --help >/dev/null

# require_data_volume: the node refuses to start unless /var/lib/grouper is a mounted volume (VOLUME
# below gives an anonymous one to a plain `docker run`), so a journal never lives in a container layer.
# Secure by default: nothing here lets anyone in. A node on 0.0.0.0 refuses to start without users
# (GROUPER_DEFAULT_USER and GROUPER_DEFAULT_PASSWORD_FILE make the first administrator), and a
# clustered one without cluster TLS and a raft secret; docker-compose.yml and deploy/k8s give both.
# GROUPER_ALLOW_ANONYMOUS=true opens a throw-away node to everyone who reaches its ports.
ENV GROUPER_HOST=0.0.0.0 \
    GROUPER_DATA_DIR=/var/lib/grouper \
    GROUPER_REQUIRE_DATA_VOLUME=true
USER 10001:10001
WORKDIR /var/lib/grouper
VOLUME ["/var/lib/grouper"]
# AMQP, amqps, admin gRPC, raft, HTTP health and metrics, node-to-node forwarding (with cluster TLS)
EXPOSE 5672 5671 5673 5674 5675 5676
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 CMD ["grouper-healthcheck"]
ENTRYPOINT ["grouper-entrypoint"]
CMD []
