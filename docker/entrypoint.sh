#!/usr/bin/env bash
# Container entry point: `llm serve` with the image's defaults for any of --host, --port,
# --grpc-port and --model the arguments do not give; every other `llm serve` flag passes
# through unchanged (LLM_API_KEY in the environment is read by llm itself).
# The HTTP port is written to /tmp/llm-http-port for docker/healthcheck.sh.
set -euo pipefail
defaults=(--host 0.0.0.0 --port 8000 --grpc-port 50051 --model /models/model)
given() {  # given FLAG ARGS...: true when ARGS set FLAG (as "FLAG VALUE" or "FLAG=VALUE")
  local flag=$1 a
  shift
  for a in "$@"; do [[ $a == "$flag" || $a == "$flag="* ]] && return 0; done
  return 1
}
args=()
for ((i = 0; i < ${#defaults[@]}; i += 2)); do
  given "${defaults[i]}" "$@" || args+=("${defaults[i]}" "${defaults[i + 1]}")
done
args+=("$@")
port=8000
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --port) port=${args[i + 1]:-8000} ;;
    --port=*) port=${args[i]#--port=} ;;
  esac
done
echo "$port" >/tmp/llm-http-port 2>/dev/null || true
exec llm serve "${args[@]}"
