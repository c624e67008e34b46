// The time to first token a load-balancing front adds: PROBES streamed chat requests with the
// official openai client, alternating between a gateway reached directly and the front before
// it, each timed from the call to the first chunk carrying content. Prints one JSON line:
// {"probes", "direct_ms": {mean, p50, p90}, "front_ms": {...}, "added_ms": {mean, p50}}.
// A front that holds back small SSE writes (HAProxy without `option http-no-delay`) shows
// here as tens to hundreds of milliseconds added; a streaming front as a few.
//
//   node scripts/front-ttft.mjs DIRECT_URL FRONT_URL MODEL [PROBES]   (default 20 probes)
import OpenAI from 'openai';

const [direct, front, model, n = '20'] = process.argv.slice(2);
if (!direct || !front || !model) {
  console.error('usage: node scripts/front-ttft.mjs DIRECT_URL FRONT_URL MODEL [PROBES]');
  process.exit(2);
}
const probes = Number(n);
const clients = {
  direct: new OpenAI({ baseURL: direct + '/v1', apiKey: process.env.OPENAI_API_KEY || 'unused', maxRetries: 0 }),
  front: new OpenAI({ baseURL: front + '/v1', apiKey: process.env.OPENAI_API_KEY || 'unused', maxRetries: 0 }),
};

// ttft: one streamed request (a short fixed prompt, so the workers' prefill is the same every
// time; 16 tokens, so the stream is still open when the first one passes the front).
async function ttft(client) {
  const t0 = performance.now();
  const stream = await client.chat.completions.create({
    model, stream: true, max_tokens: 16,
    messages: [{ role: 'user', content: 'Say hello in a few words.' }],
  });
  let first = null;
  for await (const chunk of stream) {
    if (first === null && chunk.choices?.[0]?.delta?.content) first = performance.now() - t0;
  }
  if (first === null) throw new Error('the stream carried no content');
  return first;
}

const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const q = (p) => s[Math.min(s.length - 1, Math.floor(p * s.length))];
  const r = (x) => Math.round(x * 10) / 10;
  return { mean: r(s.reduce((a, b) => a + b, 0) / s.length), p50: r(q(0.5)), p90: r(q(0.9)) };
};

const got = { direct: [], front: [] };
await ttft(clients.direct); // warm both paths' connections and the workers' prefix cache
await ttft(clients.front);
for (let i = 0; i < probes; i++) {
  // Alternate which goes first, so neither path always follows the other.
  const order = i % 2 ? ['front', 'direct'] : ['direct', 'front'];
  for (const k of order) got[k].push(await ttft(clients[k]));
}
const d = stats(got.direct);
const f = stats(got.front);
console.log(JSON.stringify({
  probes, direct_ms: d, front_ms: f,
  added_ms: { mean: Math.round((f.mean - d.mean) * 10) / 10, p50: Math.round((f.p50 - d.p50) * 10) / 10 },
}));
