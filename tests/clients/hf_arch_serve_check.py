"""One hf-arch folder served by `llm serve`: both reference prompts (token ids) through
/v1/completions, greedy, 32 tokens, EOS ignored; the tokens (vLLM's return_tokens_as_token_ids)
must be transformers' greedy_32, and the streamed reply the same tokens and text.
Usage: hf_arch_serve_check.py HOST:PORT REFERENCE_JSON NAME"""
import http.client
import json
import sys

host, port = sys.argv[1].split(":")
ref = json.load(open(sys.argv[2]))
name = sys.argv[3]


def post(body):
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def ids_of(tokens):
    return [int(t.split(":", 1)[1]) for t in tokens]


failed = False
for i, prompt in enumerate(ref["prompts"]):
    body = {"model": "m", "prompt": prompt["ids"], "max_tokens": 32, "temperature": 0,
            "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
    conn, resp = post(body)
    reply = json.loads(resp.read())
    conn.close()
    assert resp.status == 200, reply
    choice = reply["choices"][0]
    got = ids_of(choice["logprobs"]["tokens"])
    # Streamed: the same tokens in deltas, the same text.
    conn, resp = post(dict(body, stream=True))
    assert resp.status == 200
    streamed, text = [], ""
    for line in resp:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        delta = json.loads(line[6:])["choices"][0]
        text += delta["text"]
        if delta.get("logprobs"):
            streamed += ids_of(delta["logprobs"]["tokens"])
    conn.close()
    ok = got == prompt["greedy_32"] and streamed == got and text == choice["text"]
    print(f"{'ok' if ok else 'FAIL'} {name} prompt {i}: {len(got)} tokens"
          f"{'' if ok else ' got %s streamed %s want %s' % (got, streamed, prompt['greedy_32'])}")
    failed = failed or not ok
sys.exit(1 if failed else 0)
