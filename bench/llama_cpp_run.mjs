// One llama.cpp measurement through node-llama-cpp (CPU build), for bench/llama_cpp_compare.sh:
// loads a GGUF, then (like llama-bench) a warm-up, then
//   pp:     a fresh sequence evaluates a prompt of --pp-tokens tokens in batches of
//           --batch and samples one token; tokens/s = prompt tokens / time to that token
//           (the same definition as `llm generate`'s "prompt N tokens in X s").
//   decode: a fresh sequence evaluates the short --decode-prompt, then generates
//           --decode-tokens tokens greedily, end-of-sequence ignored (yieldEogToken);
//           tokens/s = (generated - 1) / (time of the last token - time of the first),
//           the same definition as `llm generate`'s "decode X tok/s".
// Also records llama.cpp's own counters (llama_perf_context: time inside llama_decode, the
// figure llama-cli prints as "prompt eval time" / "eval time"), which leave out the Node
// binding's per-token overhead.
// --build prebuilt: node-llama-cpp's prebuilt CPU binary (@node-llama-cpp/linux-x64: ggml
// CPU variants picked at run time, no OpenMP); local: the binary compiled here by
// `node-llama-cpp source download --gpu false` (-march=native, OpenMP), if one exists.
// Prints one JSON object on stdout.
//   node bench/llama_cpp_run.mjs --model M.gguf [--node-dir build/llama-cpp-node] [--build prebuilt|local]
//        [--threads 2] [--batch 512] [--ctx 1024] [--pp-tokens 512] [--pp-prompt-file F]
//        [--decode-tokens 64] [--decode-prompt TEXT] [--flash-attention auto|on|off]
//        [--skip pp|decode]
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const args = {
  "node-dir": "build/llama-cpp-node", threads: "2", batch: "512", ctx: "1024",
  "pp-tokens": "512", "pp-prompt-file": "", "decode-tokens": "64",
  "decode-prompt": "Once upon a time", "flash-attention": "auto", skip: "", model: "",
  build: "prebuilt",
};
for (let i = 2; i < process.argv.length; i += 2) {
  const key = process.argv[i].replace(/^--/, "");
  if (!(key in args)) throw new Error(`unknown option ${process.argv[i]}`);
  args[key] = process.argv[i + 1];
}
if (!args.model) throw new Error("--model is required");
const nodeDir = resolve(args["node-dir"]);
const pkg = join(nodeDir, "node_modules", "node-llama-cpp");
const { getLlama, LlamaLogLevel } = await import(pathToFileURL(join(pkg, "dist", "index.js")).href);
const version = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8")).version;
const threads = Number(args.threads);
const now = () => Number(process.hrtime.bigint()) / 1e9;

const logs = [];
const llama = await getLlama({
  gpu: false, build: "never", maxThreads: threads, logLevel: LlamaLogLevel.info,
  logger: (level, message) => {
    logs.push(message);
    if (level === "error" || level === "fatal") process.stderr.write(message);
  },
  // A custom CMake option no local build has: node-llama-cpp then skips local builds and
  // loads its prebuilt binary.
  ...(args.build === "prebuilt" ? { cmakeOptions: { NLC_BENCH_PREBUILT_ONLY: "ON" } } : {}),
});
if (args.build === "local" && llama.buildType !== "localBuild") {
  throw new Error("--build local: no local build of node-llama-cpp found");
}
const tLoad = now();
const model = await llama.loadModel({ modelPath: resolve(args.model), gpuLayers: 0 });
const fa = { auto: "auto", on: true, off: false }[args["flash-attention"]];
const context = await model.createContext({
  contextSize: Number(args.ctx), batchSize: Number(args.batch),
  threads: { ideal: threads, min: threads }, flashAttention: fa, performanceTracking: true,
});
const loadSeconds = now() - tLoad;
const sequence = context.getSequence();

// Tokens with BOS first, as `llm generate` encodes its prompt.
function encode(text) {
  const ids = model.tokenize(text);
  return model.tokens.bos != null && ids[0] !== model.tokens.bos ? [model.tokens.bos, ...ids] : ids;
}

// Evaluates `tokens` on an empty sequence and generates up to `n` tokens greedily;
// returns the times (s, from the call) at which each generated token arrived.
// llama.cpp's counters since the last call (then reset): {prompt: [ms, tokens], eval: [ms, runs]}
async function perf() {
  logs.length = 0;
  await context.printTimings();
  const text = logs.join("");
  const get = (re) => { const m = text.match(re); return m ? [Number(m[1]), Number(m[2])] : null; };
  return { prompt: get(/prompt eval time =\s*([\d.]+) ms \/\s*(\d+) tokens/),
           eval: get(/\beval time =\s*([\d.]+) ms \/\s*(\d+) runs/) };
}

async function run(tokens, n) {
  await sequence.clearHistory();
  await perf();
  const times = [];
  const start = now();
  const it = sequence.evaluate(tokens, { temperature: 0, yieldEogToken: true });
  for await (const token of it) {
    times.push(now() - start);
    if (times.length >= n) break;
  }
  return times;
}

const out = {
  engine: "llama.cpp", node_llama_cpp: version,
  llama_cpp_release: llama.llamaCppRelease?.release, build_type: llama.buildType,
  gpu: llama.gpu, system_info: llama.systemInfo, model: args.model,
  threads: context.currentThreads ?? threads, batch_size: context.batchSize,
  context_size: context.contextSize, flash_attention: context.flashAttention,
  load_seconds: +loadSeconds.toFixed(3),
};

await run(encode(args["decode-prompt"]), 2);  // warm-up (llama-bench does one too)

if (args.skip !== "pp") {
  const want = Number(args["pp-tokens"]);
  let ids = args["pp-prompt-file"] ? encode(readFileSync(args["pp-prompt-file"], "utf8")) : [];
  const native = ids.length;
  // Exactly `want` tokens: the text's own tokens, cut or cycled (speed does not depend on ids).
  if (ids.length === 0) ids = [model.tokens.bos ?? 1];
  const body = ids.slice(1).length ? ids.slice(1) : [3];
  while (ids.length < want) ids.push(body[(ids.length - 1) % body.length]);
  ids = ids.slice(0, want);
  const times = await run(ids, 1);
  const p = (await perf()).prompt;
  out.pp = { prompt_tokens: ids.length, text_tokens: native, seconds: +times[0].toFixed(4),
             tokens_per_s: +(ids.length / times[0]).toFixed(2),
             llama_perf_ms: p?.[0], llama_perf_tokens: p?.[1],
             llama_perf_tokens_per_s: p ? +(p[1] / p[0] * 1e3).toFixed(2) : null };
}
if (args.skip !== "decode") {
  const ids = encode(args["decode-prompt"]);
  const n = Number(args["decode-tokens"]);
  const times = await run(ids, n);
  const decodeSeconds = times[times.length - 1] - times[0];
  const e = (await perf()).eval;
  out.decode = { prompt_tokens: ids.length, generated: times.length,
                 first_token_seconds: +times[0].toFixed(4), seconds: +decodeSeconds.toFixed(4),
                 tokens_per_s: +((times.length - 1) / decodeSeconds).toFixed(3),
                 llama_perf_ms: e?.[0], llama_perf_runs: e?.[1],
                 llama_perf_tokens_per_s: e ? +(e[1] / e[0] * 1e3).toFixed(3) : null };
}
if (process.env.NLC_DUMP_LOGS) process.stderr.write(logs.join(""));
console.log(JSON.stringify(out));
await context.dispose();
await model.dispose();
await llama.dispose();
