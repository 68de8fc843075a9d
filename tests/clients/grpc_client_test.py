#!/usr/bin/env python3
"""The llm_client package (clients/python, installed by run_grpc_client_test.sh into a venv
over Debian's python3-grpcio) against a running `llm serve`: health, a token stream,
complete() agreeing with it, tokenize, model info, INVALID_ARGUMENT for a bad request, an
unknown parameter refused client-side, structured outputs (a json_schema output that parses in
the schema's key order, a choice, a bad regex named), and a cancelled stream.
Usage: grpc_client_test.py HOST:PORT"""
import json
import sys

import grpc
from llm_client import Client

client = Client(sys.argv[1], timeout=60)
client.wait_ready(timeout=10)
passed = 0


def ok(what):
    global passed
    passed += 1
    print("ok", what)


assert client.health() == "SERVING", "health must answer SERVING"
assert client.health("no.such.Service") == "SERVICE_UNKNOWN"
ok("health SERVING")

messages = list(client.generate("Once upon a time", temperature=0, max_tokens=24))
text = "".join(m.text for m in messages)
assert len(messages) > 5, "tokens must arrive as a stream"
assert text.startswith(", there was a little girl named Lily."), text
assert messages[-1].finish_reason == "length" and messages[-1].usage.completion_tokens == 24
ok("generate streams %d messages" % len(messages))

done = client.complete("Once upon a time", temperature=0, max_tokens=24)
assert done.text == text and done.finish_reason == "length", done
assert done.completion_tokens == 24 == len(done.token_ids) and done.prompt_tokens == 5, done
stopped = client.complete("Once upon a time", temperature=0, max_tokens=24, stop=".")
assert stopped.text == ", there was a little girl named Lily" and stopped.finish_reason == "stop"
ok("complete() matches the stream; stop")

assert client.tokenize("Once upon a time") == [1, 403, 407, 261, 378]
info = client.model_info()
assert info.vocab_size == 512 and info.max_model_len == 512, info
ok("tokenize, model_info")

try:
    client.complete("x", top_p=3.0)
    raise AssertionError("expected INVALID_ARGUMENT")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_p" in e.details(), e
try:
    client.generate("x", temprature=0)
    raise AssertionError("expected TypeError")
except TypeError as e:
    assert "temprature" in str(e)
ok("INVALID_ARGUMENT; unknown parameter refused")

schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0,
                                                   "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
person = client.complete("A person:", temperature=1.0, seed=7, max_tokens=200,
                         structured={"json_schema": json.dumps(schema), "strict": True})
assert person.finish_reason == "stop", person
obj = json.loads(person.text)
assert list(obj) == ["name", "age"] and isinstance(obj["name"], str), person.text
assert isinstance(obj["age"], int) and 0 <= obj["age"] <= 120, person.text
color = client.complete("The color was", temperature=1.0, seed=3,
                        structured={"choice": {"choices": ["red", "green", "blue"]}})
assert color.text in ("red", "green", "blue") and color.finish_reason == "stop", color
try:
    client.complete("x", structured={"regex": "(a|b"})
    raise AssertionError("expected INVALID_ARGUMENT")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert e.details().startswith("sampling.structured.regex: "), e.details()
ok("structured outputs: json_schema %s, choice %r" % (person.text, color.text))

stream = client.generate("Once upon a time", max_tokens=400, ignore_eos=True)
first = next(iter(stream))
stream.cancel()
try:
    rest = list(stream)
    raise AssertionError("a cancelled stream should end with CANCELLED, got %d more" % len(rest))
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.CANCELLED, e
ok("cancel")
client.close()
print("%d passed, 0 failed" % passed)
