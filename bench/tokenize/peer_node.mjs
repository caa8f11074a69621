// peer_node.mjs — tokenizer throughput of the peers that run here, on the same corpus as `pith tokenize`:
//   hf:  Hugging Face `tokenizers` (Rust) through its npm Node bindings, Tokenizer.encodeBatch over all documents
//        (threads: TOKENIZERS_PARALLELISM=false → 1 thread; otherwise rayon's pool, RAYON_NUM_THREADS if set);
//   tjs: transformers.js (@lenml/tokenizers), tokenizer.encode per document (JavaScript, one thread).
// Prints one line per peer: MB/s of UTF-8 document text, tokens, seconds (best of --reps runs).
// Usage: node bench/tokenize/peer_node.mjs TOKENIZER_DIR CORPUS.jsonl [hf|tjs] [--reps N]
import { createRequire } from "module";
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const require = createRequire(path.join(root, "data/node/package.json"));
const args = process.argv.slice(2);
const reps = args.includes("--reps") ? +args[args.indexOf("--reps") + 1] : 1;
const [tokdir, corpus, which = "hf"] = args.filter((a, i) => !a.startsWith("--") && args[i - 1] !== "--reps");
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
