#!/usr/bin/env python3
"""make_fixture.py — one reference for pith's Muon step, computed with PyTorch in float64 from the formula of
docs/architecture.md ("Muon"), written to tests/muon/fixture.safetensors (tests/test_muon.c reads it).

Every parameter class of PithTrain's split gets a tensor: 2-D hidden weights (tall, wide), adjacent per-expert
matrices of one shape, a 3-D expert stack (orthogonalised per expert), and the AdamW classes (embedding, LM head,
router, norm, bias, 2-D expert bias, sinks). Two steps with different learning rates, so the momentum buffer and
AdamW's bias correction both matter. Inputs are drawn in float32 (pith's master dtype) and widened, so pith and the
reference start from the same numbers. Run: python3 tests/muon/make_fixture.py [OUTPUT] (on a GPU when present).
"""
import json
import struct
import sys

import numpy as np
import torch

TENSORS = [  # (canonical name, shape)
    ("embed_tokens.weight", (32, 16)),
    ("layers.0.input_layernorm.weight", (16,)),
    ("layers.0.self_attn.q_proj.weight", (24, 16)),
    ("layers.0.self_attn.q_proj.bias", (24,)),
    ("layers.0.self_attn.o_proj.weight", (16, 24)),
    ("layers.0.self_attn.sinks", (2,)),
    ("layers.0.mlp.gate.weight", (4, 16)),
    ("layers.0.mlp.experts.0.gate_proj.weight", (8, 16)),
    ("layers.0.mlp.experts.0.up_proj.weight", (8, 16)),
    ("layers.0.mlp.experts.1.gate_proj.weight", (8, 16)),
    ("layers.0.mlp.experts.1.up_proj.weight", (8, 16)),
    ("layers.0.mlp.experts.0.down_proj.weight", (16, 8)),
    ("layers.0.mlp.experts.1.down_proj.weight", (16, 8)),
    ("layers.1.mlp.experts.gate_up_proj", (4, 12, 16)),
    ("layers.1.mlp.experts.gate_up_proj_bias", (4, 12)),
    ("layers.1.mlp.experts.down_proj", (4, 16, 6)),
    ("norm.weight", (16,)),
    ("lm_head.weight", (32, 16)),
]
LRS = (0.02, 0.015)  # learning rate of step 1 and step 2
WD, MOMENTUM, BETAS, EPS, NS_STEPS = 0.1, 0.95, (0.9, 0.999), 1e-8, 5
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def is_muon_param(name, ndim):
    """PithTrain's split: Muon for tensors of 2+ dims except biases, the embedding, the LM head and routers."""
    if ndim < 2 or name.endswith(".bias") or name.endswith("_bias"):
        return False
    if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
        return False
    return ".gate.weight" not in name and ".router.weight" not in name


def newton_schulz(g):
    """Newton–Schulz over the last two dims (batched over a leading expert dim), transposed when rows > cols."""
    a, b, c = NS_COEFFS
    x = g
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(NS_STEPS):
        A = x @ x.mT
        B = b * A + c * A @ A
        x = a * x + B @ x
    return x.mT if tall else x


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/muon/fixture.safetensors"
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rng = np.random.default_rng(20261201)
    f32 = lambda shape, s: torch.tensor(rng.standard_normal(shape).astype(np.float32) * s, dtype=torch.float64)
    record, meta = {}, {"lrs": json.dumps(LRS), "weight_decay": repr(WD), "momentum": repr(MOMENTUM),
                        "betas": json.dumps(BETAS), "eps": repr(EPS), "torch": torch.__version__, "device": dev}
    for name, shape in TENSORS:
        p = f32(shape, 0.5).to(dev)
        grads = [f32(shape, 0.1).to(dev) for _ in LRS]
        record["init/" + name] = p.clone()
        muon = is_muon_param(name, len(shape))
        meta["class/" + name] = "muon" if muon else "adamw"
        buf, m, v = torch.zeros_like(p), torch.zeros_like(p), torch.zeros_like(p)
        for s, (lr, g) in enumerate(zip(LRS, grads), start=1):
            record["grad%d/%s" % (s, name)] = g.clone()
            if muon:  # momentum with the Nesterov-style update, orthogonalised, scaled, decoupled decay
                buf = MOMENTUM * buf + (1 - MOMENTUM) * g
                u = (1 - MOMENTUM) * g + MOMENTUM * buf
                orth = newton_schulz(u) * (0.2 * max(shape[-2], shape[-1]) ** 0.5)
                p = p * (1 - lr * WD) - lr * orth
            else:  # torch.optim.AdamW
                b1, b2 = BETAS
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                mh, vh = m / (1 - b1**s), v / (1 - b2**s)
                p = p * (1 - lr * WD) - lr * mh / (vh.sqrt() + EPS)
            record["step%d/%s" % (s, name)] = p.clone()
    # safetensors: 8-byte header length, JSON header, raw little-endian data (F64)
    header, blobs, off = {"__metadata__": meta}, [], 0
    for key, t in record.items():
        data = t.cpu().numpy().astype("<f8").tobytes()
        header[key] = {"dtype": "F64", "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(out, "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    print("wrote %s: %d tensors, %d bytes, on %s with torch %s" % (out, len(record), 8 + len(h) + off, dev,
                                                                    torch.__version__))


if __name__ == "__main__":
    main()
