#!/usr/bin/env bash
# The HTTP API with curl: every call below is an example to copy. Run against a server:
#   build/llm serve --model ../shared/models/stories260K --port 8000 &
#   examples/curl.sh [BASE_URL]          (default http://127.0.0.1:8000)
# With --api-key KEY (or LLM_API_KEY) on the server, export LLM_API_KEY=KEY here too.
# tests/clients/run_grpc_client_test.sh runs this script and checks each answer.
set -euo pipefail
base=${1:-http://127.0.0.1:8000}
auth=()
[ -n "${LLM_API_KEY:-}" ] && auth=(-H "Authorization: Bearer $LLM_API_KEY")
json=(-H "Content-Type: application/json")

echo "# GET /health"
curl -sS "$base/health"; echo

echo "# GET /v1/models"
curl -sS "${auth[@]}" "$base/v1/models"; echo

echo "# POST /v1/completions (greedy)"
curl -sS "${auth[@]}" "${json[@]}" "$base/v1/completions" \
  -d '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}'; echo

echo "# POST /v1/completions, streamed (Server-Sent Events: data: {...} lines, then data: [DONE])"
curl -sS -N "${auth[@]}" "${json[@]}" "$base/v1/completions" \
  -d '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": true}'

echo "# POST /v1/chat/completions (needs a chat_template in the model's tokenizer_config.json)"
curl -sS "${auth[@]}" "${json[@]}" "$base/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 16}'; echo

echo "# POST /tokenize"
curl -sS "${auth[@]}" "${json[@]}" "$base/tokenize" -d '{"prompt": "Once upon a time"}'; echo

echo "# GET /metrics (Prometheus text; first lines)"
curl -sS "${auth[@]}" "$base/metrics" | awk '/^vllm:/ && n++ < 3'
