// corpus.mjs — the deterministic text corpus for the token goldens.
//
// Texts come from files on the machine (licenses and docs for prose; Go, Python, C, JS, Rust
// sources for code) and from seeded synthetic generators for the hard cases: whitespace runs,
// CRLF, numbers, contractions, scripts, emoji/ZWJ, combining marks, odd code points, special
// tokens inside text, empty and one-character strings, and a few 100k-character documents.
// Same machine + same seed => same corpus.
import fs from "node:fs";
import path from "node:path";

// mulberry32: small seeded PRNG so the corpus is reproducible.
export function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (n) => Math.floor(next() * n),
    pick: (arr) => arr[Math.floor(next() * arr.length)],
  };
}

function walk(dir, exts, out, limit) {
  let entries;
  try {
    entries = fs.readdirSync(dir, { withFileTypes: true });
  } catch {
    return;
  }
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of entries) {
    if (out.length >= limit) return;
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, exts, out, limit);
    else if (e.isFile() && exts.some((x) => e.name.endsWith(x))) out.push(p);
  }
}

function readText(p) {
  try {
    const b = fs.readFileSync(p);
    const s = b.toString("utf8");
    if (s.includes("\uFFFD") || s.includes("\0")) return null; // binary or not UTF-8
    return s;
  } catch {
    return null;
  }
}

function sourceFiles(dirs, exts, limit) {
  const files = [];
  for (const d of dirs) walk(d, exts, files, limit);
  return files;
}

// excerpt takes a random slice starting at a line boundary.
function excerpt(r, s, minLen, maxLen) {
  const len = minLen + r.int(maxLen - minLen + 1);
  let start = r.int(Math.max(1, s.length - len));
  const nl = s.lastIndexOf("\n", start);
  start = nl < 0 ? 0 : nl + 1;
  // Never cut a surrogate pair in half.
  let end = Math.min(s.length, start + len);
  if (end < s.length && /[\uD800-\uDBFF]/.test(s[end - 1])) end--;
  return s.slice(start, end);
}

const PROSE_DIRS = ["/usr/share/common-licenses", "/usr/share/doc"];
const CODE_SETS = [
  { dirs: ["/usr/local/go/src"], exts: [".go"] },
  { dirs: ["/usr/lib/python3.11"], exts: [".py"] },
  { dirs: ["/usr/include"], exts: [".h"] },
  { dirs: ["/usr/local/lib/node_modules/npm"], exts: [".js"] },
  { dirs: ["/root/.rustup/toolchains"], exts: [".rs"] },
  { dirs: ["/usr/local/go/src", "/usr/lib/python3.11"], exts: [".sh", ".json", ".html", ".css", ".s"] },
];

const SENTENCES = {
  zh: ["我们今天去公园散步，天气非常好。", "机器学习模型需要大量的数据进行训练。", "请把这份报告翻译成英文，谢谢！", "北京是中华人民共和国的首都。"],
  ja: ["今日はとても良い天気ですね。", "東京タワーに行ったことがありますか？", "カタカナとひらがなと漢字を混ぜて書きます。", "ソフトウェアのバージョンを更新してください。"],
  ko: ["안녕하세요, 만나서 반갑습니다.", "한국어 형태소 분석은 어렵습니다.", "서울의 날씨가 좋네요."],
  ar: ["مرحبا بالعالم، كيف حالك اليوم؟", "اللغة العربية تكتب من اليمين إلى اليسار.", "تعلم الآلة مجال مثير للاهتمام."],
  hi: ["नमस्ते दुनिया, आप कैसे हैं?", "हिन्दी देवनागरी लिपि में लिखी जाती है।", "मशीन लर्निंग एक रोचक क्षेत्र है।"],
  ru: ["Привет, мир! Как дела?", "Съешь же ещё этих мягких французских булок, да выпей чаю."],
  el: ["Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία."],
  he: ["שלום עולם, מה שלומך?"],
  th: ["สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ"],
  vi: ["Tiếng Việt có rất nhiều dấu thanh điệu."],
  de: ["Größenwahn und Übermut führen zur Straßenbahn-Haltestelle."],
  fr: ["L'été dernier, nous sommes allés à la plage près de Nîmes."],
  es: ["¿Dónde está la biblioteca? ¡Allí, señor!"],
};

const EMOJI = [
  "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸🇫🇷", "1️⃣", "❤️", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "🐈‍⬛", "☕", "🚀✨",
  "🤷‍♀️", "🫠", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "©️", "#️⃣", "😶‍🌫️", "🧔🏻‍♂️",
];

