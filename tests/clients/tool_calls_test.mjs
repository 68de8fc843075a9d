// Tool calls and reasoning end to end against `llm serve` (run_tool_calls_test.sh starts it
// with a random-weight model whose chat template is Qwen3's or Llama 3.2's):
//   - forced calls (tool_choice "required" or a named function) over a seeded corpus of tool
//     sets at temperature 1: every call parses and its arguments validate against the
//     function's parameters with ajv; parallel_tool_calls false makes one call; the streamed
//     twin adds up to the same calls;
//   - the openai SDK, unmodified: chat.completions.parse with a JSON schema and with strict
//     tools, and chat.completions.stream assembling streamed tool calls;
//   - calls found in the model's own format after <think> (tool_choice auto), history with
//     tool calls and tool results, enable_thinking false passing through;
//   - bad input: 400s naming the field.
// Env: LLM_NPM_DIR, LLM_BASE_URL, LLM_MODEL, LLM_FORMAT (hermes | llama3_json),
// LLM_TOOL_SETS (how many forced requests).
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const require = createRequire(process.env.LLM_NPM_DIR + '/');
const Ajv2020 = require('ajv/dist/2020').default;
const { OpenAI } = require('openai');

const base = process.env.LLM_BASE_URL;
const model = process.env.LLM_MODEL;
const format = process.env.LLM_FORMAT;
const numSets = Number(process.env.LLM_TOOL_SETS ?? 60);
const ajv = new Ajv2020({ strict: false });
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 0 });

function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Bounded parameter schemas (so that most outputs end before max_tokens).
function makeTools(rand, k) {
  const pick = (a) => a[Math.floor(rand() * a.length)];
  const leaf = () =>
    pick([
      () => ({ type: 'string', maxLength: 1 + Math.floor(rand() * 8) }),
      () => ({ type: 'integer', minimum: -50, maximum: 50 + Math.floor(rand() * 500) }),
      () => ({ type: 'boolean' }),
      () => ({ type: 'string', enum: ['celsius', 'fahrenheit', 'kelvin'] }),
      () => ({ type: 'string', pattern: '^[A-Z][a-z]{1,5}$' }),
      () => ({ type: 'array', items: { type: 'integer', minimum: 0, maximum: 9 }, maxItems: 3 }),
      () => ({ type: ['string', 'null'], maxLength: 4 }),
      () => ({ anyOf: [{ type: 'integer', minimum: 0, maximum: 9 }, { const: 'none' }] }),
    ])();
  const object = (depth) => {
    const names = ['city', 'unit', 'days', 'query', 'limit', 'tags', 'exact', 'id'];
    const n = 1 + Math.floor(rand() * 3);
    const properties = {};
    for (let i = 0; i < n; ++i) {
      properties[names[(i * 3 + Math.floor(rand() * 8)) % names.length] + i] =
        depth < 1 && rand() < 0.25 ? object(depth + 1) : leaf();
    }
    const keys = Object.keys(properties);
    return {
      type: 'object',
      properties,
      required: keys.filter(() => rand() < 0.7),
      additionalProperties: false,
    };
  };
  const tools = [];
  for (let i = 0; i < k; ++i) {
    tools.push({
      type: 'function',
      function: {
        name: pick(['get_weather', 'search', 'lookup_user', 'book.flight', 'send-mail']) + '_' + i,
        description: 'a tool',
        parameters: rand() < 0.1 ? { type: 'object', properties: {} } : object(0),
      },
    });
  }
  return tools;
}

async function post(path, body) {
  const res = await fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: await res.json() };
}

// A streamed chat completion added up as a client does: content, reasoning, calls by index.
async function streamed(body) {
  const res = await fetch(base + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(res.status, 200);
  const text = await res.text();
  const out = { content: '', reasoning: '', calls: [], finish: null };
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const chunk = JSON.parse(line.slice(6));
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.finish_reason) out.finish = c.finish_reason;
    const d = c.delta ?? {};
    out.content += d.content ?? '';
    out.reasoning += d.reasoning_content ?? '';
    for (const t of d.tool_calls ?? []) {
      if (!out.calls[t.index]) {
        assert.ok(t.id && t.type === 'function' && t.function.name, 'first delta: id and name');
        out.calls[t.index] = { name: t.function.name, arguments: '' };
      }
      out.calls[t.index].arguments += t.function.arguments ?? '';
    }
  }
  return out;
}

const failures = [];
const stats = { forced: 0, calls: 0, length: 0, streamed: 0 };
function check(cond, what) {
  if (!cond) failures.push(what);
}

