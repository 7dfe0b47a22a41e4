// mqlm's OpenAI API as the official `openai` package sees it: a real `mqlm serve --http` of the
// tiny model (random weights, so the text is gibberish, but greedy decoding makes it repeatable).
// Run by tests/actors/http/openai_client_test.sh with MQLM_HTTP_URL, MQLM_API_KEY and MQLM_MODEL set.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.MQLM_HTTP_URL;
const apiKey = process.env.MQLM_API_KEY;
const model = process.env.MQLM_MODEL;
assert.ok(baseURL && apiKey && model, 'MQLM_HTTP_URL, MQLM_API_KEY and MQLM_MODEL must be set');

// No retries: a 503 or a dropped connection must show, not be papered over.
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120_000 });
const messages = [{ role: 'user', content: 'Tell me a story about a fox.' }];

async function status() {
  const response = await fetch(`${baseURL}/api/status`, { headers: { Authorization: `Bearer ${apiKey}` } });
  assert.equal(response.status, 200);
  return response.json();
}

function checkUsage(usage, maxTokens) {
  assert.ok(usage.prompt_tokens > 0, 'prompt tokens counted');
  assert.ok(usage.completion_tokens > 0 && usage.completion_tokens <= maxTokens, `completion_tokens ${usage.completion_tokens}`);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  const cached = usage.prompt_tokens_details.cached_tokens;
  assert.ok(Number.isInteger(cached) && cached >= 0 && cached <= usage.prompt_tokens, `cached_tokens ${cached}`);
}

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

test('the model list names the served model', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [model]);
  assert.equal((await client.models.retrieve(model)).id, model);
});

test('chat completion, not streamed: text, finish reason and usage', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
  assert.equal(r.choices[0].logprobs, null);
  checkUsage(r.usage, 8);
  if (r.choices[0].finish_reason === 'length') assert.equal(r.usage.completion_tokens, 8);
});

test('chat streamed: the same greedy text as not streamed, role first, usage last', async () => {
  const request = { model, messages, max_tokens: 12, temperature: 0 };
  const whole = await client.chat.completions.create(request);
  const chunks = await collect(
    await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } }));
  assert.equal(chunks[0].object, 'chat.completion.chunk');
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const text = chunks.flatMap((c) => c.choices.map((choice) => choice.delta.content ?? '')).join('');
  assert.equal(text, whole.choices[0].message.content);
  const finishes = chunks.flatMap((c) => c.choices.map((choice) => choice.finish_reason)).filter((f) => f !== null);
  assert.deepEqual(finishes, [whole.choices[0].finish_reason]);
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(last.usage.prompt_tokens, whole.usage.prompt_tokens);
  checkUsage(last.usage, 12);
  assert.ok(chunks.every((c) => c.id === chunks[0].id));
});

test('completions, streamed and not, agree; default max_tokens is 16', async () => {
  const prompt = 'Once upon a time';
  const whole = await client.completions.create({ model, prompt, temperature: 0 });
  assert.equal(whole.object, 'text_completion');
  assert.match(whole.id, /^cmpl-/);
  assert.ok(whole.usage.completion_tokens <= 16);
  if (whole.choices[0].finish_reason === 'length') assert.equal(whole.usage.completion_tokens, 16);
  const chunks = await collect(await client.completions.create({ model, prompt, temperature: 0, stream: true }));
  assert.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), whole.choices[0].text);
  assert.equal(chunks.at(-1).choices[0].finish_reason, whole.choices[0].finish_reason);
  assert.ok(chunks.every((c) => c.usage === undefined), 'no usage unless asked for');
});