const COMBINING = [
  "cafe\u0301", "café", "e\u0301\u0302\u0303", "A\u030A", "Å", "n\u0303", "Z\u0351\u0352\u0353\u0354\u0355",
  "\u1100\u1161\u11A8", "ﬁ", "①②③", "ＡＢＣ１２３", "Ⅻ", "㎏", "ｶﾀｶﾅ", "x\u200By", "a\u200Db", "\uFEFFbom",
  "o\u0308", "ö", "\u0915\u094D\u0937", "ﷺ", "Ǆ", "ß", "İstanbul", "ΣΊΣΥΦΟΣ", "ǅungla",
];

const ODD_RANGES = [
  [0x00, 0x1f], [0x7f, 0x9f], [0xa0, 0xff], [0x300, 0x36f], [0x2000, 0x206f], [0xe000, 0xe0ff],
  [0xfff0, 0xfffd], [0x10000, 0x1007f], [0x1f300, 0x1f6ff], [0x1d400, 0x1d4ff], [0xe0000, 0xe007f],
  [0x20000, 0x200ff], [0xfdd0, 0xfdef], [0x2e80, 0x2eff], [0x0600, 0x06ff], [0x0900, 0x097f],
];

const WORDS = ["the", "The", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "HTTP", "JSON", "gpt",
  "kvgate", "token", "tokenizer", "x", "I", "a", "don't", "it's", "CamelCase", "snake_case", "URL", "vLLM"];

const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D",
  "'ſ", "’s", "'x", "''", "'"];

function randCodePoint(r) {
  const [lo, hi] = r.pick(ODD_RANGES);
  let cp = lo + r.int(hi - lo + 1);
  if (cp >= 0xd800 && cp <= 0xdfff) cp = 0x41;
  return String.fromCodePoint(cp);
}

function whitespaceText(r) {
  const pieces = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ",
    " \t ", "\u00A0", "\u3000", "\u2003", "\v", "\f", "\u2028", "\u0085"];
  let s = "";
  const n = 1 + r.int(12);
  for (let i = 0; i < n; i++) {
    s += r.next() < 0.5 ? r.pick(pieces).repeat(1 + r.int(r.next() < 0.2 ? 40 : 3)) : r.pick(WORDS);
    if (r.next() < 0.3) s += r.pick([".", ",", "#", "//", "{", "}", "(", ")", "-", "=", ":"]);
  }
  return s;
}

function digitText(r) {
  const forms = [
    () => String(r.int(10)),
    () => Array.from({ length: 1 + r.int(40) }, () => r.int(10)).join(""),
    () => `${r.int(100000)}.${r.int(1000)}`,
    () => `+1 (${100 + r.int(900)}) ${100 + r.int(900)}-${1000 + r.int(9000)}`,
    () => `${r.int(2030)}-${1 + r.int(12)}-${1 + r.int(28)}T${r.int(24)}:${r.int(60)}:${r.int(60)}Z`,
    () => `v${r.int(10)}.${r.int(30)}.${r.int(100)}`,
    () => `${r.int(1e9).toLocaleString("en-US")}`,
    () => "٣٤٥٦ ४५६ ３４５ ⅣⅤ ½ ²³",
    () => `0x${r.int(2 ** 31).toString(16)}`,
    () => `${r.int(1000)}abc${r.int(1000)}`,
    () => `1e${r.int(300)} -${r.int(1000)}.${r.int(1000)}e-${r.int(30)}`,
  ];
  let s = "";
  const n = 1 + r.int(4);
  for (let i = 0; i < n; i++) s += (i ? r.pick([" ", ", ", "\n", "", " and "]) : "") + r.pick(forms)();
  return s;
}

function contractionText(r) {
  let s = "";
  const n = 1 + r.int(6);
  for (let i = 0; i < n; i++) {
    s += r.pick(["I", "you", "YOU", "she", "They", "it", "we", "Y", "don", "won", "can", ""]) + r.pick(CONTRACTIONS);
    if (r.next() < 0.3) s += r.pick(CONTRACTIONS);
    s += r.pick([" ", "  ", "\n", ".", "", " '"]);
  }
  return s;
}

function scriptText(r) {
  const langs = Object.keys(SENTENCES);
  let s = "";
  const n = 1 + r.int(4);
  for (let i = 0; i < n; i++) {
    s += r.pick(SENTENCES[r.pick(langs)]);
    if (r.next() < 0.4) s += r.pick([" ", "\n", " hello ", "123", " (test) ", ""]);
  }
  return s;
}

function emojiText(r) {
  let s = "";
  const n = 1 + r.int(8);
  for (let i = 0; i < n; i++) s += r.pick(EMOJI) + (r.next() < 0.5 ? r.pick([" ", "", "!", " ok ", "\n"]) : "");
  return s;
}