// ---- Forced calls over the corpus.
const t0 = Date.now();
const rand = mulberry32(format === 'hermes' ? 7 : 11);
const jobs = [];
for (let i = 0; i < numSets; ++i) {
  const tools = makeTools(rand, 1 + Math.floor(rand() * 3));
  const named = i % 2 === 1;
  const parallel = rand() < 0.5;
  const body = {
    model,
    messages: [{ role: 'user', content: 'Use a tool, please. #' + i }],
    tools,
    tool_choice: named
      ? { type: 'function', function: { name: tools[tools.length - 1].function.name } }
      : 'required',
    parallel_tool_calls: parallel,
    temperature: 1,
    seed: i,
    max_tokens: 300,
    // Qwen3 would think first (the grammar allows a <think> block): measured below instead.
    chat_template_kwargs: { enable_thinking: false },
  };
  jobs.push({ i, tools, named, parallel, body });
}
async function runForced(job) {
  const { i, tools, named, parallel, body } = job;
  const r = await post('/v1/chat/completions', body);
  if (r.status !== 200) return check(false, `#${i}: status ${r.status} ${JSON.stringify(r.json)}`);
  const choice = r.json.choices[0];
  ++stats.forced;
  if (choice.finish_reason === 'length') {
    ++stats.length;
  } else {
    check(choice.finish_reason === 'tool_calls', `#${i}: finish ${choice.finish_reason}`);
    const calls = choice.message.tool_calls ?? [];
    check(calls.length >= 1, `#${i}: no tool calls: ${JSON.stringify(choice.message)}`);
    check(choice.message.content === null, `#${i}: content ${choice.message.content}`);
    if (!parallel) check(calls.length === 1, `#${i}: ${calls.length} calls without parallel`);
    for (const call of calls) {
      ++stats.calls;
      const tool = tools.find((t) => t.function.name === call.function.name);
      check(tool, `#${i}: unknown tool ${call.function.name}`);
      if (!tool) continue;
      if (named) check(tool === tools[tools.length - 1], `#${i}: not the named tool`);
      check(typeof call.id === 'string' && call.id.length > 0 && call.type === 'function',
            `#${i}: id / type`);
      let args;
      try {
        args = JSON.parse(call.function.arguments);
      } catch (e) {
        check(false, `#${i}: arguments do not parse: ${call.function.arguments}`);
        continue;
      }
      const validate = ajv.compile(tool.function.parameters);
      check(validate(args), `#${i}: arguments ${call.function.arguments} break the schema ` +
                              `${JSON.stringify(tool.function.parameters)}: ` +
                              JSON.stringify(validate.errors));
    }
  }
  if (i % 4 === 0) {  // the streamed twin adds up to the same response
    ++stats.streamed;
    const s = await streamed(body);
    check(s.finish === choice.finish_reason, `#${i}: streamed finish ${s.finish}`);
    const calls = (choice.message.tool_calls ?? []).map((c) => ({
      name: c.function.name,
      arguments: c.function.arguments,
    }));
    check(JSON.stringify(s.calls) === JSON.stringify(calls),
          `#${i}: streamed calls ${JSON.stringify(s.calls)} != ${JSON.stringify(calls)}`);
    check(s.content === (choice.message.content ?? ''), `#${i}: streamed content`);
  }
}
for (let k = 0; k < jobs.length; k += 8) await Promise.all(jobs.slice(k, k + 8).map(runForced));
console.log(`forced: ${stats.forced} requests, ${stats.calls} calls validated, ` +
            `${stats.length} cut short, ${stats.streamed} streamed twins, ` +
            `${((Date.now() - t0) / 1000).toFixed(1)} s`);
check(stats.calls >= numSets / 2, `only ${stats.calls} calls validated`);

// ---- The model's own format, found with tool_choice auto (the text forced by a choice).
const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 10 } },
      required: ['city'],
    },
  },
};
{
  const callText = format === 'hermes'
    ? '<think>I need the weather.</think>\n\n<tool_call>\n{"name": "get_weather", ' +
      '"arguments": {"city": "Oslo"}}\n</tool_call>'
    : '{"name": "get_weather", "parameters": {"city": "Oslo"}}';
  const body = {
    model,
    messages: [{ role: 'user', content: 'Weather in Oslo?' }],
    tools: [weather],
    structured_outputs: { choice: [callText] },
    max_tokens: 100,
    // The choice itself holds the <think> block: the template's own is closed.
    chat_template_kwargs: { enable_thinking: false },
  };
  const r = await post('/v1/chat/completions', body);
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const msg = r.json.choices[0].message;
  assert.equal(r.json.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.json));
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), { city: 'Oslo' });
  assert.equal(msg.content, null);
  if (format === 'hermes') assert.equal(msg.reasoning_content, 'I need the weather.');
  const s = await streamed(body);
  assert.deepEqual(s.calls, [{ name: 'get_weather', arguments: msg.tool_calls[0].function.arguments }]);
  assert.equal(s.reasoning, msg.reasoning_content ?? '');
  assert.equal(s.finish, 'tool_calls');
  // tool_choice none: the same text is content.
  const none = await post('/v1/chat/completions', { ...body, tool_choice: 'none' });
  assert.equal(none.status, 200);
  assert.equal(none.json.choices[0].message.tool_calls, undefined);
  assert.equal(none.json.choices[0].finish_reason, 'stop');
  if (format === 'hermes') {
    // Plain reasoning and content.
    const think = await post('/v1/chat/completions', {
      ...body,
      tools: undefined,
      structured_outputs: { choice: ['<think>\nHmm.\n</think>\n\nIt is sunny.'] },
      chat_template_kwargs: { enable_thinking: false },
    });
    assert.equal(think.json.choices[0].message.reasoning_content, '\nHmm.\n');
    assert.equal(think.json.choices[0].message.content, 'It is sunny.');
  }
}