test('a token-id prompt works like text', async () => {
  const r = await client.completions.create({ model, prompt: [300, 400, 500], max_tokens: 4, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, 3);
  checkUsage(r.usage, 4);
});

test('chat logprobs: one entry per token, greedy picks the top one, bytes spell the text', async () => {
  const r = await client.chat.completions.create({
    model, messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const entry of content) {
    assert.equal(typeof entry.token, 'string');
    assert.ok(entry.logprob <= 0, `logprob ${entry.logprob}`);
    assert.ok(Array.isArray(entry.bytes) && entry.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256));
    assert.equal(entry.top_logprobs.length, 3);
    for (let i = 1; i < 3; ++i) assert.ok(entry.top_logprobs[i - 1].logprob >= entry.top_logprobs[i].logprob);
    assert.equal(entry.top_logprobs[0].token, entry.token);
    assert.equal(entry.top_logprobs[0].logprob, entry.logprob);
  }
  if (r.choices[0].finish_reason === 'length') {
    // Random weights make broken UTF-8; decoders may differ in how many U+FFFD stand for it.
    const oneReplacement = (text) => text.replace(/\uFFFD+/g, '\uFFFD');
    const bytes = Buffer.from(content.flatMap((e) => e.bytes));
    assert.equal(oneReplacement(bytes.toString('utf8')), oneReplacement(r.choices[0].message.content));
  }
});

test('completions logprobs: tokens, token_logprobs, top_logprobs and text_offset line up', async () => {
  const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  const n = r.usage.completion_tokens;
  assert.equal(lp.tokens.length, n);
  assert.equal(lp.token_logprobs.length, n);
  assert.equal(lp.top_logprobs.length, n);
  assert.equal(lp.text_offset.length, n);
  assert.equal(lp.text_offset[0], 0);
  for (let i = 0; i < n; ++i) {
    if (i > 0) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
    const top = lp.top_logprobs[i];
    assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 3);
    assert.equal(top[lp.tokens[i]], lp.token_logprobs[i]);
  }
  // Streamed, the same entries arrive spread over the chunks, offsets continuing.
  const chunks = await collect(await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0, logprobs: 2, stream: true,
  }));
  const streamed = chunks.flatMap((c) => c.choices[0]?.logprobs?.tokens ?? []);
  const offsets = chunks.flatMap((c) => c.choices[0]?.logprobs?.text_offset ?? []);
  assert.deepEqual(streamed, lp.tokens);
  assert.deepEqual(offsets, lp.text_offset);
});

test('a stop string ends the text before it, with finish_reason stop', async () => {
  const request = { model, messages, max_tokens: 24, temperature: 0 };
  const free = (await client.chat.completions.create(request)).choices[0].message.content;
  // A stretch of the free text that first occurs where it is taken from, after some text.
  let stop = null;
  for (let i = 2; i + 3 <= free.length && stop === null; ++i) {
    const candidate = free.slice(i, i + 3);
    if (candidate.trim().length > 0 && !candidate.includes('\uFFFD') && free.indexOf(candidate) === i) stop = candidate;
  }
  assert.ok(stop !== null, `no usable stop string in ${JSON.stringify(free)}`);
  for (const stream of [false, true]) {
    let text, finish;
    if (stream) {
      const chunks = await collect(await client.chat.completions.create({ ...request, stop: [stop], stream }));
      text = chunks.flatMap((c) => c.choices.map((choice) => choice.delta.content ?? '')).join('');
      finish = chunks.flatMap((c) => c.choices.map((choice) => choice.finish_reason)).find((f) => f !== null);
    } else {
      const r = await client.chat.completions.create({ ...request, stop });
      text = r.choices[0].message.content;
      finish = r.choices[0].finish_reason;
    }
    assert.equal(finish, 'stop', `stream ${stream}`);
    assert.equal(text, free.slice(0, free.indexOf(stop)), `stream ${stream}`);
  }
});

test('the same seed gives the same sampled text', async () => {
  const request = { model, messages, max_tokens: 10, temperature: 1.0, seed: 1234 };
  const first = await client.chat.completions.create(request);
  const second = await client.chat.completions.create(request);
  assert.equal(second.choices[0].message.content, first.choices[0].message.content);
});

// Sampled, not greedy: the sampler applies the bias wherever the token is drawn.
test('logit_bias of 100 makes the sampler repeat the token it names', async () => {
  const repeated = async (id) => {
    const r = await client.completions.create({
      model, prompt: [300, 400, 500], max_tokens: 4, temperature: 0.8, seed: 7, logprobs: 0,
      logit_bias: { [id]: 100 },
    });
    const tokens = r.choices[0].logprobs.tokens;
    assert.equal(tokens.length, 4, `bias on ${id}: ${JSON.stringify(tokens)}`);
    assert.ok(tokens.every((t) => t === tokens[0]), `bias on ${id}: ${JSON.stringify(tokens)}`);
    return tokens[0];
  };
  assert.notEqual(await repeated(301), await repeated(302));
});

