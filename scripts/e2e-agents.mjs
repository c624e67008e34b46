// End-to-end check of kvgate with two real coding agents, unmodified, from npm (pinned in
// scripts/package.json): Claude Code (`claude -p`, then `claude -p --continue`) over the
// Anthropic Messages API and Codex (`codex exec`, then `codex exec resume --last`) over the
// OpenAI Responses API (a provider with wire_api = "responses"), against kvgate over two
// simulated vLLM workers. A recording proxy between the agents and kvgate notes every request's
// method, path, status and the routing headers kvgate exposes (X-Kvgate-Worker,
// X-Kvgate-Cached-Blocks). Asserted: every request is 2xx; each agent's second turn goes to
// its first turn's worker and finds cached blocks there; kvgate counted every prompt as the
// workers did (kvgate_router_prompt_token_mismatches_total 0, Responses with tools included).
// Each agent runs in temporary HOME/CODEX_HOME and working folders, with its telemetry and
// update checks off, under a time limit; its whole process group is killed if it overruns.
//
//   node scripts/e2e-agents.mjs        (env BIN=dir of the binaries, default ./bin)
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { MODEL, root, haveTokenizer, startSims, startGateway, stopAll, usageFeedback } from './e2e-fleet.mjs';

const nodeBin = path.join(root, 'scripts', 'node_modules', '.bin');
const RUN_LIMIT_MS = 60000; // one agent invocation; a healthy one takes seconds

let gateway, proxyURL, proxy, workers, tmp;
// Every request the agents made, in order: { agent, turn, method, path, status, worker, cached }.
const seen = [];
let current = { agent: '', turn: 0 };

// recordingProxy forwards each request to target unchanged and records its answer's status
// and routing headers.
function recordingProxy(target) {
  const srv = http.createServer((req, res) => {
    const tag = { ...current };
    const up = http.request(target + req.url, { method: req.method, headers: { ...req.headers, host: new URL(target).host } }, (r) => {
      // Recorded as the answer starts (status and routing headers are known then): an agent
      // may exit as soon as it has read its last event, before the stream's end reaches here.
      seen.push({ ...tag, method: req.method, path: req.url.split('?')[0], status: r.statusCode,
        worker: r.headers['x-kvgate-worker'], cached: Number(r.headers['x-kvgate-cached-blocks'] ?? 0) });
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
    });
    up.on('error', (e) => {
      seen.push({ ...tag, method: req.method, path: req.url.split('?')[0], status: 502, error: String(e) });
      res.writeHead(502);
      res.end();
    });
    req.pipe(up);
  });
  return new Promise((resolve) => srv.listen(0, '127.0.0.1', () => resolve(srv)));
}

before(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kvgate-agents-'));
  // Claude Code asks for up to 32000 output tokens on an ~19k-token prompt: the workers get
  // room for it, as a real deployment of a long-context model would.
  workers = (await startSims(2, { extra: ['--max-model-len', '65536', '--num-gpu-blocks', '8192', '--output-len', '24'] })).map((s) => s.url);
  gateway = await startGateway(workers, { kv: true });
  proxy = await recordingProxy(gateway);
  proxyURL = `http://127.0.0.1:${proxy.address().port}`;
});

