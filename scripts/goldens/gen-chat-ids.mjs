#!/usr/bin/env node
// gen-chat-ids.mjs — token-id goldens for the chat prompts in testdata/chat/<name>.jsonl.
//
// Encodes every golden prompt (rendered by gen-chat.py) with the real HF tokenizers library
// (Rust, through @anush008/tokenizers) and the model's tokenizer.json, with add_special_tokens
// as vLLM's chat path uses it (the request's add_special_tokens, default false). Writes
// testdata/chat/<name>.ids.jsonl: one {"i", "n", "sha256", "head"} per rendered prompt, where
// sha256 is over the ids as u32 little-endian and head holds the first 32 ids (for diagnostics).
//
// Usage: node scripts/goldens/gen-chat-ids.mjs   (after npm ci in scripts/goldens)
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync, readdirSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer } from "@anush008/tokenizers";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const dir = join(root, "testdata", "chat");

for (const file of readdirSync(dir).filter((f) => f.endsWith(".jsonl") && !f.endsWith(".ids.jsonl"))) {
  const lines = readFileSync(join(dir, file), "utf8").split("\n").filter((l) => l.length > 0);
  const header = JSON.parse(lines[0]);
  const tok = Tokenizer.fromFile(join(root, "models", header.model_dir, "tokenizer.json"));
  const out = [];
  for (let i = 1; i < lines.length; i++) {
    const rec = JSON.parse(lines[i]);
    if (typeof rec.prompt !== "string") continue;
    const add = rec.request.add_special_tokens === true;
    const enc = await tok.encode(rec.prompt, null, { addSpecialTokens: add });
    const ids = enc.getIds();
    const buf = Buffer.alloc(ids.length * 4);
    ids.forEach((id, k) => buf.writeUInt32LE(id, k * 4));
    out.push(JSON.stringify({ i: i - 1, n: ids.length, sha256: createHash("sha256").update(buf).digest("hex"), head: ids.slice(0, 32) }));
  }
  writeFileSync(join(dir, file.replace(/\.jsonl$/, ".ids.jsonl")), out.join("\n") + "\n");
  console.error(`${file}: ${out.length} token-id goldens`);
}
