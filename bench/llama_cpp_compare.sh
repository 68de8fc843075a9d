#!/usr/bin/env bash
# Our CPU engine beside llama.cpp itself (issue 31): same machine, same run, same model
# shapes, interleaved, 2 threads everywhere. Not a test.
#
#   bench/llama_cpp_compare.sh [--quick] [--rounds N] [--shapes "llama2c-110m tinyllama-1.1b"]
#                              [--llama-build prebuilt|local|both] [--decode-tokens 64]
#                              [--pp-tokens 512] [--threads 2]
#   --quick: one round, the 110M shape only (a check that everything runs).
#   default: 2 rounds of the TinyLlama-1.1B shape.
#
# llama.cpp: node-llama-cpp@3.21.1 (pinned), installed with npm into build/llama-cpp-node
# (git-ignored), driven by bench/llama_cpp_run.mjs. --llama-build prebuilt (default) is
# node-llama-cpp's prebuilt CPU binary; local is a binary compiled from the llama.cpp
# source that node-llama-cpp bundles (`node-llama-cpp source download --gpu false`:
# -march=native, OpenMP, like a default llama.cpp build) -- built on first use (~20 min on
# 2 cores); both measures the two. (On the 2-core KVM dev VM the local build dies with
# SIGILL on Q8_0, in ggml's AMX kernel (tilezero); the failure is recorded and the run goes on.)
# Models: random-weight bf16 checkpoints from `build/llm make-model` (build/bench-models),
# converted to GGUF F16 and Q8_0 by bench/gguf_write.py (build/gguf).
# Per shape and round, in ABBA order across rounds:
#   llama.cpp F16 | ours --dtype bf16 | ours --dtype f16 | llama.cpp Q8_0 | ours
#   --quantization int8 | ours --quantization fp8
# (a) decode: batch 1, greedy, 64 tokens after the short prompt "Once upon a time",
#     end-of-sequence ignored; tok/s = (generated - 1) / (last token - first token).
# (b) prompt processing: a ~512-token prompt (text calibrated on our tokenizer; llama.cpp
#     gets exactly as many tokens), one token generated; tok/s = prompt tokens / time to
#     the first token.
# Ratios: ours / llama.cpp of the medians over rounds. Writes
# bench/results/cpu-vs-llama-cpp-<shapes>.json (tinyllama, 110m; -quick.json with --quick).
set -euo pipefail
cd "$(dirname "$0")/.."

NLC_VERSION=3.21.1
rounds=2
shapes="tinyllama-1.1b"
quick=0
llama_build=prebuilt
decode_tokens=64
pp_tokens=512
threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; rounds=1; shapes="llama2c-110m"; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --shapes) shapes=$2; shift 2 ;;
    --llama-build) llama_build=$2; shift 2 ;;
    --decode-tokens) decode_tokens=$2; shift 2 ;;
    --pp-tokens) pp_tokens=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

[ -x build/llm ] || { echo "build/llm is missing (build the CPU binary first)" >&2; exit 1; }
node_dir=build/llama-cpp-node
models=build/bench-models
ggufs=build/gguf
mkdir -p "$node_dir" "$models" "$ggufs" bench/results

# node-llama-cpp, pinned, in a cache folder outside the tracked files.
installed=$(node -p "try { require('./$node_dir/node_modules/node-llama-cpp/package.json').version } catch { '' }")
if [ "$installed" != "$NLC_VERSION" ]; then
  echo "installing node-llama-cpp@$NLC_VERSION into $node_dir" >&2
  [ -f "$node_dir/package.json" ] || echo '{"name": "llama-cpp-node-cache", "private": true}' > "$node_dir/package.json"
  (cd "$node_dir" && npm install --no-audit --no-fund --save-exact "node-llama-cpp@$NLC_VERSION" >&2)
