// End-to-end check of kvgate with the official `openai` npm client: three simulated vLLM
// workers (bin/vllm-sim) behind bin/kvgate, all on loopback; stream, non-stream, completions,
// models (list and retrieve), error handling, a worker dying mid-stream, embeddings, Responses
// (previous_response_id follow-ups pinned to the worker storing each chain, vLLM's 404 once
// that worker is gone) and, with models/qwen3 present, a KV-routing gateway whose prompt-token
// counts must equal the workers' across the run (kvgate_router_prompt_token_mismatches_total
// 0). Run by `make test` after `make build`; scripts/setup.sh installs the client into
// scripts/node_modules.
//
//   node scripts/e2e-openai.mjs        (env BIN=dir of the binaries, default ./bin)
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { MODEL, haveTokenizer, startSim, startSims, startGateway, stop, stopAll, usageFeedback } from './e2e-fleet.mjs';

let client, gateway, sims, workers, dyingClient, kvClient, kvGateway;

before(async () => {
  const [fleet, dying] = await Promise.all([startSims(3), startSim({ extra: ['--die-mid-stream-after', '3'], tokenize: false })]);
  sims = fleet;
  workers = sims.map((s) => s.url);
  const [rr, dyingGW, kv] = await Promise.all([startGateway(workers), startGateway([dying.url]),
    haveTokenizer ? startGateway(workers, { kv: true }) : null]);
  gateway = rr;
  client = new OpenAI({ baseURL: rr + '/v1', apiKey: 'unused', maxRetries: 0 });
  dyingClient = new OpenAI({ baseURL: dyingGW + '/v1', apiKey: 'unused', maxRetries: 0 });
  if (kv) {
    kvGateway = kv;
    kvClient = new OpenAI({ baseURL: kv + '/v1', apiKey: 'unused', maxRetries: 0 });
  }
});

after(stopAll);

const messages = [{ role: 'user', content: 'Hello from the openai npm client' }];

test('chat, non-stream', async () => {
  const { data, response } = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8 }).withResponse();
  assert.equal(data.object, 'chat.completion');
  assert.equal(data.model, MODEL);
  assert.ok(data.choices[0].message.content.length > 0);
  assert.equal(data.usage.completion_tokens, 8);
  assert.ok(workers.includes(response.headers.get('x-kvgate-worker')), 'X-Kvgate-Worker names a worker');
});

test('chat, stream with usage', async () => {
  const stream = await client.chat.completions.create({
    model: MODEL, messages, max_tokens: 6, stream: true, stream_options: { include_usage: true },
  });
  let text = '', chunks = 0, usage = null;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.choices.length) text += chunk.choices[0].delta.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(chunks >= 6, `only ${chunks} chunks`);
  assert.ok(text.length > 0);
  assert.equal(usage?.completion_tokens, 6);
});

test('completions, non-stream and stream', async () => {
  const c = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 5 });
  assert.equal(c.object, 'text_completion');
  assert.ok(c.choices[0].text.length > 0);
  const s = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 4, stream: true });
  let text = '';
  for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
  assert.ok(text.length > 0);
});

test('models come from the workers: list and retrieve', async () => {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  assert.deepEqual(ids, [MODEL]);
  const card = await client.models.retrieve(MODEL);
  assert.equal(card.id, MODEL);
  assert.equal(card.object, 'model');
  await assert.rejects(client.models.retrieve('no-such-model'), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, `got ${e?.constructor?.name}`);
    assert.match(e.message, /The model `no-such-model` does not exist/);
    return true;
  });
});

test('round robin spreads requests over the three workers', async () => {
  const seen = new Set();
  for (let i = 0; i < 6; i++) {
    const { response } = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 1 }).withResponse();
    seen.add(response.headers.get('x-kvgate-worker'));
  }
  assert.equal(seen.size, 3);
});

test('errors: unknown model 404, empty messages 400, malformed JSON 400', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, `got ${e?.constructor?.name}`);
    assert.equal(e.status, 404);
    assert.match(e.message, /The model `no-such-model` does not exist/);
    // OpenAI's own answer for an unknown model (issue 30's model_not_found), not vLLM's NotFoundError.
    assert.equal(e.error?.type ?? e.type, 'invalid_request_error');
    assert.equal(e.code, 'model_not_found');
    assert.equal(e.param, 'model');
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [] }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.param, 'messages');
    return true;
  });
  const r = await fetch(client.baseURL + '/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model":',
  });
  assert.equal(r.status, 400);
  const body = await r.json();
  assert.equal(body.error.type, 'BadRequestError');
  assert.equal(body.error.code, 400);
});

test('a worker dying mid-stream surfaces as an error, not a hang', async () => {
  const stream = await dyingClient.chat.completions.create({ model: MODEL, messages, max_tokens: 50, stream: true });
  let chunks = 0;
  await assert.rejects(async () => {
    for await (const _ of stream) chunks++;
  }, (e) => {
    assert.ok(e instanceof OpenAI.APIError, `got ${e}`);
    assert.match(e.message, /stream|worker/);
    return true;
  });
  assert.ok(chunks >= 3, `only ${chunks} chunks before the error`);
});

