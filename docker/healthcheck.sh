#!/usr/bin/env bash
# HEALTHCHECK: GET /health on the port the entry point started llm on; healthy on a 200.
# Needs only bash (/dev/tcp), so the runtime image carries no curl or wget.
port=$(cat /tmp/llm-http-port 2>/dev/null || echo 8000)
exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
printf 'GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
IFS= read -r -t 5 status <&3 || exit 1
[[ $status == *" 200 "* ]]