// ---- A reasoning model thinks before a structured output or a forced call: the grammar
// starts after </think> (logit_bias makes the random model open and close the block).
if (format === 'hermes') {
  const schema = {
    type: 'object',
    properties: { answer: { type: 'integer', minimum: 0, maximum: 99 } },
    required: ['answer'],
    additionalProperties: false,
  };
  const bias = { 151667: 100, 151668: 100 };  // Qwen3's <think> and </think>
  let thought = 0;
  for (let seed = 0; seed < 10; ++seed) {
    const r = await post('/v1/chat/completions', {
      model,
      messages: [{ role: 'user', content: 'Think, then answer in JSON.' }],
      response_format: { type: 'json_schema', json_schema: { name: 'a', schema, strict: true } },
      logit_bias: bias,
      seed,
      max_tokens: 120,
    });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    const c = r.json.choices[0];
    assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
    assert.ok(ajv.validate(schema, JSON.parse(c.message.content)), JSON.stringify(c.message));
    if (c.message.reasoning_content !== null) ++thought;
    const t = await post('/v1/chat/completions', {
      model,
      messages: [{ role: 'user', content: 'Think, then call.' }],
      tools: [weather],
      tool_choice: 'required',
      logit_bias: bias,
      seed,
      max_tokens: 120,
    });
    const tc = t.json.choices[0];
    if (tc.finish_reason === 'length') continue;
    assert.equal(tc.finish_reason, 'tool_calls', JSON.stringify(tc));
    for (const call of tc.message.tool_calls) {
      assert.ok(ajv.validate(weather.function.parameters, JSON.parse(call.function.arguments)));
    }
    if (tc.message.reasoning_content !== null) ++thought;
  }
  assert.ok(thought > 0, 'some replies thought first');
  console.log(`reasoning then structure: ${thought} of 20 replies thought first`);
}

// ---- History with tool calls and results, rendered by the template.
{
  const history = [
    { role: 'user', content: 'Weather in Oslo?' },
    {
      role: 'assistant',
      content: null,
      tool_calls: [{ id: 'call_1', type: 'function',
                     function: { name: 'get_weather', arguments: '{"city": "Oslo"}' } }],
    },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 3}' },
  ];
  const r = await post('/v1/chat/completions',
                       { model, messages: history, tools: [weather], max_tokens: 8 });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const short = await post('/v1/chat/completions',
                           { model, messages: history.slice(0, 1), tools: [weather], max_tokens: 8 });
  assert.ok(r.json.usage.prompt_tokens > short.json.usage.prompt_tokens + 10,
            'the history is in the prompt');
  if (format === 'hermes') {  // Qwen3's template: enable_thinking false adds an empty block
    const off = await post('/v1/chat/completions', {
      model, messages: history.slice(0, 1), max_tokens: 4,
      chat_template_kwargs: { enable_thinking: false },
    });
    const on = await post('/v1/chat/completions',
                          { model, messages: history.slice(0, 1), max_tokens: 4 });
    assert.ok(off.json.usage.prompt_tokens > on.json.usage.prompt_tokens,
              'enable_thinking false reaches the template');
  }
}

