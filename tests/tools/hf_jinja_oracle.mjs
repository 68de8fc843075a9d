// @huggingface/jinja (npm), the reference renderer of Hugging Face chat templates, as the oracle
// of our interpreter (engine/chat/), run in its own process by
// tests/engine/chat/chat_template_hf_test.cc.
// Usage: node hf_jinja_oracle.mjs REQUEST.json RESPONSE.json
//   request:  {"cases": [{"template": source, "variables": {messages, tools,
//              add_generation_prompt, bos_token, date_string, enable_thinking, ...}}, ...]}
//             or {"cases_json": that list as JSON text} (keys keep their order there, which
//             tojson shows; the C++ side's nlohmann::json would sort them)
//   response: {"results": [{"output": text} or {"error": message}, ...]} in the same order;
//             "error" when the template fails to parse or raises while rendering.
// The variables are passed to Template(template).render(variables) exactly as given.
import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(process.env.LLM_NPM_DIR + '/');
const { Template } = require('@huggingface/jinja');

const [requestPath, responsePath] = process.argv.slice(2);
const request = JSON.parse(readFileSync(requestPath, 'utf8'));
const parsed = new Map();  // one parse per distinct template source
const results = [];
const cases = request.cases_json !== undefined ? JSON.parse(request.cases_json) : request.cases;
for (const c of cases ?? []) {
  try {
    if (!parsed.has(c.template)) parsed.set(c.template, new Template(c.template));
    results.push({ output: parsed.get(c.template).render(c.variables ?? {}) });
  } catch (e) {
    results.push({ error: String(e?.message ?? e) });
  }
}
writeFileSync(responsePath, JSON.stringify({ results }));
