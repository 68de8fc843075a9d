// Hugging Face's tokenizers library (npm) on the benchmark text, as bench/tokenizer.cc measures
// ours: the whole text in one encode, then 1 KiB documents; best of N. Single thread
// (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false set by bench/tokenizer.sh).
// Usage: node tokenizer.mjs TOKENIZER.json TEXT_FILE [REPEAT]
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(process.env.LLM_NPM_DIR + '/');
const { Tokenizer } = require('tokenizers');
const [path, textPath, repeatArg] = process.argv.slice(2);
const repeat = Number(repeatArg ?? 5);
const text = readFileSync(textPath, 'utf8');
const t0 = performance.now();
const tokenizer = Tokenizer.fromFile(path);
const loadS = (performance.now() - t0) / 1000;
// 1 KiB documents cut at the first line end past each KiB of UTF-8, as bench/tokenizer.cc cuts.
const bytes = Buffer.from(text, 'utf8');
const docs = [];
for (let start = 0; start < bytes.length;) {
  let end = bytes.indexOf(10, Math.min(bytes.length, start + 1024));
  end = end < 0 ? bytes.length : end + 1;
  docs.push(bytes.subarray(start, end).toString('utf8'));
  start = end;
}
async function best(f) {
  let b = Infinity;
  for (let r = 0; r < repeat; ++r) {
    const s = performance.now();
    await f();
    b = Math.min(b, (performance.now() - s) / 1000);
  }
  return b;
}
let tokens = 0;
const opts = { addSpecialTokens: false };
const wholeS = await best(async () => { tokens = (await tokenizer.encode(text, null, opts)).getIds().length; });
const docsS = await best(async () => { for (const d of docs) await tokenizer.encode(d, null, opts); });
const mb = bytes.length / 1e6;
console.log(JSON.stringify({ impl: 'tokenizers (npm)', bytes: bytes.length, tokens,
  load_s: +loadS.toFixed(3), whole_mb_s: +(mb / wholeS).toFixed(2), docs_1k_mb_s: +(mb / docsS).toFixed(2),
  docs: docs.length }));
