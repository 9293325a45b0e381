#!/usr/bin/env python3
"""The container's health check: exit 0 when the node's GET /readyz answers 200, else 1 with the reason.

The node binds its HTTP port on GROUPER_HOST (0.0.0.0 in the image), so 127.0.0.1 reaches it from
inside the container. The port is GROUPER_HTTP_PORT (default 5675), or the first argument.
Standard library only: the minbase image has no curl.
"""

import os
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 2.0  # under the shortest healthcheck timeout in docker-compose.yml


def main() -> int:
    port = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("GROUPER_HTTP_PORT", "5675")
    path = sys.argv[2] if len(sys.argv) > 2 else "/readyz"
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            print(f"{url}: {response.status} {response.read(200).decode(errors='replace').strip()}")
            return 0
    except urllib.error.HTTPError as error:  # 503 carries the node's one-line reason
        print(f"{url}: {error.code} {error.read(200).decode(errors='replace').strip()}")
    except OSError as error:
        print(f"{url}: {error}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
