// response_format through the official `openai` package against a real `mqlm serve --http` of the
// tiny model (random weights): every json_schema answer parses and validates against its schema,
// over several seeds and temperatures, streamed and not; json_object answers parse as objects;
// schemas the grammar cannot enforce get a 400 that names what. Run by openai_client_test.sh.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.MQLM_HTTP_URL;
const apiKey = process.env.MQLM_API_KEY;
const model = process.env.MQLM_MODEL;
assert.ok(baseURL && apiKey && model, 'MQLM_HTTP_URL, MQLM_API_KEY and MQLM_MODEL must be set');
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 300_000 });
const messages = [{ role: 'user', content: 'Describe a person as JSON.' }];

// ---- a small JSON-schema validator: the keywords these schemas use -------------------------------

const FORMATS = {
  date: (s) => validDate(s),
  time: (s) => /^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$/.test(s),
  'date-time': (s) => { const i = s.indexOf('T'); return i > 0 && validDate(s.slice(0, i)) && FORMATS.time(s.slice(i + 1)); },
  uuid: (s) => /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(s),
  email: (s) => /^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}$/.test(s),
};

function validDate(s) {
  const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s);
  if (!m) return false;
  const [y, mo, d] = [Number(m[1]), Number(m[2]), Number(m[3])];
  const days = new Date(Date.UTC(y, mo, 0)).getUTCDate();  // the month's last day
  return mo >= 1 && mo <= 12 && d >= 1 && d <= days;
}

function typeOf(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v;
}

// The first problem found, as "path: what", or null.
function validate(schema, value, path = '$') {
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(value))) return `${path}: not in enum`;
  if ('const' in schema && JSON.stringify(schema.const) !== JSON.stringify(value)) return `${path}: not the const`;
  if (schema.anyOf) {
    return schema.anyOf.some((s) => validate(s, value, path) === null) ? null : `${path}: matches no anyOf branch`;
  }
  if (schema.type) {
    const types = [].concat(schema.type);
    const t = typeOf(value);
    if (!types.includes(t) && !(t === 'integer' && types.includes('number'))) return `${path}: ${t}, not ${types}`;
  }
  if (typeof value === 'string') {
    const length = [...value].length;
    if (schema.minLength !== undefined && length < schema.minLength) return `${path}: shorter than ${schema.minLength}`;
    if (schema.maxLength !== undefined && length > schema.maxLength) return `${path}: longer than ${schema.maxLength}`;
    if (schema.format && !FORMATS[schema.format](value)) return `${path}: not a ${schema.format}: ${value}`;
  }
  if (Array.isArray(value)) {
    if (schema.minItems !== undefined && value.length < schema.minItems) return `${path}: fewer than ${schema.minItems} items`;
    if (schema.maxItems !== undefined && value.length > schema.maxItems) return `${path}: more than ${schema.maxItems} items`;
    for (let i = 0; i < value.length && schema.items; ++i) {
      const problem = validate(schema.items, value[i], `${path}[${i}]`);
      if (problem) return problem;
    }
  }
  if (typeOf(value) === 'object') {
    for (const name of schema.required ?? []) if (!(name in value)) return `${path}: '${name}' is missing`;
    for (const [name, v] of Object.entries(value)) {
      const sub = schema.properties?.[name];
      if (!sub) {
        if (schema.additionalProperties === false) return `${path}: '${name}' is not allowed`;
        continue;
      }
      const problem = validate(sub, v, `${path}.${name}`);
      if (problem) return problem;
    }
  }
  return null;
}

// ---- the schemas -------------------------------------------------------------------------------

const text = (maxLength) => ({ type: 'string', maxLength });
const SCHEMAS = {
  person: {
    type: 'object',
    properties: {
      name: text(24),
      age: { type: 'integer' },
      height: { type: 'number' },
      member: { type: 'boolean' },
      role: { enum: ['admin', 'user', 'guest'] },
      nickname: { type: ['string', 'null'], maxLength: 10 },
      address: {
        type: 'object',
        properties: { city: text(16), zip: text(8), country: { const: 'NZ' } },
        required: ['city', 'zip', 'country'],
        additionalProperties: false,
      },
    },
    required: ['name', 'age', 'height', 'member', 'role', 'nickname', 'address'],
    additionalProperties: false,
  },
  lists: {
    type: 'object',
    properties: {
      tags: { type: 'array', items: text(10), minItems: 1, maxItems: 4 },
      scores: { type: 'array', items: { type: 'integer' }, maxItems: 3 },
      matrix: { type: 'array', items: { type: 'array', items: { type: 'boolean' }, maxItems: 2 }, maxItems: 2 },
      optional_note: text(12),
    },
    required: ['tags', 'scores', 'matrix'],
    additionalProperties: false,
  },
  formats: {
    type: 'object',
    properties: {
      born: { type: 'string', format: 'date' },
      wakes: { type: 'string', format: 'time' },
      seen: { type: 'string', format: 'date-time' },
      id: { type: 'string', format: 'uuid' },
      email: { type: 'string', format: 'email' },
      status: { anyOf: [{ type: 'null' }, { enum: ['active', 'gone'] }] },
    },
    required: ['born', 'wakes', 'seen', 'id', 'email', 'status'],
    additionalProperties: false,
  },
};

