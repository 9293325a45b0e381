"""The exit statuses of the `grouper` command, in one table every sub-command answers with.

Rules:
- A leaf: the standard library only (nothing at all), so the dispatcher (node/cli.py) and the
  sub-commands it imports (node/admin/commands.py, users_commands.py) import it without importing
  each other.
- Each status says who can fix the failure: 1 the node (or the file's state) refused, 2 the caller's
  usage or a value, 3 the network or the node's state, 4 the caller's credentials or permissions.
"""

EXIT_OK = 0
EXIT_FAILED = 1  # the node refused (its message is quoted), or did only part of the work
EXIT_USAGE = 2  # bad usage or configuration, or a value the node rejected
EXIT_UNREACHABLE = 3  # the node could not be reached
EXIT_DENIED = 4  # the node did not accept the credentials, or the user lacks the permission
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell shows for a command its pipe's reader left
