// A random-weight model with a real tokenizer.json vocabulary (Llama 3's or Qwen3's) behind
// `llm serve`, checked against Hugging Face's own libraries: /tokenize gives the tokenizers
// library's ids, /detokenize its text; completions and chat stream the same text as they
// return whole; a chat prompt is the template rendered by @huggingface/jinja, encoded by the
// library (usage.prompt_tokens). Run by tests/clients/run_hf_tokenizer_e2e_test.sh.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(process.env.LLM_NPM_DIR + '/');
const { Tokenizer } = require('tokenizers');
const { Template } = require('@huggingface/jinja');

const base = process.env.LLM_BASE_URL;
const modelDir = process.env.LLM_MODEL_DIR;
const tokenizer = Tokenizer.fromFile(modelDir + '/tokenizer.json');
const config = JSON.parse(readFileSync(modelDir + '/tokenizer_config.json', 'utf8'));
const name = (t) => (t && typeof t === 'object' ? t.content : t) ?? '';

async function post(path, body) {
  const r = await fetch(base + path, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  const text = await r.text();
  assert.equal(r.status, 200, `${path}: ${r.status} ${text}`);
  return text;
}

async function streamText(path, body) {
  const raw = await post(path, { ...body, stream: true });
  let text = '';
  for (const line of raw.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const choice = JSON.parse(line.slice(6)).choices[0];
    text += choice?.text ?? choice?.delta?.content ?? '';
  }
  return text;
}

let passed = 0;
const texts = ['Hello, world!', "  It's 2026: naïve café, 12345678 ‘quotes’\r\n\tend",
  '你好世界，안녕하세요 مرحبا 👨‍👩‍👧‍👦', 'special <|im_start|> and <|eot_id|> inside', ''];
for (const text of texts) {
  const ours = JSON.parse(await post('/tokenize', { prompt: text })).tokens;
  const lib = Array.from((await tokenizer.encode(text, null, { addSpecialTokens: true })).getIds());
  assert.deepEqual(ours, lib, `/tokenize ${JSON.stringify(text)}`);
  const plain = JSON.parse(await post('/tokenize', { prompt: text, add_special_tokens: false })).tokens;
  const libPlain = Array.from((await tokenizer.encode(text, null, { addSpecialTokens: false })).getIds());
  assert.deepEqual(plain, libPlain, `/tokenize without specials ${JSON.stringify(text)}`);
  const back = JSON.parse(await post('/detokenize', { tokens: lib })).prompt;
  assert.equal(back, await tokenizer.decode(lib, true), `/detokenize ${JSON.stringify(text)}`);
  passed += 1;
}
console.log(`ok /tokenize and /detokenize equal the library on ${passed} texts`);

for (const prompt of ['Once upon a time', 'def fib(n):', '東京は']) {
  const args = { model: 'm', prompt, max_tokens: 24, temperature: 0 };
  const whole = JSON.parse(await post('/v1/completions', args)).choices[0].text;
  assert.equal(await streamText('/v1/completions', args), whole, `completion ${prompt}`);
}
console.log('ok completions: streamed == non-streamed');

const messages = [
  { role: 'system', content: 'You are terse.' },
  { role: 'user', content: 'Name a colour.' },
  { role: 'assistant', content: 'Blue.' },
  { role: 'user', content: 'Another, in 日本語?' },
];
const args = { model: 'm', messages, max_tokens: 20, temperature: 0 };
const reply = JSON.parse(await post('/v1/chat/completions', args));
assert.equal(await streamText('/v1/chat/completions', args), reply.choices[0].message.content);
const rendered = new Template(config.chat_template).render({
  messages, add_generation_prompt: true, bos_token: name(config.bos_token),
  eos_token: name(config.eos_token),
});
const promptIds = Array.from((await tokenizer.encode(rendered, null, { addSpecialTokens: false })).getIds());
assert.equal(reply.usage.prompt_tokens, promptIds.length, 'chat prompt tokens vs the template');
const chatIds = JSON.parse(await post('/tokenize', { messages })).tokens;
assert.deepEqual(chatIds, promptIds, '/tokenize of the messages vs the template + the library');
const withSpecials = JSON.parse(await post('/detokenize', { tokens: chatIds, skip_special_tokens: false })).prompt;
assert.equal(withSpecials, await tokenizer.decode(chatIds, false), '/detokenize keeping specials');
console.log(`ok chat: streamed == non-streamed, prompt = the template (${promptIds.length} tokens)`);

// chat_template_kwargs reach the template (Qwen3's enable_thinking; other templates ignore it).
const kwargs = { enable_thinking: false };
const renderedNoThink = new Template(config.chat_template).render({
  messages, add_generation_prompt: true, bos_token: name(config.bos_token),
  eos_token: name(config.eos_token), ...kwargs,
});
const noThinkIds = Array.from(
  (await tokenizer.encode(renderedNoThink, null, { addSpecialTokens: false })).getIds());
const ours = JSON.parse(await post('/tokenize', { messages, chat_template_kwargs: kwargs })).tokens;
assert.deepEqual(ours, noThinkIds, '/tokenize with chat_template_kwargs');
const thinkArgs = { ...args, chat_template_kwargs: kwargs };
const noThink = JSON.parse(await post('/v1/chat/completions', thinkArgs));
assert.equal(noThink.usage.prompt_tokens, noThinkIds.length);
assert.equal(await streamText('/v1/chat/completions', thinkArgs), noThink.choices[0].message.content);
console.log(`ok chat_template_kwargs ${JSON.stringify(kwargs)}: ${noThinkIds.length} prompt tokens`);