function responseFormat(name) {
  return { type: 'json_schema', json_schema: { name, schema: SCHEMAS[name], strict: true } };
}

function checkAnswer(name, content, finish, label) {
  assert.equal(finish, 'stop', `${label}: the JSON ends with the end token, not the length limit: ${content}`);
  let value;
  assert.doesNotThrow(() => { value = JSON.parse(content); }, `${label}: parses: ${content}`);
  assert.equal(validate(SCHEMAS[name], value), null, `${label}: validates: ${content}`);
  return value;
}

const RUNS = [];
for (const seed of [1, 7, 42]) for (const temperature of [0, 0.8, 1.5]) RUNS.push({ seed, temperature });

for (const name of Object.keys(SCHEMAS)) {
  test(`json_schema '${name}': every answer parses and validates (3 seeds x 3 temperatures)`, async () => {
    const answers = await Promise.all(RUNS.map(({ seed, temperature }) => client.chat.completions.create({
      model, messages, seed, temperature, max_tokens: 1000, response_format: responseFormat(name),
    })));
    answers.forEach((r, i) => {
      checkAnswer(name, r.choices[0].message.content, r.choices[0].finish_reason, `seed ${RUNS[i].seed} t ${RUNS[i].temperature}`);
    });
  });
}

test('json_schema streamed: the deltas join into the same valid JSON as not streamed', async () => {
  const request = { model, messages, seed: 3, temperature: 0.9, max_tokens: 1000, response_format: responseFormat('person') };
  const whole = await client.chat.completions.create(request);
  const chunks = [];
  for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) chunks.push(chunk);
  const content = chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content ?? '')).join('');
  const finish = chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter((f) => f !== null);
  checkAnswer('person', content, finish[0], 'streamed');
  assert.equal(content, whole.choices[0].message.content);
});

test('/v1/completions takes response_format too', async () => {
  const r = await client.completions.create({
    model, prompt: 'A person:', seed: 5, temperature: 1, max_tokens: 1000, response_format: responseFormat('lists'),
  });
  checkAnswer('lists', r.choices[0].text, r.choices[0].finish_reason, 'completions');
});

// A free object's strings are unbounded, and the random-weight model seldom draws a token that
// closes one (runs without help wrote 1,000 tokens of one string): a logit_bias toward '"' and
// '}' lets its answers end, while the grammar still decides which tokens may come.
async function tokenId(text) {
  const response = await fetch(`${baseURL}/tokenize`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ content: text, add_special: false }),
  });
  const { tokens } = await response.json();
  assert.equal(tokens.length, 1, `'${text}' is one token`);
  return tokens[0];
}

test('json_object: every answer is a JSON object', async () => {
  const logit_bias = { [await tokenId('"')]: 6, [await tokenId('}')]: 6 };
  const runs = [{ seed: 1, temperature: 0 }, { seed: 2, temperature: 0.7 }, { seed: 3, temperature: 1 },
    { seed: 4, temperature: 1.3 }];
  const answers = await Promise.all(runs.map(({ seed, temperature }) => client.chat.completions.create({
    model, messages, seed, temperature, logit_bias, max_tokens: 1500, response_format: { type: 'json_object' },
  })));
  for (const r of answers) {
    const content = r.choices[0].message.content;
    assert.equal(r.choices[0].finish_reason, 'stop', content);
    const value = JSON.parse(content);
    assert.equal(typeOf(value), 'object', content);
  }
});

test('schemas the grammar cannot enforce are refused with a 400 naming what', async () => {
  const refusals = [
    [{ type: 'string', pattern: '^a+$' }, /the keyword 'pattern' is not supported/],
    [{ type: 'object', properties: { n: { type: 'integer', minimum: 3 } } }, /\/properties\/n: the keyword 'minimum'/],
    [{ type: 'string', format: 'hostname' }, /format "hostname" is not supported/],
    [{ type: 'object', properties: { a: {} }, required: ['b'] }, /'required' names "b"/],
    [{ type: 'object', additionalProperties: true }, /strict mode requires additionalProperties false/],
  ];
  for (const [schema, message] of refusals) {
    await assert.rejects(
      client.chat.completions.create({
        model, messages, max_tokens: 8, response_format: { type: 'json_schema', json_schema: { name: 'x', schema, strict: true } },
      }),
      (e) => e.status === 400 && message.test(e.message) && e.param === 'response_format.json_schema.schema',
      JSON.stringify(schema));
  }
  await assert.rejects(
    client.chat.completions.create({ model, messages, max_tokens: 8, response_format: { type: 'yaml' } }),
    (e) => e.status === 400 && e.param === 'response_format.type');
});