fi
if [ "$llama_build" != prebuilt ] && ! ls "$node_dir"/node_modules/node-llama-cpp/llama/localBuilds/*/Release/llama-addon.node >/dev/null 2>&1; then
  echo "compiling llama.cpp for node-llama-cpp (--llama-build $llama_build; once, ~25 min)" >&2
  (cd "$node_dir" && npx --no-install node-llama-cpp source download --gpu false --noUsageExample >&2)
fi

# Models and GGUFs (the 110M shape is always made: it calibrates the prompt).
for shape in llama2c-110m $shapes; do
  dir=$models/$shape-bf16
  if [ ! -f "$dir/model.safetensors" ]; then
    echo "making $dir" >&2
    build/llm make-model --config "engine/configs/$shape.json" --out "$dir" --dtype bf16 --seed 1 >/dev/null
  fi
done
for shape in $shapes; do
  for t in f16 q8_0; do
    out=$ggufs/$shape-$t.gguf
    if [ ! -f "$out" ] || [ "$out" -ot "$models/$shape-bf16/model.safetensors" ] || [ "$out" -ot bench/gguf_write.py ]; then
      echo "writing $out" >&2
      python3 bench/gguf_write.py "$models/$shape-bf16" "$out" --type "$t" >&2
    fi
  done
done

python3 - "$quick" "$rounds" "$shapes" "$llama_build" "$decode_tokens" "$pp_tokens" "$threads" "$NLC_VERSION" <<'PY'
import datetime, json, os, re, signal, statistics, subprocess, sys, time

quick, rounds, shapes, llama_build = sys.argv[1] == "1", int(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
decode_tokens, pp_tokens, threads, nlc_version = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), sys.argv[8]
MODELS, GGUFS = "build/bench-models", "build/gguf"
SHORT_PROMPT = "Once upon a time"
LINE = re.compile(r"prompt (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\); generated (\d+) tokens, "
                  r"decode ([\d.]+) tok/s")


def ours(model_dir, prompt, max_tokens, flags):
    cmd = ["build/llm", "generate", "--model", model_dir, "--prompt", prompt, "--max-tokens",
           str(max_tokens), "--temperature", "0", "--ignore-eos", "--threads", str(threads)] + flags
    r = subprocess.run(cmd, capture_output=True, text=True)
    m = LINE.search(r.stderr)
    if r.returncode != 0 or not m:
        raise SystemExit("ours failed: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return {"prompt_tokens": int(m[1]), "prompt_seconds": float(m[2]), "prompt_tokens_per_s": float(m[3]),
            "generated": int(m[4]), "decode_tokens_per_s": float(m[5])}


def calibrate_prompt():
    """A story text that our tokenizer encodes to pp_tokens tokens (BOS included)."""
    story = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
             "park with her friends. One day, she found a big red ball under a tree. She was very "
             "happy and wanted to share it with everyone. Her mom said, \"That is very kind of you, "
             "Lily.\" They played all day and laughed until the sun went down. ").split()
    words = lambda n: " ".join(story[i % len(story)] for i in range(n))
    model = MODELS + "/llama2c-110m-bf16"
    count = lambda n: ours(model, words(n), 1, [])["prompt_tokens"]
    n, seen = max(1, pp_tokens * 3 // 4), {}
    for _ in range(8):
        seen[n] = count(n)
        if seen[n] == pp_tokens:
            break
        step = round((pp_tokens - seen[n]) * n / seen[n])
        n = max(1, n + (step if step else (1 if seen[n] < pp_tokens else -1)))
        if n in seen:
            break
    best = min(seen, key=lambda k: (abs(seen[k] - pp_tokens), -k))
    return words(best), seen[best]


def llama(gguf, prompt_file, n_prompt, build):
    cmd = ["node", "bench/llama_cpp_run.mjs", "--model", gguf, "--build", build,
           "--threads", str(threads), "--batch", "512", "--ctx", "1024", "--pp-tokens", str(n_prompt),
           "--pp-prompt-file", prompt_file, "--decode-tokens", str(decode_tokens),
           "--decode-prompt", SHORT_PROMPT]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:  # recorded, and the run goes on
        why = (r.stderr + r.stdout).strip()[-1500:] or "(no output)"
        sig = " (%s)" % signal.Signals(-r.returncode).name if r.returncode < 0 else ""
        print("  llama.cpp failed, exit %d%s: %s\n    %s" % (r.returncode, sig, " ".join(cmd), why),
              flush=True)
        return {"error": "exit %d%s: %s" % (r.returncode, sig, why)}
    return json.loads(r.stdout.strip().splitlines()[-1])


cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True)
            .stdout.splitlines() if l.startswith("Model name")), "?")
git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                       text=True).stdout.strip() != ""
prompt_text, n_prompt = calibrate_prompt()
prompt_file = "build/llama-cpp-node/prompt-%d.txt" % pp_tokens
open(prompt_file, "w").write(prompt_text)
print("prompt: %d tokens on our tokenizer (target %d); %d threads; %d round(s); decode %d tokens"
      % (n_prompt, pp_tokens, threads, rounds, decode_tokens), flush=True)

builds = ["prebuilt", "local"] if llama_build == "both" else [llama_build]
out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": cpu,
       "cores": os.cpu_count(), "threads": threads, "rounds": rounds, "quick": quick,
       "versions": {"ours": git + ("+dirty" if dirty else ""),
                    "ours_binary_mtime": datetime.datetime.fromtimestamp(os.path.getmtime("build/llm")).isoformat(timespec="seconds"), "node_llama_cpp": nlc_version,
                    "node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()},
       "decode": {"prompt": SHORT_PROMPT, "tokens": decode_tokens},
       "prompt_processing": {"tokens": n_prompt, "target": pp_tokens, "text_file": prompt_file},
       "load_average_before": os.getloadavg(), "shapes": {}}
t0 = time.time()
for shape in shapes:
    model = "%s/%s-bf16" % (MODELS, shape)
    configs = []  # (name, engine, runner)
    for b in builds:
        suffix = "" if len(builds) == 1 else " (%s)" % b
        configs.append(("llama.cpp F16" + suffix, "llama", b, GGUFS + "/%s-f16.gguf" % shape))
    configs += [("ours bf16", "ours", None, ["--dtype", "bf16"]), ("ours f16", "ours", None, ["--dtype", "f16"])]
    for b in builds:
        suffix = "" if len(builds) == 1 else " (%s)" % b
        configs.append(("llama.cpp Q8_0" + suffix, "llama", b, GGUFS + "/%s-q8_0.gguf" % shape))
    configs += [("ours int8", "ours", None, ["--quantization", "int8"]),
                ("ours fp8", "ours", None, ["--quantization", "fp8"])]
    runs = {c[0]: [] for c in configs}
    for rnd in range(rounds):
        order = configs if rnd % 2 == 0 else configs[::-1]  # ABBA against drift
        for name, engine, build, arg in order:
            if engine == "llama":
                j = llama(arg, prompt_file, n_prompt, build)
                if "error" in j:
                    runs[name].append(j)
                    continue
                row = {"decode_tokens_per_s": j["decode"]["tokens_per_s"],
                       "pp_tokens_per_s": j["pp"]["tokens_per_s"],
                       "pp_tokens": j["pp"]["prompt_tokens"],
                       "decode_llama_perf_tokens_per_s": j["decode"]["llama_perf_tokens_per_s"],
                       "pp_llama_perf_tokens_per_s": j["pp"]["llama_perf_tokens_per_s"],
                       "load_seconds": j["load_seconds"], "detail": j}
                out["versions"]["llama_cpp"] = "%s (%s, bundled with node-llama-cpp)" % (
                    j["llama_cpp_release"], "ggml-org/llama.cpp")
                out["llama_cpp_system_info"] = j["system_info"]
                out["llama_cpp_flash_attention"] = j["flash_attention"]
            else:
                d = ours(model, SHORT_PROMPT, decode_tokens, arg)
                p = ours(model, prompt_text, 1, arg)
                row = {"decode_tokens_per_s": d["decode_tokens_per_s"],
                       "pp_tokens_per_s": p["prompt_tokens_per_s"], "pp_tokens": p["prompt_tokens"],
                       "flags": arg}
            runs[name].append(row)
            print("  %-14s round %d: decode %7.2f tok/s   pp%d %8.1f tok/s" % (
                shape, rnd + 1, row["decode_tokens_per_s"], row["pp_tokens"], row["pp_tokens_per_s"]),
                "  [" + name + "]", flush=True)
    med = {}
    for n, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            continue
        keys = ["decode_tokens_per_s", "pp_tokens_per_s"]
        if "decode_llama_perf_tokens_per_s" in ok[0]:
            keys += ["decode_llama_perf_tokens_per_s", "pp_llama_perf_tokens_per_s"]
        med[n] = {k: statistics.median(r[k] for r in ok if r[k] is not None) for k in keys}
    pairs = []
    for b in builds:
        suffix = "" if len(builds) == 1 else " (%s)" % b
        pairs += [("ours bf16", "llama.cpp F16" + suffix), ("ours f16", "llama.cpp F16" + suffix),
                  ("ours int8", "llama.cpp Q8_0" + suffix), ("ours fp8", "llama.cpp Q8_0" + suffix)]
    ratios = [{"ours": a, "llama_cpp": b,
               "decode": round(med[a]["decode_tokens_per_s"] / med[b]["decode_tokens_per_s"], 3),
               "pp": round(med[a]["pp_tokens_per_s"] / med[b]["pp_tokens_per_s"], 3),
               "decode_vs_llama_perf": round(med[a]["decode_tokens_per_s"] / med[b]["decode_llama_perf_tokens_per_s"], 3),
               "pp_vs_llama_perf": round(med[a]["pp_tokens_per_s"] / med[b]["pp_llama_perf_tokens_per_s"], 3)}
              for a, b in pairs if a in med and b in med]
    out["shapes"][shape] = {"model": model, "runs": runs, "median": med, "ratios": ratios}

    print("\n%s, %d threads, median of %d round(s)" % (shape, threads, rounds))
    print("%-26s %14s %14s" % ("engine", "decode tok/s", "pp%d tok/s" % n_prompt))
    for n in runs:
        if n not in med:
            print("%-26s %14s %14s   (%s)" % (n, "failed", "failed", runs[n][0]["error"].splitlines()[-1][:80]))
            continue
        extra = ""
        if "decode_llama_perf_tokens_per_s" in med[n]:
            extra = "   (inside llama_decode: %.2f / %.1f)" % (med[n]["decode_llama_perf_tokens_per_s"],
                                                            med[n]["pp_llama_perf_tokens_per_s"])
        print("%-26s %14.2f %14.1f%s" % (n, med[n]["decode_tokens_per_s"], med[n]["pp_tokens_per_s"], extra))
    print("%-40s %8s %8s" % ("ratio ours / llama.cpp", "decode", "pp"))
    for r in ratios:
        print("%-40s %8.2f %8.2f" % (r["ours"] + " / " + r["llama_cpp"], r["decode"], r["pp"]))
out["load_average_after"] = os.getloadavg()
out["seconds"] = round(time.time() - t0, 1)
path = "bench/results/cpu-vs-llama-cpp-%s.json" % ("quick" if quick else "-".join(s.split("-")[0] if s.startswith("tinyllama") else s.split("-")[1] for s in shapes))
json.dump(out, open(path, "w"), indent=1)
print("\nwrote %s (%.0f s of runs)" % (path, out["seconds"]))
PY
