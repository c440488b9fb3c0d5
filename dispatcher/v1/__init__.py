"""Generated gRPC code for proto/dispatcher/v1 (scripts/gen_proto.sh). Do not edit."""
