// reasoning_content through the official `openai` package against a real `mqlm serve --http` of
// the tiny model (random weights) with a chat template whose generation prompt opens <think>
// (DeepSeek-R1's, from llama.cpp's collection): random weights never close the block, so all the
// output is reasoning and the content is empty; streamed deltas join into what is not streamed.
// Run by openai_client_test.sh with --chat-template.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.MQLM_HTTP_URL;
const apiKey = process.env.MQLM_API_KEY;
const model = process.env.MQLM_MODEL;
assert.ok(baseURL && apiKey && model, 'MQLM_HTTP_URL, MQLM_API_KEY and MQLM_MODEL must be set');
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 300_000 });
const messages = [{ role: 'user', content: 'How many legs has a spider?' }];

for (const temperature of [0, 0.9]) {
  test(`temperature ${temperature}: everything is reasoning_content, streamed and not the same`, async () => {
    const request = { model, messages, seed: 9, temperature, max_tokens: 40 };
    const plain = await client.chat.completions.create(request);
    const message = plain.choices[0].message;
    assert.equal(typeof message.reasoning_content, 'string', JSON.stringify(message));
    assert.ok(message.reasoning_content.length > 0);
    assert.equal(message.content, '');
    assert.ok(['stop', 'length'].includes(plain.choices[0].finish_reason));

    const stream = await client.chat.completions.create({ ...request, stream: true });
    let reasoning = '', content = '', finish = null;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        reasoning += c.delta?.reasoning_content ?? '';
        content += c.delta?.content ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(reasoning, message.reasoning_content);
    assert.equal(content, '');
    assert.equal(finish, plain.choices[0].finish_reason);
  });
}
