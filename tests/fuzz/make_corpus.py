#!/usr/bin/env python3
# make_corpus.py — writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): a few small valid and
# invalid inputs. The files are committed; rerun only to change the seeds. (corpus/fuzz_safetensors/hf_single is
# tests/data/safetensors/hf_single.safetensors, and corpus/fuzz_config/regress_* are inputs fuzzing once found.)
import json, os, struct

here = os.path.dirname(os.path.abspath(__file__))

def put(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

def st(header, data, pad=True, hlen=None):
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data

f32 = struct.pack("<4f", 1.0, -2.5, 3.0e-3, float("inf"))
bf16 = struct.pack("<3H", 0x3F80, 0x7FC0, 0x0001)
put("fuzz_safetensors", "valid_f32", st({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, f32))
put("fuzz_safetensors", "valid_mixed", st({
    "__metadata__": {"format": "pt"},
    "a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
    "b": {"dtype": "F16", "shape": [], "data_offsets": [6, 8]},
    "c": {"dtype": "U8", "shape": [0, 4], "data_offsets": [8, 8]},
    "d": {"dtype": "F64", "shape": [1], "data_offsets": [8, 16]},
    "e": {"dtype": "BOOL", "shape": [2], "data_offsets": [16, 18]},
}, bf16 + b"\x00\x3c" + struct.pack("<d", 0.1) + b"\x01\x00"))
put("fuzz_safetensors", "valid_empty", st({}, b""))
put("fuzz_safetensors", "bad_overlap", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, f32[:12]))
put("fuzz_safetensors", "bad_dtype", st({"a": {"dtype": "F31", "shape": [1], "data_offsets": [0, 4]}}, f32[:4]))
put("fuzz_safetensors", "bad_size", st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, f32[:8]))
put("fuzz_safetensors", "bad_hlen", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, f32[:4], hlen=1 << 40))
put("fuzz_safetensors", "bad_truncated", st({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, f32)[:40])

put("fuzz_config", "qwen3_moe.json", json.dumps({
    "model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "norm_topk_prob": True, "torch_dtype": "bfloat16", "rope_scaling": None}).encode())
put("fuzz_config", "deepseek_v2.json", json.dumps({
    "model_type": "deepseek_v2", "hidden_size": 2048.0, "n_routed_experts": 64, "rope_scaling": {
        "type": "yarn", "factor": 40, "beta_fast": 32}, "quantization_config": {"type": 1}}).encode())
put("fuzz_config", "wrong_types.json", b'{"hidden_size": "64", "rms_norm_eps": true, "vocab_size": 1.5, "text_config": []}')
put("fuzz_config", "not_object.json", b'[1, 2, 3]')
put("fuzz_config", "bad_json.json", b'{"hidden_size": 64,')

def npy(descr, n, data):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (descr, n)
    total = (10 + len(d) + 1 + 63) // 64 * 64
    h = d + " " * (total - 10 - len(d) - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + data

toks = struct.pack("<6I", 5, 9, 0, 7, 7, 0)
put("fuzz_npy", "valid_u32", npy("<u4", 6, toks) + npy("<u8", 2, struct.pack("<2Q", 3, 6)))
put("fuzz_npy", "valid_u8_empty", npy("|u1", 0, b"") + npy("<u8", 0, b""))
put("fuzz_npy", "valid_u16", npy("<u2", 3, struct.pack("<3H", 1, 2, 0)) + npy("<u8", 1, struct.pack("<Q", 3)))
put("fuzz_npy", "bad_huge_shape", npy("<u4", 1 << 62, toks) + npy("<u8", 1, struct.pack("<Q", 6)))
put("fuzz_npy", "bad_ends_order", npy("<u4", 6, toks) + npy("<u8", 2, struct.pack("<2Q", 6, 3)))
put("fuzz_npy", "bad_trailing", npy("<u4", 6, toks) + npy("<u8", 1, struct.pack("<Q", 6)) + b"\x00\x00")
put("fuzz_npy", "bad_float_tokens", npy("<f4", 2, struct.pack("<2f", 1, 2)) + npy("<u8", 1, struct.pack("<Q", 2)))