test('embeddings pass through', async () => {
  const e = await client.embeddings.create({ model: MODEL, input: ['one two', 'three'] });
  assert.equal(e.data.length, 2);
  assert.ok(e.data[0].embedding.length > 0);
  assert.ok(e.usage.prompt_tokens > 0);
});

test('the KV-routing gateway tokenizes chat, completions and Responses as the workers do', { skip: !haveTokenizer && 'needs models/qwen3' }, async () => {
  const c = await kvClient.chat.completions.create({ model: MODEL, messages: [{ role: 'system', content: 'Be brief.' }, ...messages], max_tokens: 4 });
  assert.ok(c.usage.prompt_tokens > 0);
  const s = await kvClient.chat.completions.create({ model: MODEL, messages, max_tokens: 3, stream: true, stream_options: { include_usage: true } });
  for await (const _ of s) { /* drain */ }
  await kvClient.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 3 });
  const input = [
    { role: 'user', content: 'Weather in Paris?' },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
    { type: 'function_call_output', call_id: 'call_1', output: 'Sunny' },
  ];
  const r = await kvClient.responses.create({ model: MODEL, instructions: 'Be brief.', input, max_output_tokens: 3, store: false });
  assert.equal(r.status, 'completed');
  const rs = await kvClient.responses.create({ model: MODEL, input: 'Hello again', max_output_tokens: 3, store: false, stream: true });
  for await (const _ of rs) { /* drain */ }
});

test('responses: follow-ups over three workers each reach the worker storing their chain', async () => {
  // Round robin puts three consecutive first turns on the three workers.
  const chains = [];
  for (let i = 0; i < 3; i++) {
    const { data, response } = await client.responses.create({
      model: MODEL, instructions: 'Be brief.', input: `Chain ${i} starts here`, max_output_tokens: 4,
    }).withResponse();
    assert.equal(data.object, 'response');
    assert.equal(data.status, 'completed');
    assert.ok(data.output_text.length > 0);
    chains.push({ id: data.id, worker: response.headers.get('x-kvgate-worker') });
  }
  assert.deepEqual(new Set(chains.map((c) => c.worker)), new Set(workers), 'one chain per worker');

  // Interleaved follow-ups: round robin alone would move each of them.
  for (let round = 0; round < 2; round++) {
    for (const chain of chains) {
      const { data, response } = await client.responses.create({
        model: MODEL, input: `turn ${round + 2}`, previous_response_id: chain.id, max_output_tokens: 2,
      }).withResponse();
      assert.equal(response.headers.get('x-kvgate-worker'), chain.worker);
      chain.id = data.id;
    }
  }
  // A streamed follow-up: the new id comes from response.created and is pinned too.
  const stream = await client.responses.create({
    model: MODEL, input: 'and more', previous_response_id: chains[1].id, max_output_tokens: 3, stream: true,
  });
  const types = [];
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.created') chains[1].id = ev.response.id;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types.at(-1), 'response.completed');
  assert.ok(types.includes('response.output_text.delta'));
  const { data: again, response: resp } = await client.responses.create({
    model: MODEL, input: 'after the stream', previous_response_id: chains[1].id, max_output_tokens: 2,
  }).withResponse();
  assert.equal(resp.headers.get('x-kvgate-worker'), chains[1].worker);
  chains[1].id = again.id;
  const got = await client.responses.retrieve(chains[2].id);
  assert.equal(got.id, chains[2].id);

  const notFound = (id) => (err) => err.status === 404 && err.message.includes(`Response with id '${id}' not found`);
  await assert.rejects(
    client.responses.create({ model: MODEL, input: 'x', previous_response_id: 'resp_unknown' }), notFound('resp_unknown'));

  // The worker storing chain 0 goes away: once the gateway has ejected it, the follow-up is
  // vLLM's 404 (no other worker holds that response), and the other chains carry on.
  stop(sims[workers.indexOf(chains[0].worker)].proc);
  let last;
  for (let i = 0; i < 100; i++) {
    try {
      await client.responses.create({ model: MODEL, input: 'x', previous_response_id: chains[0].id, max_output_tokens: 1 });
      last = 'answered';
    } catch (err) {
      last = err;
      if (notFound(chains[0].id)(err)) break;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(notFound(chains[0].id)(last), `follow-up to the removed worker's response: ${last}`);
  const { response: still } = await client.responses.create({
    model: MODEL, input: 'still here', previous_response_id: chains[2].id, max_output_tokens: 1,
  }).withResponse();
  assert.equal(still.headers.get('x-kvgate-worker'), chains[2].worker);
});

test('no prompt-token mismatch between the gateways and the workers', async () => {
  const rr = await usageFeedback(gateway);
  assert.equal(rr.mismatches, 0);
  if (!kvGateway) return;
  const kv = await usageFeedback(kvGateway);
  assert.ok(kv.reports >= 5, `the KV gateway compared only ${kv.reports} worker usages`);
  assert.equal(kv.mismatches, 0, `${kv.mismatches} of ${kv.reports} requests counted differently by the gateway`);
});
