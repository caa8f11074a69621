#!/usr/bin/env python3
"""peer_hf_tokenizers.py — Hugging Face `tokenizers` (Rust, Python bindings) throughput on the corpus that
bench/tokenize/run.sh gives `pith tokenize`, for the per-thread comparison (pith's goal: >= 1.5x per thread).

Modes, each in a fresh process (TOKENIZERS_PARALLELISM / RAYON_NUM_THREADS must be set before import):
  batch-1    Tokenizer.encode_batch(texts) on one thread
  loop-1     Tokenizer.encode(text) per document on one thread (what each PithTrain tokenize worker does)
  batch-all  Tokenizer.encode_batch(texts) on all threads (rayon)
MB/s counts the UTF-8 bytes of the documents' text; tokenizer loading and JSON parsing are not timed.
With --check PITH.bin it also compares the ids with pith's output for the same corpus (BOS when
tokenizer_config.json says add_bos_token, then the text's ids, then EOS).

Usage: python3 bench/tokenize/peer_hf_tokenizers.py --tokenizer data/tokenizers/qwen3 --corpus data/bench/kjv.jsonl
           [--modes batch-1,loop-1,batch-all] [--reps 3] [--check out/kjv.jsonl.bin]
Needs: pip install tokenizers (no numpy needed).
"""
import argparse, array, json, os, re, subprocess, sys, time


def load_texts(corpus):
    with open(corpus, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def run_mode(args):
    threads = os.environ.get("RAYON_NUM_THREADS", "all")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    texts = load_texts(args.corpus)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    best, ntok = float("inf"), 0
    for _ in range(args.reps):
        t0 = time.perf_counter()
        if args.mode.startswith("batch"):
            encs = tok.encode_batch(texts)
        else:
            encs = [tok.encode(t) for t in texts]
        best = min(best, time.perf_counter() - t0)
        ntok = sum(len(e.ids) for e in encs)
    import tokenizers

    print(f"hf-tokenizers {tokenizers.__version__} {os.path.basename(os.path.normpath(args.tokenizer))} {args.mode} "
          f"(threads={threads}): {mb / best:.2f} MB/s ({mb:.1f} MB, {ntok} tokens, {best:.2f} s)", flush=True)
    if args.check:
        check(args, tok, texts)


def npy_record(buf, at):
    assert buf[at:at + 6] == b"\x93NUMPY", "not a .npy record"
    hlen = int.from_bytes(buf[at + 8:at + 10], "little")
    hdr = buf[at + 10:at + 10 + hlen].decode("latin1")
    n = int(re.search(r"'shape': \((\d+),\)", hdr).group(1))
    code = {"'<u4'": "I", "'<u8'": "Q"}[re.search(r"'descr': ('[^']+')", hdr).group(1)]
    a = array.array(code)
    a.frombytes(buf[at + 10 + hlen:at + 10 + hlen + n * a.itemsize])
    return a, at + 10 + hlen + n * a.itemsize


def check(args, tok, texts):
    cfg_path = os.path.join(args.tokenizer, "tokenizer_config.json")
    cfg = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    name = lambda v: v["content"] if isinstance(v, dict) else v
    bos = [tok.token_to_id(name(cfg["bos_token"]))] if cfg.get("add_bos_token") else []
    eos = tok.token_to_id(name(cfg["eos_token"]))
    buf = open(args.check, "rb").read()
    toks, at = npy_record(buf, 0)
    ends, _ = npy_record(buf, at)
    assert len(ends) == len(texts), f"{args.check}: {len(ends)} documents, corpus has {len(texts)}"
    start = 0
    for i, (t, e) in enumerate(zip(texts, tok.encode_batch(texts))):
        want = bos + e.ids + [eos]
        got = list(toks[start:ends[i]])
        if got != want:
            sys.exit(f"check: document {i} differs: pith {got[:20]}... hf {want[:20]}...")
        start = ends[i]
    print(f"check: {args.check} matches hf-tokenizers on all {len(texts)} documents")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json (+ tokenizer_config.json)")
    ap.add_argument("--corpus", required=True, help=".jsonl with a 'text' field per line")
    ap.add_argument("--modes", default="batch-1,loop-1,batch-all")
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--check", help="pith's .bin for this corpus, to compare ids")
    args = ap.parse_args()
    if args.mode:
        return run_mode(args)
    for i, mode in enumerate(args.modes.split(",")):
        env = dict(os.environ)
        if mode.endswith("-1"):
            env.update(RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        else:
            env.update(TOKENIZERS_PARALLELISM="true")
        cmd = [sys.executable, __file__, "--tokenizer", args.tokenizer, "--corpus", args.corpus, "--mode", mode,
               "--reps", str(args.reps)]
        if args.check and i == 0:
            cmd += ["--check", args.check]
        rc = subprocess.run(cmd, env=env).returncode
        if rc:
            sys.exit(rc)


if __name__ == "__main__":
    main()