// ---- The openai SDK, unmodified. A random-weight model may run to max_tokens (the SDK's
// parse helpers then throw LengthFinishReasonError): the next seed is tried, up to 8.
async function finished(make) {
  for (let seed = 1; seed <= 8; ++seed) {
    try {
      return await make(seed);
    } catch (e) {
      if (e.constructor.name !== 'LengthFinishReasonError') throw e;
    }
  }
  throw new Error('8 seeds all ran to max_tokens');
}
{
  const schema = {
    type: 'object',
    properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
    required: ['name', 'age'],
    additionalProperties: false,
  };
  const parsed = await finished((seed) => client.chat.completions.parse({
    model,
    messages: [{ role: 'user', content: 'A person as JSON.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } },
    max_tokens: 200,
    chat_template_kwargs: { enable_thinking: false },  // (Qwen3 thinks otherwise)
    seed,
  }));
  const m = parsed.choices[0].message;
  assert.equal(parsed.choices[0].finish_reason, 'stop');
  {
    assert.deepEqual(m.parsed, JSON.parse(m.content));
    assert.ok(ajv.validate(schema, m.parsed), JSON.stringify(m.parsed));
  }
  const strictTool = { type: 'function', function: { name: 'person_info', strict: true, parameters: schema } };
  const withTool = await finished((seed) => client.chat.completions.parse({
    model,
    messages: [{ role: 'user', content: 'Call person_info.' }],
    tools: [strictTool],
    tool_choice: { type: 'function', function: { name: 'person_info' } },
    max_tokens: 200,
    chat_template_kwargs: { enable_thinking: false },  // (Qwen3 thinks otherwise)
    seed: seed + 10,
  }));
  const call = withTool.choices[0].message.tool_calls?.[0];
  assert.equal(withTool.choices[0].finish_reason, 'tool_calls');
  {
    assert.equal(call.function.name, 'person_info');
    assert.ok(ajv.validate(schema, call.function.parsed_arguments), JSON.stringify(call));
  }
  // Streamed tool calls assembled by the SDK's own helper.
  let deltas = [];
  const final = await finished(async (seed) => {
    deltas = [];
    const stream = client.chat.completions.stream({
      model,
      messages: [{ role: 'user', content: 'Weather?' }],
      tools: [weather, strictTool],
      tool_choice: 'required',
      parallel_tool_calls: false,
      max_tokens: 200,
      chat_template_kwargs: { enable_thinking: false },
      seed: seed + 20,
    });
    stream.on('tool_calls.function.arguments.done', (e) => deltas.push(e));
    return await stream.finalChatCompletion();
  });
  const fc = final.choices[0];
  assert.equal(fc.finish_reason, 'tool_calls');
  {
    assert.equal(fc.message.tool_calls.length, 1);
    assert.equal(deltas.length, 1);
    assert.equal(deltas[0].name, fc.message.tool_calls[0].function.name);
    assert.equal(deltas[0].arguments, fc.message.tool_calls[0].function.arguments);
    const tool = [weather, strictTool].find((t) => t.function.name === deltas[0].name);
    assert.ok(ajv.validate(tool.function.parameters, JSON.parse(deltas[0].arguments)));
  }
  console.log(`sdk: parse ${parsed.choices[0].finish_reason}, parse+tools ` +
              `${withTool.choices[0].finish_reason}, stream ${fc.finish_reason}`);
}

// ---- Bad input.
{
  const msgs = [{ role: 'user', content: 'hi' }];
  const cases = [
    [{ tools: [weather], tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
    [{ tools: [weather], tool_choice: 'sometimes' }, 'tool_choice'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ tools: {} }, 'tools'],
    [{ tools: [{ type: 'function', function: { name: 'bad name!' } }] }, 'tools[0].function.name'],
    [{ tools: [{ type: 'retrieval' }] }, 'tools[0].type'],
    [{ tools: [weather], parallel_tool_calls: 'yes' }, 'parallel_tool_calls'],
    [{ tools: [weather], tool_choice: 'required', response_format: { type: 'json_object' } }, 'tool_choice'],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'string' } } }],
       tool_choice: 'required' }, 'tools'],
    [{ tools: [{ type: 'function', function: { name: 'f', strict: true,
                 parameters: { type: 'object', properties: { a: { type: 'string', format: 'date' } } } } }],
       tool_choice: 'required' }, 'tools'],
  ];
  // Nested beyond 512 levels: a 400 before parsing, and the server lives on.
  const deep = '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", ' +
    '"function": {"name": "f", "parameters": {"a": ' + '['.repeat(200000) + ']'.repeat(200000) +
    '}}}], "tool_choice": "required"}';
  const deepRes = await fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: deep });
  assert.equal(deepRes.status, 400);
  assert.equal((await deepRes.json()).error.code, 'invalid_json');
  assert.equal((await fetch(base + '/health')).status, 200);
  for (const [extra, param] of cases) {
    const r = await post('/v1/chat/completions', { model, messages: msgs, max_tokens: 4, ...extra });
    assert.equal(r.status, 400, JSON.stringify(extra));
    assert.equal(r.json.error.param, param, JSON.stringify(r.json));
    assert.equal(r.json.error.type, 'invalid_request_error');
  }
}

if (failures.length) {
  console.error(`${failures.length} failures:\n` + failures.slice(0, 20).join('\n'));
  process.exit(1);
}
console.log(`ok (${model}, ${format})`);
