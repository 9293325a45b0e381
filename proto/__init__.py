"""Generated protobuf and gRPC modules of Grouper's APIs; the .proto files beside them are the source.

Never edit the `*_pb2*.py` files by hand: change the .proto and run proto/generate.sh.
"""