function combiningText(r) {
  let s = "";
  const n = 1 + r.int(6);
  for (let i = 0; i < n; i++) {
    s += r.pick(COMBINING);
    if (r.next() < 0.4) s += "\u0301\u0308\u0323".slice(0, 1 + r.int(3));
    s += r.pick([" ", "", "-", "\n"]);
  }
  return r.next() < 0.3 ? s.normalize("NFD") : s;
}

function oddText(r) {
  let s = "";
  const n = 1 + r.int(30);
  for (let i = 0; i < n; i++) s += r.next() < 0.7 ? randCodePoint(r) : r.pick(WORDS);
  return s;
}

function specialText(r, specials) {
  const partial = (t) => t.slice(0, 1 + r.int(Math.max(1, t.length - 1)));
  let s = "";
  const n = 1 + r.int(6);
  for (let i = 0; i < n; i++) {
    const t = r.pick(specials);
    const k = r.next();
    if (k < 0.6) s += t;
    else if (k < 0.75) s += partial(t);
    else if (k < 0.85) s += t + t;
    else s += " " + t + " ";
    s += r.pick(["", " ", "\n", "hello", " world", "user\n", "\n\n", "  ", "Hi there"]);
  }
  return s;
}

function mixText(r, pools) {
  let s = "";
  const n = 2 + r.int(5);
  for (let i = 0; i < n; i++) s += r.pick(pools)(r);
  return s;
}

function bigDoc(r, parts, target) {
  let s = "";
  while (s.length < target) s += r.pick(parts)(r);
  s = s.slice(0, target);
  if (/[\uD800-\uDBFF]/.test(s[s.length - 1])) s = s.slice(0, -1);
  return s;
}

// buildCorpus returns [{t, special}] where special asks for add_special_tokens=true as well.
export function buildCorpus(specials) {
  const r = rng(20261130);
  const texts = [];
  const add = (t) => texts.push(t);

  const proseFiles = sourceFiles(PROSE_DIRS, ["", ".md", ".txt", "README"], 4000)
    .filter((p) => /(common-licenses\/[^/]+$|\.md$|README[^/]*$|\.txt$)/.test(p) && !p.endsWith(".gz"));
  const prose = proseFiles.map(readText).filter((s) => s && s.length > 200);
  const code = CODE_SETS.map(({ dirs, exts }) =>
    sourceFiles(dirs, exts, 3000).map(readText).filter((s) => s && s.length > 100));

  // 1. prose and 2. code excerpts
  for (let i = 0; i < 550; i++) add(excerpt(r, r.pick(prose), 20, 1500));
  for (let i = 0; i < 800; i++) {
    const set = code[i % code.length].length ? code[i % code.length] : code[0];
    add(excerpt(r, r.pick(set), 20, 2500));
  }
  // 3..9 synthetic families
  const families = [
    [whitespaceText, 220], [digitText, 160], [contractionText, 120], [scriptText, 300],
    [emojiText, 150], [combiningText, 160], [oddText, 200],
  ];
  for (const [f, n] of families) for (let i = 0; i < n; i++) add(f(r));
  // 10. special tokens inside text
  for (let i = 0; i < 320; i++) add(specialText(r, specials));
  // 11. empty and one-character strings
  add("");
  for (let c = 0; c < 128; c++) add(String.fromCharCode(c));
  for (const c of ["é", "€", "你", "😀", "\u0301", "\u00A0", "\u3000", "ſ", "\uFFFD", "\u200D", "ß", "İ", "٣", "▁", "Ġ", "Ċ"]) add(c);
  // 12. mixtures of everything, CRLF-converted code, prose with specials
  const pools = [whitespaceText, digitText, contractionText, scriptText, emojiText, combiningText, oddText,
    (rr) => specialText(rr, specials), (rr) => excerpt(rr, rr.pick(prose), 10, 300),
    (rr) => excerpt(rr, rr.pick(code[0]), 10, 300)];
  for (let i = 0; i < 300; i++) add(mixText(r, pools));
  for (let i = 0; i < 60; i++) add(excerpt(r, r.pick(code[1]), 50, 1500).replace(/\n/g, "\r\n"));
  for (let i = 0; i < 40; i++) add(excerpt(r, r.pick(code[0]), 50, 1500).replace(/ {4}/g, "\t"));
  // 13. three 100k-character documents
  add(bigDoc(r, [(rr) => excerpt(rr, rr.pick(code[0]), 500, 5000)], 100000));
  add(bigDoc(r, [(rr) => excerpt(rr, rr.pick(prose), 200, 3000), scriptText, emojiText], 100000));
  add(bigDoc(r, pools, 100000));

  // add_special_tokens=true on every fourth text
  return texts.map((t, i) => ({ t, special: i % 4 === 0 }));
}
