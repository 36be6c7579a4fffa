#!/usr/bin/python3
"""Regenerates kiln's reference fixtures in tests/fixtures/.

Run with Debian's python3 (it has python3-torch):  /usr/bin/python3 tests/reference/make_fixtures.py
Output is bit-identical on every run (fixed seeds, single thread, float32 on CPU).

  st_python.safetensors       a small safetensors file written by the writer below
                              (struct + json only), for the C reader/writer interop test
  tiny_gqa.{safetensors,config.json}   2-layer Llama, GQA (4 query heads, 2 kv heads)
  tiny_tied.{safetensors,config.json}  2-layer Llama, tied embeddings, head_dim 24

The Llama forward is written out here in plain torch with Hugging Face semantics
(LlamaForCausalLM); the transformers package is not needed.
"""
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures")

# ---------------------------------------------------------------- safetensors
# Layout as the Rust `safetensors` library writes it: tensors sorted by dtype
# (its enum order, largest first: ... F32 > I32 > BF16 ...) then by name, packed
# without gaps; "__metadata__" first with sorted keys; compact JSON padded with
# spaces to a multiple of 8.
DTYPE_RANK = {"BF16": 12, "I32": 13, "F32": 15}
DTYPE_SIZE = {"BF16": 2, "I32": 4, "F32": 4}


