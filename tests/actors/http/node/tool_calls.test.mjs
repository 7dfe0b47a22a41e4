// Tool calling through the official `openai` package against a real `mqlm serve --http` of the
// tiny model (random weights) with a Hermes / Qwen chat template from llama.cpp's collection: a
// round trip, streamed and not, for tool_choice required and a named function (calls whose
// arguments parse and validate against the tool's schema, a tool message with the result, then
// an answer with content), and the streamed deltas accumulated by the client's own stream helper
// equal to what is not streamed. Run by openai_client_test.sh with --chat-template.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.MQLM_HTTP_URL;
const apiKey = process.env.MQLM_API_KEY;
const model = process.env.MQLM_MODEL;
assert.ok(baseURL && apiKey && model, 'MQLM_HTTP_URL, MQLM_API_KEY and MQLM_MODEL must be set');
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 300_000 });

// Schemas a random model finishes quickly: enums and integers (16 digits at most).
const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city for the next days.',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', enum: ['Paris', 'Oslo', 'Lima'] }, days: { type: 'integer' } },
        required: ['city', 'days'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'get_time',
      description: 'The time in a zone.',
      parameters: {
        type: 'object',
        properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } },
        required: ['zone'],
        additionalProperties: false,
      },
    },
  },
];
const question = [{ role: 'user', content: 'What is the weather in Paris for the next 3 days?' }];

// The arguments against a tool's parameters (the keywords above): the first problem, or null.
function argumentsProblem(name, text) {
  const tool = tools.find((t) => t.function.name === name);
  if (!tool) return `no tool named ${name}`;
  let args;
  try { args = JSON.parse(text); } catch (e) { return `arguments are not JSON: ${text}`; }
  if (typeof args !== 'object' || args === null || Array.isArray(args)) return `arguments not an object: ${text}`;
  const { properties, required } = tool.function.parameters;
  for (const key of required) if (!(key in args)) return `${key} missing: ${text}`;
  for (const [key, value] of Object.entries(args)) {
    const schema = properties[key];
    if (!schema) return `${key} is not a parameter: ${text}`;
    if (schema.enum && !schema.enum.includes(value)) return `${key} not in its enum: ${text}`;
    if (schema.type === 'integer' && !Number.isInteger(value)) return `${key} not an integer: ${text}`;
  }
  return null;
}

function checkCalls(message, finish, forced, where) {
  assert.equal(finish, 'tool_calls', `${where}: ${JSON.stringify(message)}`);
  assert.ok(Array.isArray(message.tool_calls) && message.tool_calls.length >= 1, `${where}: no tool_calls`);
  assert.equal(message.content ?? null, null, `${where}: content beside the calls`);
  const ids = new Set();
  for (const call of message.tool_calls) {
    assert.equal(call.type, 'function', where);
    assert.match(call.id, /^call_[0-9a-f]{28}$/, where);
    ids.add(call.id);
    if (forced) assert.equal(call.function.name, forced, where);
    assert.equal(argumentsProblem(call.function.name, call.function.arguments), null, where);
  }
  assert.equal(ids.size, message.tool_calls.length, `${where}: ids not unique`);
}

// The conversation after the calls: the assistant's turn with them, a tool message per call.
function withResults(message) {
  const turns = [...question, { role: 'assistant', content: message.content ?? null, tool_calls: message.tool_calls }];
  for (const call of message.tool_calls) {
    turns.push({ role: 'tool', tool_call_id: call.id, content: JSON.stringify({ temperature_c: 21, sky: 'clear' }) });
  }
  return turns;
}

async function answerTo(turns, stream) {
  const request = { model, messages: turns, tools, seed: 11, temperature: 0.7, max_tokens: 24 };
  if (!stream) {
    const r = await client.chat.completions.create(request);
    return [r.choices[0].message, r.choices[0].finish_reason];
  }
  const s = client.chat.completions.stream(request);
  const r = await s.finalChatCompletion();
  return [r.choices[0].message, r.choices[0].finish_reason];
}

const CHOICES = [
  { name: 'required', tool_choice: 'required', forced: null, parallel_tool_calls: false },
  { name: 'required, parallel', tool_choice: 'required', forced: null, parallel_tool_calls: true },
  { name: 'a named function', tool_choice: { type: 'function', function: { name: 'get_weather' } }, forced: 'get_weather' },
];

for (const choice of CHOICES) {
  test(`tool_choice ${choice.name}: calls that validate, a tool result, an answer (streamed and not)`, async () => {
    const request = { model, messages: question, tools, tool_choice: choice.tool_choice, seed: 5, temperature: 0.8,
                      max_tokens: 400 };
    if (choice.parallel_tool_calls !== undefined) request.parallel_tool_calls = choice.parallel_tool_calls;
    const plain = await client.chat.completions.create(request);
    const message = plain.choices[0].message;
    checkCalls(message, plain.choices[0].finish_reason, choice.forced, 'not streamed');
    if (choice.parallel_tool_calls === false) assert.equal(message.tool_calls.length, 1);

    // Streamed, joined by the client's own helper: the same calls (ids aside).
    const streamed = await client.chat.completions.stream(request).finalChatCompletion();
    const joined = streamed.choices[0].message;
    checkCalls(joined, streamed.choices[0].finish_reason, choice.forced, 'streamed');
    assert.deepEqual(joined.tool_calls.map((c) => c.function), message.tool_calls.map((c) => c.function));

    for (const stream of [false, true]) {
      const [answer, finish] = await answerTo(withResults(message), stream);
      assert.ok(['stop', 'length'].includes(finish), `answer finish ${finish}`);
      assert.equal(typeof answer.content, 'string', JSON.stringify(answer));
    }
  });
}

test('streamed tool_calls deltas: id, type and name on a call\'s first piece only', async () => {
  const stream = await client.chat.completions.create({
    model, messages: question, tools, tool_choice: { type: 'function', function: { name: 'get_time' } }, seed: 2,
    max_tokens: 100, stream: true,
  });
  const pieces = [];
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      if (c.delta?.tool_calls) pieces.push(...c.delta.tool_calls);
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(finish, 'tool_calls');
  assert.ok(pieces.length >= 2, `the arguments come in pieces: ${JSON.stringify(pieces)}`);
  assert.equal(pieces[0].id.startsWith('call_'), true);
  assert.equal(pieces[0].type, 'function');
  assert.equal(pieces[0].function.name, 'get_time');
  for (const piece of pieces.slice(1)) {
    assert.equal(piece.index, 0);
    assert.equal(piece.id, undefined);
    assert.equal(piece.function.name, undefined);
  }
  assert.equal(argumentsProblem('get_time', pieces.map((p) => p.function.arguments).join('')), null);
});

test('tool_choice none and auto with random weights: content, no calls', async () => {
  for (const tool_choice of ['none', 'auto']) {
    const r = await client.chat.completions.create({ model, messages: question, tools, tool_choice, seed: 4,
                                                     max_tokens: 16 });
    assert.equal(r.choices[0].message.tool_calls, undefined, tool_choice);
    assert.equal(typeof r.choices[0].message.content, 'string', tool_choice);
  }
});
