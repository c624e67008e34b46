// End-to-end check of kvgate with the official `openai` npm client: two simulated vLLM
// workers (bin/vllm-sim) behind bin/kvgate, all on loopback; stream, non-stream, completions,
// models, error handling, a worker dying mid-stream, Responses (pinned follow-ups) and embeddings. Run by `make test` after `make build`;
// scripts/setup.sh installs the client into scripts/node_modules.
//
//   node scripts/e2e-openai.mjs        (env BIN=dir of the binaries, default ./bin)
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const bin = process.env.BIN ? path.resolve(process.env.BIN) : path.join(root, 'bin');
const MODEL = 'e2e-model';
const procs = [];

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

function start(name, args) {
  const p = spawn(path.join(bin, name), args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  p.stderr.on('data', (d) => { log = (log + d).slice(-4000); });
  p.on('exit', (code, sig) => { if (!p.stopping) console.error(`# ${name} exited (${code ?? sig}):\n${log}`); });
  procs.push(p);
  return p;
}

async function waitHealthy(url, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const r = await fetch(url + '/health');
      if (r.ok) return;
    } catch { /* not up yet */ }
    if (Date.now() > deadline) throw new Error(`${url} not healthy after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function startSim(extra = []) {
  const port = await freePort();
  start('vllm-sim', ['--host', '127.0.0.1', '--port', String(port), '--served-model-name', MODEL,
    '--ttft', '2ms', '--itl', '2ms', '--log-level', 'warn', ...extra]);
  const url = `http://127.0.0.1:${port}`;
  await waitHealthy(url);
  return url;
}

async function startGateway(workers) {
  const port = await freePort();
  // The checks read X-Kvgate-Worker, which kvgate sends only when asked to.
  const args = ['serve', '--model', MODEL, '--listen', `127.0.0.1:${port}`, '--health-interval', '500ms', '--log-level', 'warn',
    '--proxy-expose-routing-headers'];
  for (const w of workers) args.push('--worker', w);
  start('kvgate', args);
  const url = `http://127.0.0.1:${port}`;
  await waitHealthy(url);
  return url;
}

let client, workers, dyingClient;

before(async () => {
  workers = [await startSim(), await startSim()];
  client = new OpenAI({ baseURL: (await startGateway(workers)) + '/v1', apiKey: 'unused', maxRetries: 0 });
  const dying = await startSim(['--die-mid-stream-after', '3']);
  dyingClient = new OpenAI({ baseURL: (await startGateway([dying])) + '/v1', apiKey: 'unused', maxRetries: 0 });
});

after(() => {
  for (const p of procs) { p.stopping = true; p.kill('SIGTERM'); }
});

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

test('models come from the workers', async () => {
  const list = await client.models.list();
  const ids = list.data.map((m) => m.id);
  assert.deepEqual(ids, [MODEL]);
});

test('round robin spreads requests over both workers', async () => {
  const seen = new Set();
  for (let i = 0; i < 4; i++) {
    const { response } = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 1 }).withResponse();
    seen.add(response.headers.get('x-kvgate-worker'));
  }
  assert.equal(seen.size, 2);
});

test('errors: unknown model 404, empty messages 400, malformed JSON 400', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, `got ${e?.constructor?.name}`);
    assert.equal(e.status, 404);
    assert.match(e.message, /The model `no-such-model` does not exist/);
    assert.equal(e.error?.type ?? e.type, 'NotFoundError');
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

test('responses: non-stream, stream, and a previous_response_id follow-up on the same worker', async () => {
  const { data: r1, response } = await client.responses.create({
    model: MODEL, instructions: 'Be brief.', input: 'Hello from the Responses API', max_output_tokens: 4,
  }).withResponse();
  assert.equal(r1.object, 'response');
  assert.equal(r1.status, 'completed');
  assert.ok(r1.output_text.length > 0);
  const w1 = response.headers.get('x-kvgate-worker');
  assert.ok(workers.includes(w1));

  const stream = await client.responses.create({
    model: MODEL, input: 'and more', previous_response_id: r1.id, max_output_tokens: 4, stream: true,
  });
  const types = [];
  let id = '';
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.created') id = ev.response.id;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types.at(-1), 'response.completed');
  assert.ok(types.includes('response.output_text.delta'));

  // Round robin would move the next turn; the pin keeps the chain on the worker storing it.
  for (let i = 0; i < 2; i++) {
    const { data, response: resp } = await client.responses.create({
      model: MODEL, input: 'again', previous_response_id: id, max_output_tokens: 2,
    }).withResponse();
    assert.equal(resp.headers.get('x-kvgate-worker'), w1);
    id = data.id;
  }
  const got = await client.responses.retrieve(id);
  assert.equal(got.id, id);
  await assert.rejects(
    client.responses.create({ model: MODEL, input: 'x', previous_response_id: 'resp_unknown' }),
    (err) => err.status === 404 && /Response with id 'resp_unknown' not found/.test(err.message),
  );
});

test('embeddings pass through', async () => {
  const e = await client.embeddings.create({ model: MODEL, input: ['one two', 'three'] });
  assert.equal(e.data.length, 2);
  assert.ok(e.data[0].embedding.length > 0);
  assert.ok(e.usage.prompt_tokens > 0);
});
