// The Hugging Face tokenizers library (npm `tokenizers`, the official binding of its Rust
// core) as the oracle of our tokenizer.json implementation, run in its own process by
// tests/engine/tokenizer/tokenizer_hf_*_test.cc.
// Usage: node hf_tokenizer_oracle.mjs REQUEST.json RESPONSE.json
//   request:  {"tokenizer": path, "texts": [...], "decode": [[ids], ...]}
//   response: {"ids": [[...]], "ids_special": [[...]], "text": [...], "text_skip": [...]}
//             ids / ids_special: encode(text) without / with the post-processor's special
//             tokens; text / text_skip: decode(ids) keeping / skipping special tokens.
// Batch form, many tokenizers in one process (what the synthetic-file tests send):
//   request:  {"tokenizers": [{"tokenizer": path, "texts": [...], "decode": [...]}, ...]}
//   response: {"results": [one response as above, or {"error": message} when the library
//             refuses the file]}; an encode or decode the library refuses gives null in its
//             slot (and "errors": the first such message).
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(process.env.LLM_NPM_DIR + '/');
const { Tokenizer } = require('tokenizers');

async function run(request, catchErrors) {
  let tokenizer;
  try {
    tokenizer = Tokenizer.fromFile(request.tokenizer);
  } catch (e) {
    if (!catchErrors) throw e;
    return { error: String(e.message ?? e) };
  }
  const out = { ids: [], ids_special: [], text: [], text_skip: [] };
  const guard = async (f) => {
    if (!catchErrors) return await f();
    try {
      return await f();
    } catch (e) {
      out.errors ??= String(e.message ?? e);
      return null;
    }
  };
  const texts = request.texts ?? [], decodes = request.decode ?? [];
  // Batched (one call each, the library's own batch API), one by one where a batch fails so
  // that the failing item is found.
  const encodeAll = async (addSpecialTokens) => {
    const one = async (text) =>
      Array.from((await tokenizer.encode(text, null, { addSpecialTokens })).getIds());
    try {
      const encodings = await tokenizer.encodeBatch(texts, { addSpecialTokens });
      return encodings.map((e) => Array.from(e.getIds()));
    } catch (e) {
      if (!catchErrors) throw e;
      const ids = [];
      for (const text of texts) ids.push(await guard(() => one(text)));
      return ids;
    }
  };
  const decodeAll = async (skip) => {
    try {
      return await tokenizer.decodeBatch(decodes, skip);
    } catch (e) {
      if (!catchErrors) throw e;
      const out = [];
      for (const ids of decodes) out.push(await guard(() => tokenizer.decode(ids, skip)));
      return out;
    }
  };
  out.ids = await encodeAll(false);
  out.ids_special = await encodeAll(true);
  out.text = await decodeAll(false);
  out.text_skip = await decodeAll(true);
  return out;
}

const [requestPath, responsePath] = process.argv.slice(2);
const request = JSON.parse(readFileSync(requestPath, 'utf8'));
let response;
if (request.tokenizers) {
  response = { results: [] };
  for (const one of request.tokenizers) response.results.push(await run(one, true));
} else {
  response = await run(request, false);
}
writeFileSync(responsePath, JSON.stringify(response));