after(() => {
  proxy?.close();
  stopAll();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

// run starts one agent command in its own process group and resolves with its exit code and
// output; past RUN_LIMIT_MS the whole group is killed.
function run(agent, turn, cmd, args, { cwd, env }) {
  current = { agent, turn };
  return new Promise((resolve) => {
    const p = spawn(path.join(nodeBin, cmd), args, { cwd, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err = (err + d).slice(-4000); });
    const timer = setTimeout(() => {
      try { process.kill(-p.pid, 'SIGKILL'); } catch { /* already gone */ }
    }, RUN_LIMIT_MS);
    p.on('close', (code, signal) => {
      clearTimeout(timer);
      // Whatever the agent left running in its group goes with it.
      try { process.kill(-p.pid, 'SIGKILL'); } catch { /* none left */ }
      resolve({ code, signal, out, err });
    });
  });
}

// baseEnv is a clean environment: PATH, a temporary HOME, no proxy or credentials inherited.
function baseEnv(home) {
  return { PATH: process.env.PATH, HOME: home, TMPDIR: tmp, LANG: 'C.UTF-8', NO_COLOR: '1', TERM: 'dumb' };
}

function dir(name) {
  const d = path.join(tmp, name);
  fs.mkdirSync(d, { recursive: true });
  return d;
}

// turns returns the agent's requests to path by turn.
function byTurn(agent, p) {
  const t = {};
  for (const r of seen) if (r.agent === agent && r.path === p) (t[r.turn] ??= []).push(r);
  return t;
}

// assertSecondTurnCached: the last request of turn 1 and the first of turn 2 on path (the
// conversation's own requests: turn 2's prompt extends turn 1's) go to the same worker, and
// turn 2 finds cached blocks there.
function assertSecondTurnCached(agent, p) {
  const t = byTurn(agent, p);
  assert.ok(t[1]?.length && t[2]?.length, `${agent}: no ${p} request in each turn: ${JSON.stringify(seen)}`);
  const first = t[1].at(-1);
  const second = t[2][0];
  if (!haveTokenizer) return; // round robin without a tokenizer: no cache to follow
  assert.equal(second.worker, first.worker, `${agent}: turn 2 went to ${second.worker}, turn 1 to ${first.worker}`);
  assert.ok(second.cached > 0, `${agent}: turn 2 found no cached blocks on ${second.worker}`);
}

function assertAll2xx(agent) {
  const mine = seen.filter((r) => r.agent === agent);
  assert.ok(mine.length > 0, `${agent} made no request`);
  const bad = mine.filter((r) => r.status < 200 || r.status > 299);
  assert.deepEqual(bad, [], `${agent}: requests answered with errors`);
}

test('Claude Code: -p, then --continue', async () => {
  const home = dir('claude-home');
  const cwd = dir('claude-work');
  const env = {
    ...baseEnv(home),
    ANTHROPIC_BASE_URL: proxyURL,
    ANTHROPIC_API_KEY: 'sk-kvgate-e2e',
    ANTHROPIC_MODEL: MODEL,
    ANTHROPIC_SMALL_FAST_MODEL: MODEL,
    CLAUDE_CODE_MAX_OUTPUT_TOKENS: '512',
    DISABLE_TELEMETRY: '1',
    DISABLE_ERROR_REPORTING: '1',
    DISABLE_AUTOUPDATER: '1',
    DISABLE_BUG_COMMAND: '1',
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
  };
  const one = await run('claude', 1, 'claude', ['-p', 'Say hello in one short sentence.'], { cwd, env });
  assert.equal(one.code, 0, `claude -p exited ${one.code ?? one.signal}: ${one.err}`);
  assert.ok(one.out.trim().length > 0, 'claude -p printed nothing');
  const two = await run('claude', 2, 'claude', ['-p', '--continue', 'Now say it again.'], { cwd, env });
  assert.equal(two.code, 0, `claude -p --continue exited ${two.code ?? two.signal}: ${two.err}`);
  assert.ok(two.out.trim().length > 0, 'claude -p --continue printed nothing');
  assertAll2xx('claude');
  assertSecondTurnCached('claude', '/v1/messages');
});

test('Codex: exec, then exec resume --last (wire_api = "responses")', async () => {
  const home = dir('codex-home');
  const cwd = dir('codex-work');
  fs.writeFileSync(path.join(home, 'config.toml'), [
    `model = "${MODEL}"`,
    'model_provider = "kvgate"',
    'check_for_update_on_startup = false',
    '',
    '[model_providers.kvgate]',
    'name = "kvgate"',
    `base_url = "${proxyURL}/v1"`,
    'wire_api = "responses"',
    'env_key = "KVGATE_API_KEY"',
    '',
  ].join('\n'));
  const env = { ...baseEnv(home), CODEX_HOME: home, KVGATE_API_KEY: 'sk-kvgate-e2e' };
  const common = ['exec', '--skip-git-repo-check', '--sandbox', 'read-only'];
  const one = await run('codex', 1, 'codex', [...common, 'Say hello in one short sentence.'], { cwd, env });
  assert.equal(one.code, 0, `codex exec exited ${one.code ?? one.signal}: ${one.err}`);
  assert.ok(one.out.trim().length > 0, 'codex exec printed nothing');
  const two = await run('codex', 2, 'codex', [...common, 'resume', '--last', 'Now say it again.'], { cwd, env });
  assert.equal(two.code, 0, `codex exec resume exited ${two.code ?? two.signal}: ${two.err}`);
  assert.ok(two.out.trim().length > 0, 'codex exec resume printed nothing');
  assertAll2xx('codex');
  assertSecondTurnCached('codex', '/v1/responses');
});

test('no prompt-token mismatch between the gateway and the workers', async () => {
  const { reports, mismatches } = await usageFeedback(gateway);
  if (haveTokenizer) assert.ok(reports >= 4, `the gateway compared only ${reports} worker usages`);
  assert.equal(mismatches, 0, `${mismatches} of ${reports} requests counted differently by the gateway`);
});
