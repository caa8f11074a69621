// golden_ids.mjs — regenerates tests/golden/<tokenizer>.json: the token ids of every text in tests/golden/texts.json
// for each tokenizer under data/tokenizers/, as Hugging Face `tokenizers` (the Rust library, through its Node
// bindings) encodes them with default settings (added tokens matched in the text, no post-processor template:
// tokenizer.json's post_processor for these three adds nothing). transformers.js (@lenml/tokenizers) is run on the same
// texts as a second reference; the texts where it disagrees are listed under "transformers_js_differs".
// Run: bash scripts/tokenizers.sh --ref && node scripts/golden_ids.mjs
import { createRequire } from "module";
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(path.join(root, "data/node/package.json"));
const { Tokenizer } = require("tokenizers");
const { TokenizerLoader } = require("@lenml/tokenizers");
const hfVersion = require("tokenizers/package.json").version;
const tjsVersion = JSON.parse(fs.readFileSync(path.join(root, "data/node/node_modules/@lenml/tokenizers/package.json"), "utf8")).version;

const texts = JSON.parse(fs.readFileSync(path.join(root, "tests/golden/texts.json"), "utf8"));
for (const name of ["qwen3", "gptoss", "deepseek_v3"]) {
  const dir = path.join(root, "data/tokenizers", name);
  const hf = Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
  const tjs = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
  });
  const ids = [], differs = [];
  for (let i = 0; i < texts.length; i++) {
    const enc = await hf.encode(texts[i], null, { addSpecialTokens: true });
    const a = Array.from(enc.getIds());
    const b = tjs.encode(texts[i], { add_special_tokens: true });
    if (JSON.stringify(a) !== JSON.stringify(b)) differs.push(i);
    ids.push(a);
  }
  const out = {
    reference: `tokenizers ${hfVersion} (Hugging Face, Rust, npm Node bindings); cross-checked with @lenml/tokenizers ${tjsVersion}`,
    tokenizer: `@lenml/tokenizer-${name} models/tokenizer.json`,
    transformers_js_differs: differs,
    ids,
  };
  const body = "{\n" + Object.entries(out).map(([k, v]) =>
    k === "ids" ? ` "ids": [\n${v.map((x) => "  " + JSON.stringify(x)).join(",\n")}\n ]`
                : ` ${JSON.stringify(k)}: ${JSON.stringify(v)}`).join(",\n") + "\n}\n";
  fs.writeFileSync(path.join(root, "tests/golden", name + ".json"), body);
  console.log(`${name}: ${texts.length} texts, transformers.js differs on [${differs}]`);
}
