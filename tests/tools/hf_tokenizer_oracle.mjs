// The Hugging Face tokenizers library (npm `tokenizers`, the official binding of its Rust
// core) as the oracle of our tokenizer.json implementation, run in its own process by
// tests/engine/tokenizer/tokenizer_hf_oracle_test.cc.
// Usage: node hf_tokenizer_oracle.mjs REQUEST.json RESPONSE.json
//   request:  {"tokenizer": path, "texts": [...], "decode": [[ids], ...]}
//   response: {"ids": [[...]], "ids_special": [[...]], "text": [...], "text_skip": [...]}
//             ids / ids_special: encode(text) without / with the post-processor's special
//             tokens; text / text_skip: decode(ids) keeping / skipping special tokens.
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(process.env.LLM_NPM_DIR + '/');
const { Tokenizer } = require('tokenizers');

const [requestPath, responsePath] = process.argv.slice(2);
const request = JSON.parse(readFileSync(requestPath, 'utf8'));
const tokenizer = Tokenizer.fromFile(request.tokenizer);
const out = { ids: [], ids_special: [], text: [], text_skip: [] };
for (const text of request.texts ?? []) {
  out.ids.push(Array.from((await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds()));
  out.ids_special.push(Array.from((await tokenizer.encode(text, null, { addSpecialTokens: true })).getIds()));
}
for (const ids of request.decode ?? []) {
  out.text.push(await tokenizer.decode(ids, false));
  out.text_skip.push(await tokenizer.decode(ids, true));
}
writeFileSync(responsePath, JSON.stringify(out));
