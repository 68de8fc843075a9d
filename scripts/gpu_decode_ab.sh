#!/usr/bin/env bash
# Same-call A/B of batch-1 decode configurations on the GPU machine (machines of the pool differ
# by up to 8%, so only runs of one call compare). From the repo root with OUT set; carry .debs
# and .shared (../shared/DEVICE.md); llm must be built (scripts/gpu_run.sh llm).
#   OUT=... bash scripts/gpu_decode_ab.sh REPEATS 'tag1|flags1' 'tag2|flags2' ...
# Runs every configuration REPEATS times, interleaved, and prints each one's ms/token (median)
# and the runs, also as $OUT/ab.json. AB_MODEL (default engine/configs/llama-2-7b.json).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
shared=$(pwd)/.shared
[ -d "$shared" ] || shared=$(cd .. && pwd)/shared
model=${AB_MODEL:-engine/configs/llama-2-7b.json}
repeats=$1
shift
: > "$OUT/ab.tsv"
for ((r = 0; r < repeats; ++r)); do
  for cfg in "$@"; do
    tag=${cfg%%|*}
    flags=${cfg#*|}
    # shellcheck disable=SC2086
    ms=$(timeout 300 build/llm bench --device cuda --load-format dummy \
      --tokenizer "$shared/models/stories260K" --model "$model" --num-requests 1 \
      --min-input 128 --max-input 128 --min-output 256 --max-output 256 --temperature 0 \
      --warmup --max-num-seqs 256 $flags 2>> "$OUT/ab.log" | tail -1 |
      python3 -c "import json,sys; print(json.load(sys.stdin)['tpot_ms_mean'])" 2>> "$OUT/ab.log")
    printf '%s\t%s\n' "$tag" "${ms:-failed}" | tee -a "$OUT/ab.tsv"
  done
done
python3 - "$OUT/ab.tsv" "$OUT/ab.json" "$model" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    tag, ms = line.rstrip("\n").split("\t")
    runs.setdefault(tag, []).append(float(ms) if ms != "failed" else None)
out = {"model": sys.argv[3], "configs": {}}
for tag, v in runs.items():
    ok = [x for x in v if x is not None]
    med = statistics.median(ok) if ok else None
    out["configs"][tag] = {"tpot_ms_median": med, "runs": v}
    print(f"{tag:40s} median {med if med is None else round(med, 4)}  runs {v}")
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
