#!/usr/bin/env python3
"""A Python gRPC client (Debian's python3-grpcio, stubs generated from proto/llm.proto by
run_grpc_client_test.sh) against a running `llm serve`: streams tokens, checks the standard
health service answers SERVING, tokenizes, and sees INVALID_ARGUMENT for a bad request.
Usage: grpc_client_test.py HOST:PORT STUB_DIR"""
import sys

sys.path.insert(0, sys.argv[2])

import grpc  # noqa: E402
import llm_pb2  # noqa: E402
import llm_pb2_grpc  # noqa: E402

channel = grpc.insecure_channel(sys.argv[1])
stub = llm_pb2_grpc.LlmStub(channel)
passed = 0

# grpc.health.v1.Health/Check for the whole server: an empty request; the response's field 1
# is the status (1 = SERVING).
check = channel.unary_unary("/grpc.health.v1.Health/Check",
                            request_serializer=lambda _: b"", response_deserializer=bytes)
assert check(None, timeout=10) == b"\x08\x01", "health must answer SERVING"
passed += 1
print("ok health SERVING")

request = llm_pb2.GenerateRequest(text="Once upon a time",
                                  sampling=llm_pb2.SamplingParams(temperature=0, max_tokens=24))
messages = list(stub.Generate(request, timeout=60))
text = "".join(m.text for m in messages)
assert len(messages) > 5, "tokens must arrive as a stream"
assert text.startswith(", there was a little girl named Lily."), text
assert messages[-1].finish_reason == "length" and messages[-1].usage.completion_tokens == 24
passed += 1
print("ok Generate streams", len(messages), "messages")

ids = stub.Tokenize(llm_pb2.TokenizeRequest(text="Once upon a time"), timeout=10).token_ids
assert list(ids) == [1, 403, 407, 261, 378], ids
passed += 1
print("ok Tokenize")

try:
    list(stub.Generate(llm_pb2.GenerateRequest(
        text="x", sampling=llm_pb2.SamplingParams(top_p=3.0)), timeout=10))
    raise AssertionError("expected INVALID_ARGUMENT")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_p" in e.details(), e
passed += 1
print("ok INVALID_ARGUMENT")
print(f"{passed} passed, 0 failed")
