#!/bin/sh
# Regenerate the Python modules of proto/*.proto. Run after editing a .proto; commit the output,
# because the runtime imports the generated modules and must not need grpc_tools.
# grpc_tools comes with the proto extra: pip install -e '.[proto]'.
# Paths are relative to the repo root so the generated imports read `from proto import ...`.
set -eu
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. proto/admin.proto proto/peer.proto
