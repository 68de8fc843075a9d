#!/usr/bin/env bash
# ctest: `llm download` against a loopback mock of the Hugging Face Hub and its CDN
# (mock_hf_hub.py, standard-library Python) serving the real stories260K files: redirects
# to the CDN without the token, a dropped connection resumed with Range, a resumed
# .incomplete file from an earlier run, an up-to-date re-run, --include, a gated repo (401
# without HF_TOKEN, fine with it), a corrupt file (sha256 mismatch), a missing repo and
# revision; then `llm generate` on the downloaded folder.
# Usage: run_download_test.sh BUILD_DIR SHARED_DIR
set -euo pipefail
build=$1
shared=$2
here=$(cd "$(dirname "$0")" && pwd)
model=$shared/models/stories260K
work=$(mktemp -d)
mock_pid=""
trap '[ -n "$mock_pid" ] && kill $mock_pid 2>/dev/null; rm -rf "$work"' EXIT
/usr/bin/python3 "$here/mock_hf_hub.py" --model-dir "$model" --port-file "$work/port" \
  --log "$work/requests.log" &
mock_pid=$!
for _ in $(seq 1 200); do [ -s "$work/port" ] && break; sleep 0.05; done
HF_ENDPOINT="http://127.0.0.1:$(cat "$work/port")"
export HF_ENDPOINT
unset HF_TOKEN
passed=0
ok() { passed=$((passed + 1)); echo "ok $*"; }
fail() { echo "FAIL $*"; echo "--- requests:"; cat "$work/requests.log"; exit 1; }
files=(config.json generation_config.json tokenizer_config.json tokenizer.model
       model.safetensors original/tok512.bin)
same_files() {  # same_files DIR: every file byte for byte, no .incomplete left
  for f in "${files[@]}"; do cmp "$model/$f" "$1/$f" || fail "$1/$f differs"; done
  [ -z "$(find "$1" -name '*.incomplete')" ] || fail ".incomplete left in $1"
}

# 1. A full download: the first CDN transfer of model.safetensors is cut halfway.
out=$("$build/llm" download test-org/stories260K --dir "$work/a" 2>"$work/a.err") ||
  { cat "$work/a.err"; fail "download"; }
[ "$out" = "$work/a" ] || fail "stdout should be the folder, got '$out'"
same_files "$work/a"
grep -q "model.safetensors: resuming at byte" "$work/a.err" || fail "no resume after the drop"
grep -q "^GET /blobs/flaky-.* range=bytes=[1-9][0-9]*- auth=no" "$work/requests.log" ||
  fail "the retry should be a Range request to the CDN without Authorization"
grep -q "sha256 ok" "$work/a.err" && grep -q "git blob sha1 ok" "$work/a.err" ||
  fail "checksums not reported"
grep -q "ready: llm generate --model" "$work/a.err" || fail "folder check"
ok "download, redirect to the CDN, resume after a dropped connection, checksums"

# 2. Again: every file is verified in place and nothing is fetched.
: >"$work/requests.log"
"$build/llm" download test-org/stories260K --dir "$work/a" 2>"$work/a2.err" >/dev/null
[ "$(grep -c "up to date" "$work/a2.err")" = "${#files[@]}" ] || fail "re-run should skip all"
! grep -q "^GET /blobs/" "$work/requests.log" || fail "re-run fetched from the CDN"
ok "re-run: up to date"

# 3. An interrupted earlier run: model.safetensors.incomplete holds the first 300000 bytes.
mkdir -p "$work/b"
head -c 300000 "$model/model.safetensors" >"$work/b/model.safetensors.incomplete"
"$build/llm" download test-org/stories260K --dir "$work/b" --include '*.safetensors' \
  2>"$work/b.err" >/dev/null || { cat "$work/b.err"; fail "resume download"; }
cmp "$model/model.safetensors" "$work/b/model.safetensors" || fail "resumed file differs"
[ "$(ls "$work/b")" = "model.safetensors" ] || fail "--include: $(ls "$work/b")"
grep -q "range=bytes=300000-" "$work/requests.log" || fail "no Range from byte 300000"
grep -q "config.json missing" "$work/b.err" || fail "the folder check should name what is missing"
# A stale partial file (other bytes): the resumed result fails its check, then starts over.
head -c 4000 /dev/zero >"$work/b/tokenizer.model.incomplete"  # of 8044
"$build/llm" download test-org/stories260K --dir "$work/b" --include tokenizer.model \
  2>"$work/b2.err" >/dev/null || { cat "$work/b2.err"; fail "stale .incomplete"; }
cmp "$model/tokenizer.model" "$work/b/tokenizer.model" || fail "tokenizer.model differs"
grep -q "stale: starting over" "$work/b2.err" || { cat "$work/b2.err"; fail "no restart"; }
ok "resume of an earlier .incomplete, --include, a stale .incomplete"

# 4. A gated repository: 401 without HF_TOKEN, a clear message; fine with the token.
if "$build/llm" download test-org/gated --dir "$work/g" 2>"$work/g.err"; then fail "gated"; fi
grep -q "gated" "$work/g.err" && grep -q "HF_TOKEN" "$work/g.err" ||
  { cat "$work/g.err"; fail "gated message"; }
: >"$work/requests.log"
HF_TOKEN=hf_test_token "$build/llm" download test-org/gated --dir "$work/g" \
  2>"$work/g2.err" >/dev/null || { cat "$work/g2.err"; fail "gated with HF_TOKEN"; }
same_files "$work/g"
grep -q "^HEAD /test-org/gated/resolve/.* auth=yes" "$work/requests.log" || fail "no token sent"
! grep -q "^GET /blobs/.* auth=yes" "$work/requests.log" || fail "token sent to the CDN"
if HF_TOKEN=hf_wrong "$build/llm" download test-org/gated --dir "$work/g3" 2>"$work/g3.err"; then
  fail "wrong token"
fi
grep -q "403" "$work/g3.err" || fail "wrong token message"
ok "gated: 401 names HF_TOKEN, the token opens it and stays off the CDN, 403 for a wrong one"

# 5. A corrupt transfer: sha256 mismatch, no file left behind.
if "$build/llm" download test-org/corrupt --dir "$work/c" --include 'model.*' \
  2>"$work/c.err"; then fail "corrupt file accepted"; fi
grep -q "sha256 mismatch" "$work/c.err" || { cat "$work/c.err"; fail "corrupt message"; }
[ ! -e "$work/c/model.safetensors" ] && [ ! -e "$work/c/model.safetensors.incomplete" ] ||
  fail "a corrupt file was kept"
ok "corrupt file: sha256 mismatch, deleted"

# 6. Missing repository and revision.
if "$build/llm" download test-org/nope --dir "$work/n" 2>"$work/n.err"; then fail "404 repo"; fi
grep -q "Repository test-org/nope not found" "$work/n.err" || { cat "$work/n.err"; fail "404"; }
if "$build/llm" download test-org/stories260K --revision v9 --dir "$work/n" 2>"$work/r.err"; then
  fail "404 revision"
fi
grep -q "Revision 'v9' does not exist" "$work/r.err" || { cat "$work/r.err"; fail "revision"; }
ok "404: repository, revision"

# 7. The downloaded folder is a model llm runs.
text=$("$build/llm" generate --model "$work/a" --prompt "Once upon a time" --max-tokens 12 \
  --temperature 0 2>/dev/null)
[[ "$text" == ", there was a little girl named Lily."* ]] || fail "generate: '$text'"
ok "llm generate --model <downloaded folder>"
echo "$passed passed, 0 failed"
