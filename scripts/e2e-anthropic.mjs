// End-to-end check of kvgate's Anthropic Messages endpoints with the official
// `@anthropic-ai/sdk` npm client: two simulated vLLM workers (bin/vllm-sim) behind bin/kvgate,
// all on loopback; messages.create, messages.stream, a tool loop with tool_result history and
// countTokens. With models/qwen3 present both sides tokenize with the real tokenizer (the
// gateway then answers countTokens itself, routes by KV and must count every prompt as the
// workers do: kvgate_router_prompt_token_mismatches_total 0 across the run). Fleet start-up is
// shared with e2e-openai.mjs (e2e-fleet.mjs). scripts/setup.sh installs the client.
//
//   node scripts/e2e-anthropic.mjs        (env BIN=dir of the binaries, default ./bin)
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { MODEL, haveTokenizer, startSims, startGateway, stopAll, usageFeedback } from './e2e-fleet.mjs';

let client, gateway, workers;

before(async () => {
  workers = (await startSims(2)).map((s) => s.url);
  gateway = await startGateway(workers, { kv: true });
  client = new Anthropic({ baseURL: gateway, apiKey: 'unused', maxRetries: 0 });
});

after(stopAll);

const system = 'You are a terse coding agent.';
const tools = [{
  name: 'read_file', description: 'Read a file',
  input_schema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
}];
const history = [
  { role: 'user', content: 'Show me /etc/hostname' },
  { role: 'assistant', content: [
    { type: 'text', text: 'Reading it.' },
    { type: 'tool_use', id: 'toolu_01', name: 'read_file', input: { path: '/etc/hostname' } }] },
  { role: 'user', content: [
    { type: 'tool_result', tool_use_id: 'toolu_01', content: [{ type: 'text', text: 'box-1' }] },
    { type: 'text', text: 'Summarize.' }] },
];

test('messages.create', async () => {
  const { data, response } = await client.messages.create({
    model: MODEL, max_tokens: 8, system, messages: [{ role: 'user', content: 'Hello from the Anthropic client' }],
  }).withResponse();
  assert.equal(data.type, 'message');
  assert.equal(data.role, 'assistant');
  assert.equal(data.content[0].type, 'text');
  assert.ok(data.content[0].text.length > 0);
  assert.equal(data.stop_reason, 'max_tokens');
  assert.equal(data.usage.output_tokens, 8);
  assert.ok(workers.includes(response.headers.get('x-kvgate-worker')), 'X-Kvgate-Worker names a worker');
});

test('messages.stream', async () => {
  const stream = client.messages.stream({
    model: MODEL, max_tokens: 6, system, messages: [{ role: 'user', content: 'Stream to me' }],
  });
  let text = '';
  stream.on('text', (t) => { text += t; });
  const msg = await stream.finalMessage();
  assert.ok(text.length > 0);
  assert.equal(msg.content[0].text, text);
  assert.equal(msg.usage.output_tokens, 6);
  assert.equal(msg.stop_reason, 'max_tokens');
});

test('tools with tool_result history, twice to the same worker', async () => {
  const req = { model: MODEL, max_tokens: 4, system, tools, messages: history };
  const first = await client.messages.create(req).withResponse();
  assert.equal(first.data.type, 'message');
  if (!haveTokenizer) return; // round robin: no prefix to follow
  // The KV event of the first answer reaches the gateway asynchronously.
  let w2;
  for (let i = 0; i < 50; i++) {
    const again = await client.messages.create(req).withResponse();
    w2 = again.response.headers.get('x-kvgate-worker');
    if (w2 === first.response.headers.get('x-kvgate-worker') && (again.data.usage.cache_read_input_tokens ?? 0) > 0) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail(`the repeated tool loop did not follow its cached prefix (last went to ${w2})`);
});

test('countTokens matches the worker', async () => {
  const req = { model: MODEL, system, tools, messages: history };
  const viaGateway = await client.messages.countTokens(req);
  assert.ok(viaGateway.input_tokens > 0);
  const direct = new Anthropic({ baseURL: workers[0], apiKey: 'unused', maxRetries: 0 });
  const fromWorker = await direct.messages.countTokens(req);
  assert.equal(viaGateway.input_tokens, fromWorker.input_tokens);
});

test('Claude Code with ANTHROPIC_API_KEY: x-api-key authenticates; errors and tools: [] as Anthropic clients expect', async () => {
  const keyed = await startGateway(workers, { kv: true, extra: ['--auth-api-keys', 'sk-e2e-key'] });
  const ok = new Anthropic({ baseURL: keyed, apiKey: 'sk-e2e-key', maxRetries: 0 }); // sent as x-api-key
  const msg = await ok.messages.create({ model: MODEL, max_tokens: 4, tools: [], messages: [{ role: 'user', content: 'title this' }] });
  assert.equal(msg.type, 'message');
  const counted = await ok.messages.countTokens({ model: MODEL, tools: [], messages: [{ role: 'user', content: 'title this' }] });
  assert.ok(counted.input_tokens > 0);
  const wrong = new Anthropic({ baseURL: keyed, apiKey: 'sk-wrong', maxRetries: 0 });
  await assert.rejects(
    wrong.messages.create({ model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
    (err) => err instanceof Anthropic.AuthenticationError && err.error?.type === 'error' && err.error?.error?.type === 'authentication_error',
  );
  await assert.rejects(
    ok.messages.create({ model: MODEL, max_tokens: 4, messages: [] }),
    (err) => err instanceof Anthropic.BadRequestError && err.error?.error?.type === 'invalid_request_error',
  );
});

test('errors are Anthropic-shaped', async () => {
  await assert.rejects(
    client.messages.create({ model: 'no-such-model', max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
    (err) => err.status === 404 && err.error?.type === 'error' && err.error?.error?.type === 'not_found_error',
  );
});

test('no prompt-token mismatch between the gateway and the workers', async () => {
  const { reports, mismatches } = await usageFeedback(gateway);
  if (haveTokenizer) assert.ok(reports >= 3, `the gateway compared only ${reports} worker usages`);
  assert.equal(mismatches, 0, `${mismatches} of ${reports} requests counted differently by the gateway`);
});
