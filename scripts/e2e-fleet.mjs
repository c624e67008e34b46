// Shared fleet start-up of the npm e2e checks (scripts/e2e-openai.mjs, e2e-anthropic.mjs):
// simulated vLLM workers (bin/vllm-sim) and kvgate gateways (bin/kvgate) as child processes on
// loopback ports, stopped by stopAll; and the gateway's Prometheus metrics.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const bin = process.env.BIN ? path.resolve(process.env.BIN) : path.join(root, 'bin');
export const MODEL = 'e2e-model';
// With models/qwen3 present, workers and gateways tokenize with the real tokenizer.
export const tokenizer = path.join(root, 'models', 'qwen3');
export const haveTokenizer = fs.existsSync(path.join(tokenizer, 'tokenizer.json'));

const procs = [];

export function freePort() {
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

// start runs one binary of bin/; its stderr tail is printed if it exits unasked.
export function start(name, args) {
  const p = spawn(path.join(bin, name), args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  p.stderr.on('data', (d) => { log = (log + d).slice(-4000); });
  p.on('exit', (code, sig) => { if (!p.stopping) console.error(`# ${name} exited (${code ?? sig}):\n${log}`); });
  procs.push(p);
  return p;
}

// stop ends one process start returned.
export function stop(p) {
  p.stopping = true;
  p.kill('SIGTERM');
}

export function stopAll() {
  for (const p of procs) stop(p);
}

export async function waitHealthy(url, timeoutMs = 20000) {
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

// startSim starts one simulated worker (the real tokenizer when tokenize and haveTokenizer) and
// returns { url, proc } once it is healthy.
export async function startSim({ extra = [], tokenize = true } = {}) {
  const port = await freePort();
  const tok = tokenize && haveTokenizer ? ['--model', tokenizer] : [];
  const proc = start('vllm-sim', ['--host', '127.0.0.1', '--port', String(port), '--served-model-name', MODEL,
    '--ttft', '2ms', '--itl', '2ms', '--log-level', 'warn', ...tok, ...extra]);
  const url = `http://127.0.0.1:${port}`;
  await waitHealthy(url);
  return { url, proc };
}

// startSims starts n workers at once and returns their { url, proc } in order.
export function startSims(n, opts) {
  return Promise.all(Array.from({ length: n }, () => startSim(opts)));
}

// startGateway starts kvgate in front of the worker URLs and returns its base URL. kv: with the
// real tokenizer (when present) and policy kv, so that it counts prompt tokens like the
// workers; otherwise round robin without a tokenizer. X-Kvgate-Worker is exposed.
export async function startGateway(workers, { kv = false, extra = [] } = {}) {
  const port = await freePort();
  const args = ['serve', '--model', MODEL, '--listen', `127.0.0.1:${port}`, '--health-interval', '500ms',
    '--log-level', 'warn', '--proxy-expose-routing-headers'];
  if (kv && haveTokenizer) args.push('--tokenizer', tokenizer, '--router-policy', 'kv');
  for (const w of workers) args.push('--worker', w);
  start('kvgate', [...args, ...extra]);
  const url = `http://127.0.0.1:${port}`;
  await waitHealthy(url);
  return url;
}

// metricSum is the sum of a metric's series in the gateway's /metrics (0 when absent).
export async function metricSum(gatewayURL, name) {
  const text = await (await fetch(gatewayURL + '/metrics')).text();
  let sum = 0;
  for (const line of text.split('\n')) {
    if (line.startsWith(name + ' ') || line.startsWith(name + '{')) sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

// Usage feedback (router/dispatcher_feedback.go): every worker usage the gateway compared with
// its own prompt-token count, and those whose counts differed.
export const USAGE_METRICS = ['kvgate_router_usage_reports_total', 'kvgate_router_usage_without_cached_tokens_total'];
export const MISMATCH_METRIC = 'kvgate_router_prompt_token_mismatches_total';

// usageFeedback returns { reports, mismatches } of a gateway.
export async function usageFeedback(gatewayURL) {
  let reports = 0;
  for (const m of USAGE_METRICS) reports += await metricSum(gatewayURL, m);
  return { reports, mismatches: await metricSum(gatewayURL, MISMATCH_METRIC) };
}
