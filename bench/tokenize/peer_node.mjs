// peer_node.mjs — tokenizer throughput of the peers that run here, on the same corpus as `pith tokenize`:
//   hf:  Hugging Face `tokenizers` (Rust) through its npm Node bindings, Tokenizer.encodeBatch over all documents
//        (threads: TOKENIZERS_PARALLELISM=false → 1 thread; otherwise rayon's pool, RAYON_NUM_THREADS if set);
//   tjs: transformers.js (@lenml/tokenizers), tokenizer.encode per document (JavaScript, one thread).
// Prints one line per peer: MB/s of UTF-8 document text, tokens, seconds (best of --reps runs).
// With --check PITH.bin (hf only) it also compares the ids with pith's output for the corpus (BOS when
// tokenizer_config.json says add_bos_token, the text's ids, EOS).
// Usage: node bench/tokenize/peer_node.mjs TOKENIZER_DIR CORPUS.jsonl [hf|tjs] [--reps N] [--check PITH.bin]
import { createRequire } from "module";
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const require = createRequire(path.join(root, "data/node/package.json"));
const args = process.argv.slice(2);
const opt = (name) => (args.includes(name) ? args[args.indexOf(name) + 1] : undefined);
const reps = +(opt("--reps") ?? 1), checkBin = opt("--check");
const [tokdir, corpus, which = "hf"] = args.filter((a, i) => !a.startsWith("--") && !args[i - 1]?.startsWith("--"));
const texts = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l).text);
const mb = texts.reduce((s, t) => s + Buffer.byteLength(t, "utf8"), 0) / 1e6;

let best = Infinity, ntok = 0;
if (which === "hf") {
  const { Tokenizer } = require("tokenizers");
  const tok = Tokenizer.fromFile(path.join(tokdir, "tokenizer.json"));
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint();
    const encs = await tok.encodeBatch(texts);
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
    ntok = encs.reduce((s, e) => s + e.getIds().length, 0);
    if (checkBin && r === 0) check(tok, encs);
  }
} else {
  const { TokenizerLoader } = require("@lenml/tokenizers");
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(tokdir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(tokdir, "tokenizer_config.json"), "utf8")),
  });
  for (let r = 0; r < reps; r++) {
    const t0 = process.hrtime.bigint();
    ntok = 0;
    for (const t of texts) ntok += tok.encode(t, { add_special_tokens: false }).length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
}
const threads = which === "hf" && process.env.TOKENIZERS_PARALLELISM !== "false" ? "all threads" : "1 thread";
console.log(`${which === "hf" ? "hf-tokenizers(rust,node)" : "transformers.js"} ${path.basename(tokdir)} ${threads}: ` +
  `${(mb / best).toFixed(2)} MB/s (${mb.toFixed(1)} MB, ${ntok} tokens, ${best.toFixed(2)} s)`);

// Compares pith's .bin (two .npy records: uint32 tokens, uint64 document ends) with the HF encodings.
function check(tok, encs) {
  const buf = fs.readFileSync(checkBin);
  const record = (at) => {
    const hlen = buf.readUInt16LE(at + 8), hdr = buf.subarray(at + 10, at + 10 + hlen).toString("latin1");
    const n = +/'shape': \((\d+),\)/.exec(hdr)[1], size = /<u8/.test(hdr) ? 8 : 4, start = at + 10 + hlen;
    const get = (i) => (size === 8 ? Number(buf.readBigUInt64LE(start + 8 * i)) : buf.readUInt32LE(start + 4 * i));
    return { n, get, end: start + n * size };
  };
  const toks = record(0), ends = record(toks.end);
  const cfg = JSON.parse(fs.readFileSync(path.join(tokdir, "tokenizer_config.json"), "utf8"));
  const name = (v) => (typeof v === "object" && v ? v.content : v);
  const bos = cfg.add_bos_token ? [tok.tokenToId(name(cfg.bos_token))] : [], eos = tok.tokenToId(name(cfg.eos_token));
  if (ends.n !== encs.length) throw new Error(`${checkBin}: ${ends.n} documents, corpus has ${encs.length}`);
  let start = 0;
  for (let i = 0; i < encs.length; i++) {
    const want = [...bos, ...encs[i].getIds(), eos], end = ends.get(i);
    const got = Array.from({ length: end - start }, (_, k) => toks.get(start + k));
    if (got.length !== want.length || got.some((x, k) => x !== want[k])) throw new Error(`${checkBin}: document ${i} differs from HF`);
    start = end;
  }
  console.log(`check: ${checkBin} matches hf-tokenizers on all ${encs.length} documents`);
}
