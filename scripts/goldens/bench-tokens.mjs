// bench-tokens.mjs — encode throughput of HF tokenizers (Rust, via @anush008/tokenizers) on the
// golden corpus, to compare with `go test -bench EncodeCorpus ./tokenize/engine/`.
//
// Usage: taskset -c 1 env RAYON_NUM_THREADS=1 UV_THREADPOOL_SIZE=1 node scripts/goldens/bench-tokens.mjs [passes]
// Two figures per model: `encode` awaits one text at a time (per-call cost, like a gateway
// request), `encodeBatch` hands all texts over at once (HF's own loop, one rayon thread).
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@anush008/tokenizers";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const MODELS_DIR = process.env.MODELS_DIR || path.join(ROOT, "models");
const passes = Number(process.argv[2] || 2);
const texts = zlib
  .gunzipSync(fs.readFileSync(path.join(ROOT, "testdata/tokens/corpus.jsonl.gz")))
  .toString("utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l).t);
const bytes = texts.reduce((n, t) => n + Buffer.byteLength(t), 0);
const opts = { addSpecialTokens: false };

for (const m of ["qwen3", "llama3_1", "deepseek_v3", "gptoss", "gemma3"]) {
  const tk = Tokenizer.fromFile(path.join(MODELS_DIR, m, "tokenizer.json"));
  let tokens = 0;
  for (const t of texts) tokens += (await tk.encode(t, null, opts)).getLength(); // warm-up
  let t0 = process.hrtime.bigint();
  for (let p = 0; p < passes; p++) for (const t of texts) await tk.encode(t, null, opts);
  const seq = Number(process.hrtime.bigint() - t0) / 1e9 / passes;
  t0 = process.hrtime.bigint();
  for (let p = 0; p < passes; p++) await tk.encodeBatch(texts, opts);
  const batch = Number(process.hrtime.bigint() - t0) / 1e9 / passes;
  const fmt = (s) => `${(tokens / s / 1e6).toFixed(2)} Mtok/s ${(bytes / s / 1e6).toFixed(2)} MB/s (${(s * 1000).toFixed(0)} ms/pass)`;
  console.log(`${m.padEnd(12)} tokens=${tokens} encode: ${fmt(seq)} | encodeBatch: ${fmt(batch)}`);
}