def st_bytes(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, raw little-endian bytes)."""
    order = sorted(tensors, key=lambda t: (-DTYPE_RANK[t[1]], t[0].encode("utf-8")))
    header = {}
    if metadata:
        header["__metadata__"] = {k: metadata[k] for k in sorted(metadata)}
    pos = 0
    for name, dtype, shape, raw in order:
        numel = math.prod(shape)
        assert len(raw) == numel * DTYPE_SIZE[dtype], name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + len(raw)]}
        pos += len(raw)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in order)


def write_file(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def make_st_python():
    """Values are exact in every dtype so the C test can rebuild them."""
    f32 = lambda vals: struct.pack("<%df" % len(vals), *vals)
    tensors = [
        ("b.weight", "F32", [2, 3], f32([i * 0.5 - 1.0 for i in range(6)])),
        ("a.bias", "I32", [4], struct.pack("<4i", -2, 0, 7, 2147483647)),
        ("c", "BF16", [3], struct.pack("<3H", 0x3F80, 0xC000, 0x3E20)),
        ("empty", "F32", [2, 0], b""),
        ("s", "F32", [], f32([3.25])),
        ("layers.0.w", "I32", [1, 2, 1, 2], struct.pack("<4i", 1, 2, 3, 4)),
    ]
    write_file(os.path.join(OUT, "st_python.safetensors"),
               st_bytes(tensors, {"format": "pt", "kiln": "interop"}))


# ---------------------------------------------------------------- Llama
def llama_params(cfg, gen, torch, dtype):
    """HF init: Linear/Embedding weights ~ N(0, 0.02); RMSNorm weights 1, then
    perturbed to 1 + 0.1*N(0,1) so their gradients are non-trivial."""
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim", H // nh)
    std = cfg["initializer_range"]
    normal = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64) * std
    p = {"model.embed_tokens.weight": normal(V, H)}
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        p[pre + "input_layernorm.weight"] = torch.ones(H, dtype=torch.float64)
        p[pre + "self_attn.q_proj.weight"] = normal(nh * D, H)
        p[pre + "self_attn.k_proj.weight"] = normal(nkv * D, H)
        p[pre + "self_attn.v_proj.weight"] = normal(nkv * D, H)
        p[pre + "self_attn.o_proj.weight"] = normal(H, nh * D)
        p[pre + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.float64)
        p[pre + "mlp.gate_proj.weight"] = normal(I, H)
        p[pre + "mlp.up_proj.weight"] = normal(I, H)
        p[pre + "mlp.down_proj.weight"] = normal(H, I)
    p["model.norm.weight"] = torch.ones(H, dtype=torch.float64)
    if not cfg["tie_word_embeddings"]:
        p["lm_head.weight"] = normal(V, H)
    for name in sorted(p):  # sorted: the perturbation draws do not depend on dict order
        if name.endswith("norm.weight"):
            p[name] += 0.1 * torch.randn(H, generator=gen, dtype=torch.float64)
    # Round once to float32 so the float32 and float64 runs share exact weights.
    return {k: v.to(torch.float32).to(dtype) for k, v in p.items()}


def rms_norm(x, w, eps, torch):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x, torch):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def llama_forward(cfg, p, input_ids, attention_mask, torch):
    F = torch.nn.functional
    B, T = input_ids.shape
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim", H // nh)
    n_rep, eps = nh // nkv, cfg["rms_norm_eps"]
    dt = p["model.norm.weight"].dtype

    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).to(torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)          # T x D

    causal = torch.ones(T, T, dtype=torch.bool).tril()       # key j <= query i
    keep = causal[None, :, :] & attention_mask.bool()[:, None, :]   # B x T(query) x T(key)
    mask = torch.zeros(B, 1, T, T, dtype=dt).masked_fill(~keep[:, None], float("-inf"))

    x = F.embedding(input_ids.long(), p["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps, torch)
        q = F.linear(h, p[pre + "self_attn.q_proj.weight"]).view(B, T, nh, D).transpose(1, 2)
        k = F.linear(h, p[pre + "self_attn.k_proj.weight"]).view(B, T, nkv, D).transpose(1, 2)
        v = F.linear(h, p[pre + "self_attn.v_proj.weight"]).view(B, T, nkv, D).transpose(1, 2)
        q = q * cos + rotate_half(q, torch) * sin
        k = k * cos + rotate_half(k, torch) * sin
        # repeat_kv: query head hq uses kv head hq // n_rep
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D) + mask
        probs = torch.softmax(scores, dim=-1)
        a = (probs @ v).transpose(1, 2).reshape(B, T, nh * D)
        x = x + F.linear(a, p[pre + "self_attn.o_proj.weight"])
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps, torch)
        m = F.silu(F.linear(h, p[pre + "mlp.gate_proj.weight"])) * F.linear(h, p[pre + "mlp.up_proj.weight"])
        x = x + F.linear(m, p[pre + "mlp.down_proj.weight"])
    x = rms_norm(x, p["model.norm.weight"], eps, torch)
    head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    return F.linear(x, head)


def make_batch(cfg, gen, torch, B=3, T=37, pads=(0, 5, 11), pad_id=2):
    """Right padding of different lengths. labels[b,t] = ids[b,t+1] where
    mask[b,t+1] == 1, else -100 (last position, and every pad-followed one)."""
    ids = torch.randint(3, cfg["vocab_size"], (B, T), generator=gen, dtype=torch.int64)
    mask = torch.ones(B, T, dtype=torch.int64)
    for b, n in enumerate(pads):
        if n:
            mask[b, T - n:] = 0
            ids[b, T - n:] = pad_id
    labels = torch.full((B, T), -100, dtype=torch.int64)
    labels[:, :-1] = torch.where(mask[:, 1:] == 1, ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    return ids, mask, labels


def run_model(cfg, params, ids, mask, labels, torch):
    params = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    logits = llama_forward(cfg, params, ids, mask, torch)
    V = cfg["vocab_size"]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1),
                                             ignore_index=-100, reduction="mean")
    names = sorted(params)
    grads = torch.autograd.grad(loss, [params[n] for n in names])
    return logits.detach(), loss.detach(), dict(zip(names, grads))


def config(tied, hidden, inter, nkv, head_dim=None):
    c = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 61,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": nkv,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 0,
        "pad_token_id": 2,
        "torch_dtype": "float32",
    }
    if head_dim is not None:
        c["head_dim"] = head_dim
    return c


def raw(t, torch):
    """(safetensors dtype, little-endian bytes) of a float32 or integer tensor."""
    if sys.byteorder != "little":
        raise SystemExit("fixtures are little-endian; run on a little-endian machine")
    t = t.detach().contiguous().reshape(-1)
    if t.dtype == torch.float32:  # no numpy here: reinterpret the bytes in torch
        return "F32", bytes(t.view(torch.uint8).tolist())
    if t.dtype in (torch.int32, torch.int64):
        return "I32", struct.pack("<%di" % t.numel(), *t.tolist())
    raise ValueError(t.dtype)


def make_model_fixture(name, cfg, seed, torch):
    gen = torch.Generator().manual_seed(seed)
    p32 = llama_params(cfg, gen, torch, torch.float32)
    ids, mask, labels = make_batch(cfg, gen, torch)
    logits, loss, grads = run_model(cfg, p32, ids, mask, labels, torch)

    # float64 check: same (float32-rounded) weights, everything else in double.
    p64 = {k: v.to(torch.float64) for k, v in p32.items()}
    l64, loss64, g64 = run_model(cfg, p64, ids, mask, labels, torch)
    worst = [("logits", rel_err(logits, l64)), ("loss", rel_err(loss, loss64))]
    worst += [("grad." + k, rel_err(grads[k], g64[k])) for k in grads]
    bad = [(k, e) for k, e in worst if e > 1e-4]
    print("%s: loss %.6f (f64 %.9f), max rel err f32 vs f64: %s %.2e"
          % (name, loss.item(), loss64.item(), *max(worst, key=lambda x: x[1])))
    if bad:
        raise SystemExit("%s: float32 results unstable vs float64: %s" % (name, bad))

    out = dict(p32)
    out.update({"input_ids": ids, "attention_mask": mask, "labels": labels,
                "logits": logits, "loss": loss.reshape(1)})
    out.update({"grad." + k: g for k, g in grads.items()})
    tensors = [(k, *raw(v, torch)) for k, v in out.items()]
    tensors = [(k, dt, list(out[k].shape), b) for k, dt, b in tensors]
    meta = {"format": "pt", "generator": "tests/reference/make_fixtures.py",
            "torch": torch.__version__.split("+")[0], "seed": str(seed)}
    write_file(os.path.join(OUT, name + ".safetensors"),
               st_bytes(tensors, meta))
    with open(os.path.join(OUT, name + ".config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def main():
    os.makedirs(OUT, exist_ok=True)
    make_st_python()
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    make_model_fixture("tiny_gqa", config(False, 48, 72, 2), 1234, torch)
    make_model_fixture("tiny_tied", config(True, 96, 32, 4, head_dim=24), 5678, torch)


if __name__ == "__main__":
    main()
