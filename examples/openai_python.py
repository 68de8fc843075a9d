#!/usr/bin/env python3
"""The official `openai` Python SDK against `llm serve` (OpenAI-compatible HTTP API).

Not run by the tests: the openai package is not packaged for Debian and CI cannot reach
PyPI. The same calls through the npm `openai` package are tested
(tests/clients/openai_sdk_test.mjs). To try it:

    python3 -m venv /tmp/openai-env && /tmp/openai-env/bin/pip install openai
    build/llm serve --model ../shared/models/stories260K --port 8000 &
    /tmp/openai-env/bin/python examples/openai_python.py http://127.0.0.1:8000/v1

The model name is whatever GET /v1/models lists; the API key is only checked when the server
runs with --api-key (or LLM_API_KEY), but the SDK insists on a non-empty one."""
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1",
                api_key=os.environ.get("LLM_API_KEY", "unused"))
model = client.models.list().data[0].id

# A completion, greedy.
completion = client.completions.create(model=model, prompt="Once upon a time", max_tokens=32,
                                       temperature=0)
print(completion.choices[0].text, completion.usage)

# Streamed: chunks arrive as the tokens are produced (Server-Sent Events underneath).
for chunk in client.completions.create(model=model, prompt="Once upon a time", max_tokens=32,
                                       stream=True):
    print(chunk.choices[0].text, end="", flush=True)
print()

# Chat (the model's tokenizer_config.json must have a chat_template; otherwise a 400).
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=32,
    stream=True, extra_body={"top_k": 40})  # vLLM-style extras go in extra_body
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
print()