test('a repeated long prompt reports its cached tokens', async () => {
  const long = [{ role: 'user', content: 'The quick brown fox jumps over the lazy dog. '.repeat(8) }];
  await client.chat.completions.create({ model, messages: long, max_tokens: 2, temperature: 0 });
  const again = await client.chat.completions.create({ model, messages: long, max_tokens: 2, temperature: 0 });
  assert.ok(again.usage.prompt_tokens_details.cached_tokens >= 16,
    `cached_tokens ${again.usage.prompt_tokens_details.cached_tokens} of ${again.usage.prompt_tokens}`);
});

test('closing a stream early aborts its request', async () => {
  const before = (await status()).http.finished;
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 1500, temperature: 0, stream: true });
  let contentChunks = 0;
  for await (const chunk of stream) {
    if (chunk.choices[0]?.delta?.content) ++contentChunks;
    if (contentChunks === 2) break;  // the package closes the connection
  }
  assert.equal(contentChunks, 2);
  // The server notices on its next write and aborts: the request leaves every table.
  const deadline = Date.now() + 30_000;
  let now = await status();
  while ((now.requests.tracked !== 0 || now.requests.http_open !== 0) && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    now = await status();
  }
  assert.equal(now.requests.tracked, 0, 'the scheduler still has the request');
  assert.equal(now.requests.http_open, 0, 'the http actor still has the request');
  assert.equal(now.http.finished.abort, before.abort + 1, 'it ended by abort, not by running out');
  assert.equal(now.http.finished.length, before.length);
});

test('an unknown model is a 404, streamed or not', async () => {
  for (const stream of [false, true]) {
    await assert.rejects(
      async () => {
        const r = await client.chat.completions.create({ model: 'no-such-model', messages, max_tokens: 4, stream });
        if (stream) await collect(r);
      },
      (error) => {
        assert.ok(error instanceof OpenAI.NotFoundError, `${error}`);
        assert.equal(error.status, 404);
        assert.equal(error.code, 'model_not_found');
        return true;
      });
  }
});

test('a bad API key is a 401, and so is none', async () => {
  for (const key of ['wrong-key', '']) {
    const other = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: key || 'x', maxRetries: 0,
      defaultHeaders: key ? {} : { Authorization: null } });
    await assert.rejects(() => other.chat.completions.create({ model, messages, max_tokens: 2 }), (error) => {
      assert.ok(error instanceof OpenAI.AuthenticationError, `${error}`);
      assert.equal(error.status, 401);
      return true;
    });
  }
  const health = await fetch(`${baseURL}/health`);
  assert.equal(health.status, 200, '/health needs no key');
});

