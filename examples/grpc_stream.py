#!/usr/bin/env python3
"""Streams a completion over gRPC with the llm_client package (clients/python).

    python3 -m venv --system-site-packages /tmp/llm-env    # Debian: python3-grpcio
    /tmp/llm-env/bin/pip install --no-build-isolation clients/python
    build/llm serve --model ../shared/models/stories260K --grpc-port 50051 &
    /tmp/llm-env/bin/python examples/grpc_stream.py 127.0.0.1:50051 "Once upon a time"

tests/clients/run_grpc_client_test.sh runs it."""
import sys

from llm_client import Client

target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
prompt = sys.argv[2] if len(sys.argv) > 2 else "Once upon a time"
with Client(target) as client:
    client.wait_ready(timeout=10)
    print("health:", client.health(), file=sys.stderr)
    for text in client.generate(prompt, max_tokens=32, temperature=0).text():
        print(text, end="", flush=True)
    print()
    done = client.complete(prompt, max_tokens=8, temperature=0)
    print("finish_reason=%s prompt_tokens=%d completion_tokens=%d"
          % (done.finish_reason, done.prompt_tokens, done.completion_tokens), file=sys.stderr)
