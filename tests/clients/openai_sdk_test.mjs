// The official `openai` npm package, unmodified (only baseURL and apiKey set), against a
// running `llm serve`: completions and chat, streamed and not. Run by
// tests/clients/run_openai_sdk_test.sh (which installs the package and starts the server).
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.LLM_BASE_URL, apiKey: 'test-key' });
let passed = 0;
async function check(name, fn) {
  await fn();
  passed += 1;
  console.log(`ok ${name}`);
}

await check('models.list', async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'chatmodel');
});

await check('completions (non-streamed)', async () => {
  const r = await client.completions.create({
    model: 'chatmodel', prompt: 'Once upon a time', max_tokens: 24, temperature: 0,
  });
  assert.ok(r.choices[0].text.startsWith(', there was a little girl named Lily.'), r.choices[0].text);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 24);
});

await check('completions (streamed) equal non-streamed', async () => {
  const args = { model: 'chatmodel', prompt: 'The little dog', max_tokens: 20, temperature: 0 };
  const plain = await client.completions.create(args);
  const stream = await client.completions.create({ ...args, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, plain.choices[0].text);
});

await check('chat.completions (non-streamed and streamed)', async () => {
  const messages = [
    { role: 'system', content: 'You tell stories.' },
    { role: 'user', content: 'Tell me a story about a cat.' },
  ];
  const plain = await client.chat.completions.create({
    model: 'chatmodel', messages, max_tokens: 20, temperature: 0,
  });
  assert.equal(plain.choices[0].message.role, 'assistant');
  const stream = await client.chat.completions.create({
    model: 'chatmodel', messages, max_tokens: 20, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
});

await check('errors surface as APIError with status', async () => {
  await assert.rejects(
    client.completions.create({ model: 'chatmodel', prompt: 'x', top_p: 7 }),
    (e) => e.status === 400 && /top_p/.test(e.message));
});

console.log(`${passed} passed, 0 failed`);
