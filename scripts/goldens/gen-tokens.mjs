// gen-tokens.mjs — token-id goldens from the real HF tokenizers (Rust, through the npm binding
// @anush008/tokenizers) for every model in models/.
//
// Usage: (cd scripts/goldens && npm ci) && node scripts/goldens/gen-tokens.mjs [model ...]
// Writes testdata/tokens/corpus.jsonl.gz (one {"t": text, "s": add_special?} per line) and
// testdata/tokens/<model>.jsonl.gz (line i: {"i", "ids", "ids_s" when s, "dec" when HF's decode
// differs from the text, "dec_skip" when s}); and for each entry of testdata/tokens/variants.json
// (tokenizer.json variants exercising the components the five models do not use)
// testdata/tokens/variant-<name>.jsonl.gz over every fourth text, with special tokens on.
// Deterministic: same machine, same output bytes.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import zlib from "node:zlib";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@anush008/tokenizers";
import { buildCorpus } from "./corpus.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const MODELS_DIR = process.env.MODELS_DIR || path.join(ROOT, "models");
const OUT = path.join(ROOT, "testdata/tokens");
const ALL = ["qwen3", "llama3_1", "deepseek_v3", "gptoss", "gemma3"];
const models = process.argv.slice(2).length ? process.argv.slice(2) : ALL;
const VARIANTS = JSON.parse(fs.readFileSync(path.join(OUT, "variants.json"), "utf8")).variants;

function specialsOf(model) {
  const j = JSON.parse(fs.readFileSync(path.join(MODELS_DIR, model, "tokenizer.json"), "utf8"));
  return j.added_tokens.map((a) => a.content);
}

// The corpus uses special tokens of all five models, so each model also sees other models'
// specials as plain text. A sample keeps the list short (Gemma 3 has thousands).
const specials = [];
for (const m of ALL) {
  const all = specialsOf(m);
  specials.push(...all.slice(0, 12), ...all.filter((_, i) => i % 500 === 7));
}
const corpus = buildCorpus(specials);

fs.mkdirSync(OUT, { recursive: true });
const gz = (lines) => zlib.gzipSync(Buffer.from(lines.join("\n") + "\n"), { level: 9 });
fs.writeFileSync(path.join(OUT, "corpus.jsonl.gz"), gz(corpus.map((c) => JSON.stringify({ t: c.t, s: c.special }))));
console.log(`corpus: ${corpus.length} texts, ${corpus.reduce((n, c) => n + c.t.length, 0)} UTF-16 units`);

// buildVariant applies a variants.json entry to its base tokenizer.json (same rules as the Go test).
function buildVariant(v) {
  const j = JSON.parse(fs.readFileSync(path.join(MODELS_DIR, v.base, "tokenizer.json"), "utf8"));
  Object.assign(j, v.replace || {});
  for (const patch of v.added_tokens || []) {
    const at = j.added_tokens.find((a) => a.content === patch.content);
    if (at) Object.assign(at, patch);
    else j.added_tokens.push(patch);
  }
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "kvgate-variant-")), "tokenizer.json");
  fs.writeFileSync(file, JSON.stringify(j));
  return file;
}

// goldens encodes texts (with their corpus indexes) and writes one JSONL line per text.
async function goldens(tk, items, outName) {
  const lines = [];
  let tokens = 0;
  for (const { c, i } of items) {
    const ids = (await tk.encode(c.t, null, { addSpecialTokens: false })).getIds();
    tokens += ids.length;
    const rec = { i, ids };
    const dec = await tk.decode(ids, false);
    if (dec !== c.t) rec.dec = dec;
    if (c.special) {
      const idsS = (await tk.encode(c.t, null, { addSpecialTokens: true })).getIds();
      rec.ids_s = idsS;
      rec.dec_skip = await tk.decode(idsS, true);
    }
    lines.push(JSON.stringify(rec));
  }
  fs.writeFileSync(path.join(OUT, outName), gz(lines));
  console.log(`${outName}: ${items.length} texts, ${tokens} tokens`);
}

const all = corpus.map((c, i) => ({ c, i }));
for (const m of models) {
  await goldens(Tokenizer.fromFile(path.join(MODELS_DIR, m, "tokenizer.json")), all, `${m}.jsonl.gz`);
}
if (process.argv.slice(2).length === 0) {
  const subset = all.filter(({ i }) => i % 4 === 1);
  for (const v of VARIANTS) {
    const file = buildVariant(v);
    await goldens(Tokenizer.fromFile(file), subset.map(({ c, i }) => ({ c: { ...c, special: true }, i })), `variant-${v.name}.jsonl.gz`);
    fs.rmSync(path.dirname(file), { recursive: true });
  }
}