test('bad parameters are 400s naming the parameter, and the server stays up', async () => {
  const bad = [
    [{ n: 2 }, 'n'],
    [{ max_tokens: -1 }, 'max_tokens'],
    [{ temperature: 5 }, 'temperature'],
    [{ logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
    [{ frobnicate: true }, 'frobnicate'],
    [{ logit_bias: { abc: 1 } }, 'logit_bias["abc"]'],
    [{ logit_bias: { 5: 150 } }, 'logit_bias["5"]'],
    [{ logit_bias: [5] }, 'logit_bias'],
  ];
  for (const [fields, param] of bad) {
    await assert.rejects(() => client.chat.completions.create({ model, messages, max_tokens: 2, ...fields }), (error) => {
      assert.ok(error instanceof OpenAI.BadRequestError, `${JSON.stringify(fields)}: ${error}`);
      assert.equal(error.param, param);
      return true;
    });
  }
  // An id past the model's vocabulary: only the server, which knows the model, can refuse it.
  await assert.rejects(
    () => client.chat.completions.create({ model, messages, max_tokens: 2, logit_bias: { 99999999: 1 } }),
    (error) => error instanceof OpenAI.BadRequestError && /logit_bias/.test(error.message),
  );
  const r = await client.chat.completions.create({ model, messages, max_tokens: 2, temperature: 0 });
  checkUsage(r.usage, 2);
});

// ---- embeddings ----------------------------------------------------------------------------------

function norm(vector) {
  return Math.sqrt(vector.reduce((sum, v) => sum + v * v, 0));
}

function assertSameVector(got, want, what) {
  assert.equal(got.length, want.length, `${what}: length`);
  const worst = got.reduce((w, v, i) => Math.max(w, Math.abs(v - want[i])), 0);
  assert.ok(worst < 1e-6, `${what}: differs by ${worst}`);
}

test('embeddings: a string, strings, token ids, and base64 (the package default) as the float form', async () => {
  const one = await client.embeddings.create({ model, input: 'The quick brown fox', encoding_format: 'float' });
  assert.equal(one.object, 'list');
  assert.equal(one.model, model);
  assert.equal(one.data.length, 1);
  assert.equal(one.data[0].object, 'embedding');
  assert.equal(one.data[0].index, 0);
  const vector = one.data[0].embedding;
  assert.ok(vector.length > 0 && vector.every(Number.isFinite), 'a vector of numbers');
  assert.ok(Math.abs(norm(vector) - 1) < 1e-5, `L2-normalised: norm ${norm(vector)}`);
  assert.ok(one.usage.prompt_tokens > 0);
  assert.equal(one.usage.total_tokens, one.usage.prompt_tokens);

  // Without encoding_format the package asks for base64 and decodes it to numbers.
  const decoded = await client.embeddings.create({ model, input: 'The quick brown fox' });
  assertSameVector(decoded.data[0].embedding, vector, 'base64');

  const several = await client.embeddings.create({ model, input: ['jumps over', 'The quick brown fox'], encoding_format: 'float' });
  assert.deepEqual(several.data.map((d) => d.index), [0, 1]);
  assertSameVector(several.data[1].embedding, vector, 'the same input among others');
  const cosine = several.data[0].embedding.reduce((sum, v, i) => sum + v * vector[i], 0);
  assert.ok(cosine < 0.9999, `other text, another vector (cosine ${cosine})`);
  assert.ok(several.usage.prompt_tokens > one.usage.prompt_tokens);

  const tokens = [5, 17, 300, 42, 9];
  const byIds = await client.embeddings.create({ model, input: tokens, encoding_format: 'float' });
  assert.equal(byIds.usage.prompt_tokens, tokens.length, 'token ids are used as given');
  const lists = await client.embeddings.create({ model, input: [tokens, [7, 8]], encoding_format: 'float' });
  assert.equal(lists.data.length, 2);
  assertSameVector(lists.data[0].embedding, byIds.data[0].embedding, 'ids alone and in a list');
});

test('embeddings: bad input is a 400, and no request or page is left behind', async () => {
  const bad = [
    [{ input: '' }, 'input'],
    [{ input: [] }, 'input'],
    [{ input: ['fine', ''] }, 'input[1]'],
    [{ input: 'x', dimensions: 3 }, 'dimensions'],
    [{ input: 'x', encoding_format: 'int8' }, 'encoding_format'],
    [{ input: 'x', frobnicate: 1 }, 'frobnicate'],
  ];
  for (const [fields, param] of bad) {
    await assert.rejects(() => client.embeddings.create({ model, encoding_format: 'float', ...fields }), (error) => {
      assert.ok(error instanceof OpenAI.BadRequestError, `${JSON.stringify(fields)}: ${error}`);
      assert.equal(error.param, param);
      return true;
    });
  }
  // Longer than the model's context: refused by the scheduler, which knows it.
  await assert.rejects(
    () => client.embeddings.create({ model, input: Array(100_000).fill(5), encoding_format: 'float' }),
    (error) => error instanceof OpenAI.BadRequestError && error.code === 'context_length_exceeded',
  );
  const r = await client.embeddings.create({ model, input: 'still up', encoding_format: 'float' });
  assert.equal(r.data.length, 1);
  const now = await status();
  assert.equal(now.requests.tracked, 0, 'the scheduler still has a request');
  assert.equal(now.requests.http_open, 0, 'the http actor still has a request');
  assert.equal(now.kv_pages.used, 0, 'a page is still held');
});
