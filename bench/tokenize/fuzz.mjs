// fuzz.mjs — random texts over a tricky character pool, tokenized by pith and by Hugging Face `tokenizers` (Rust,
// npm Node bindings); any difference in ids is printed. Not part of `make test` (it needs node and data/node).
// Run: bash scripts/tokenizers.sh --ref && make build/pith && node bench/tokenize/fuzz.mjs [ndocs] [seed] [max pieces per doc]
import { createRequire } from "module";
import fs from "fs";
import os from "os";
import path from "path";
import { execFileSync } from "child_process";
import { fileURLToPath } from "url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const require = createRequire(path.join(root, "data/node/package.json"));
const { Tokenizer } = require("tokenizers");
const ndocs = +(process.argv[2] ?? 3000);
let seed = +(process.argv[3] ?? 1);
const maxPieces = +(process.argv[4] ?? 40);
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const pick = (a) => a[Math.floor(rand() * a.length)];

const pool = [
  "a", "b", "Z", "é", "e\u0301", "ñ", "ß", "İ", "ſ", "K", "\u212a", "'", "'s", "'S", "'ll", "'Re", "\u2019", "\"", " ", " ", " ",
  "  ", "\t", "\n", "\r\n", "\r", "\u000b", "\u000c", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2028", "\u2029",
  "\u202f", "\u205f", "\u3000", "\ufeff", "\u200b", "\u200d", "0", "7", "12", "345", "٣", "१", "①", "½", "²", ".", ",",
  "!", "?", "-", "_", "/", "\\", "(", ")", "[", "{", "<", ">", "|", "#", "@", "$", "%", "&", "*", "+", "=", "~", "`",
  "^", "中", "文", "日本", "カタ", "ひら", "한", "글", "ア", "\u309b", "\u4e00", "\u9fa5", "\u9fa6", "ا", "ل", "ש",
  "\u064b", "\u0300", "\u0301", "\u0308", "\u0323", "\u20dd", "\u0915\u094d", "\u0e2a", "\u0e31", "😀", "👍🏽",
  "👨‍👩‍👧", "🇺🇸", "❤️", "\u{1d54f}", "\u{20000}", "�", "©", "€", "ǅ", "ʰ", "ǈ", "Ⅻ",
  "<|endoftext|>", "<|im_start|>", "<|im_end", "<|return|>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
  "<\uff5cUser\uff5c>", "<|EOT|>", "<think>", "The", " the", "hello", "World", "don't", "I'M", "http://x.y/z?q=1",
  "    ", "\n\n", "aaaa", "1234567", "    def", "\t\t", "...", "—", "–", "…",
  "\u212b", "\u2126", "\u0958", "\u1100", "\u1161", "\u11a8", "\uac00", "\u0cbf", "\u0cd5", "\u0344", "\u0f73",
  "\u3099", "か", "\u0b47", "\u0b3e", "\u1e9b", "\u0327", "\u00c5", "A\u030a",
];
const texts = [];
for (let i = 0; i < ndocs; i++) {
  const n = 1 + Math.floor(rand() * maxPieces);
  let s = "";
  for (let k = 0; k < n; k++) s += pick(pool);
  texts.push(s);
}
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "pith-fuzz-"));
fs.writeFileSync(path.join(dir, "fuzz.jsonl"), texts.map((t) => JSON.stringify({ text: t })).join("\n") + "\n");
let bad = 0;
for (const name of ["qwen3", "gptoss", "deepseek_v3"]) {
  const tokdir = path.join(root, "data/tokenizers", name);
  const out = path.join(dir, name);
  execFileSync(path.join(root, "build/pith"), ["tokenize", "--tokenizer", tokdir, "--input", path.join(dir, "fuzz.jsonl"),
    "--output", out, "--eos", "0"], { stdio: "ignore" });
  const buf = fs.readFileSync(path.join(out, "fuzz.jsonl.bin"));
  const ntok = parseInt(/\((\d+),\)/.exec(buf.subarray(0, 128).toString())[1]);
  const toks = new Uint32Array(buf.buffer.slice(buf.byteOffset + 128, buf.byteOffset + 128 + 4 * ntok));
  const hf = Tokenizer.fromFile(path.join(tokdir, "tokenizer.json"));
  const cfg = JSON.parse(fs.readFileSync(path.join(tokdir, "tokenizer_config.json"), "utf8"));
  const bos = cfg.add_bos_token ? 1 : 0; // DeepSeek-V3: pith prepends BOS (add_bos_token), HF's Rust library does not
  const encs = await hf.encodeBatch(texts);
  let at = 0, nbad = 0;
  for (let i = 0; i < texts.length; i++) {
    const want = Array.from(encs[i].getIds());
    const got = Array.from(toks.subarray(at + bos, at + bos + want.length));
    at += bos + want.length + 1;
    if (JSON.stringify(got) !== JSON.stringify(want) || toks[at - 1] !== 0) {
      if (nbad++ < 5) console.log(`${name} doc ${i}: ${JSON.stringify(texts[i])}\n  pith ${JSON.stringify(got)}\n  hf   ${JSON.stringify(want)}`);
      break; // offsets are off from here on
    }
  }
  if (at !== ntok && !nbad) console.log(`${name}: pith wrote ${ntok} tokens, expected ${at}`), nbad++;
  console.log(`${name}: ${texts.length} docs, ${nbad ? "DIFFERENT" : "identical ids"}`);
  bad += nbad;
}
fs.rmSync(dir, { recursive: true });
process.exit(bad ? 1 : 0);
