#!/usr/bin/env python3
"""Generates the gRPC stubs of proto/llm.proto into ROOT/llm_client/_proto/ (llm_pb2.py,
llm_pb2_grpc.py), importable as `llm_client._proto.llm_pb2`. setup.py runs it when the
package is built; run it by hand to use the package from the source tree:

    python3 clients/python/build_stubs.py            # ROOT = clients/python
    python3 clients/python/build_stubs.py --root DIR --proto proto/llm.proto

The compiler: protoc with grpc_python_plugin when both are on PATH (Debian: protobuf-compiler
and protobuf-compiler-grpc, matching Debian's python3-protobuf), else grpcio-tools
(`python3 -m grpc_tools.protoc`, as pip installs it, matching pip's protobuf). Debian 12's
python3-grpc-tools (1.14) is too old: it rejects proto3 `optional` fields."""
import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROTO = os.path.join(HERE, "..", "..", "proto", "llm.proto")


def compiler_command():
    protoc, plugin = shutil.which("protoc"), shutil.which("grpc_python_plugin")
    if protoc and plugin:
        return [protoc, "--plugin=protoc-gen-grpc_python=" + plugin]
    if importlib.util.find_spec("grpc_tools") is None:
        sys.exit("build_stubs: need protoc + grpc_python_plugin (Debian: protobuf-compiler "
                 "protobuf-compiler-grpc) or grpcio-tools (pip install grpcio-tools)")
    return [sys.executable, "-m", "grpc_tools.protoc"]


def generate(root, proto=DEFAULT_PROTO):
    """Writes ROOT/llm_client/_proto/{__init__,llm_pb2,llm_pb2_grpc}.py."""
    if not os.path.isfile(proto):
        sys.exit("build_stubs: %s not found (build the package from the repository)" % proto)
    out_dir = os.path.join(root, "llm_client", "_proto")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as staging:
        # The proto is compiled as llm_client/_proto/llm.proto so that the generated
        # llm_pb2_grpc.py imports its messages from the package, not from a top-level module.
        staged = os.path.join(staging, "llm_client", "_proto")
        os.makedirs(staged)
        shutil.copy(proto, os.path.join(staged, "llm.proto"))
        subprocess.run(compiler_command() + ["-I" + staging, "--python_out=" + root,
                                             "--grpc_python_out=" + root,
                                             "llm_client/_proto/llm.proto"], check=True)
    with open(os.path.join(out_dir, "__init__.py"), "w") as f:
        f.write('"""Generated from proto/llm.proto by build_stubs.py: do not edit."""\n')
    return out_dir


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=HERE, help="folder holding llm_client/")
    parser.add_argument("--proto", default=DEFAULT_PROTO)
    args = parser.parse_args()
    print(generate(args.root, args.proto))
