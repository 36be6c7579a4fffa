#!/usr/bin/python3
"""Reference fixtures for the model families kiln reads from config.json.

Run with Debian's python3 (it has python3-torch):
    /usr/bin/python3 tests/reference/make_family_fixtures.py
Output is bit-identical on every run (fixed seeds, one thread).

Writes tests/fixtures/family_<name>.{config.json,safetensors} for
  llama3   LlamaForCausalLM, rope_scaling llama3 (all three frequency bands hit),
           attention_bias + mlp_bias, head_dim 16 with hidden 48 (decoupled), GQA
  linear   LlamaForCausalLM, rope_scaling linear (factor 2), tied embeddings
  mistral  MistralForCausalLM, one kv head (n_rep 4), sliding_window 64 >= T
  qwen2    Qwen2ForCausalLM, q/k/v biases (no o_proj bias), tied embeddings
  qwen3    Qwen3ForCausalLM, q_norm/k_norm (RMSNorm over head_dim before RoPE),
           head_dim 16 with hidden 48 (decoupled)
Each file holds the parameters, the batch, logits, loss and every gradient,
laid out as the Llama fixtures of make_fixtures.py (see README.md).

The forward is written out in plain torch with Hugging Face semantics for each
family (transformers' modeling_{llama,mistral,qwen2,qwen3}.py and
_compute_{linear_scaling,llama3}_parameters in modeling_rope_utils.py); the
transformers package itself is not needed.

    make_family_fixtures.py --check DIR NAME [DIR NAME ...]
reads a checkpoint kiln wrote (DIR/config.json, DIR/model.safetensors) the way
Hugging Face would: the family comes from config.json alone (model_type,
architectures), every field of fixture NAME's config must survive, the tensors
must be exactly the ones that family's model has, and its forward on the
fixture's batch must give the logits kiln computed with those weights
(DIR/kiln_logits.safetensors, 1e-4 relative). Each pair ends with a line
"check NAME: passed" or "check NAME: failed" (one process for all of them:
importing torch takes seconds); exit status 0 when every one passed.
"""
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_fixtures import OUT, make_batch, raw, rel_err, rms_norm, rotate_half, st_bytes, write_file  # noqa: E402

ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
GEMMA = ("gemma2", "gemma3_text")


def head_dim(cfg):
    # Qwen3Config defaults head_dim to 128; the others to hidden / heads
    d = cfg.get("head_dim")
    if d is None:
        d = 128 if cfg["model_type"] == "qwen3" else cfg["hidden_size"] // cfg["num_attention_heads"]
    return d


def switches(cfg):
    """Which optional tensors a family's layers have (HF's constructors)."""
    mt = cfg["model_type"]
    ab = bool(cfg.get("attention_bias", False)) if mt in ("llama", "qwen3") + GEMMA else False
    return {
        "qkv_bias": ab or mt == "qwen2",
        "o_bias": ab,
        "mlp_bias": bool(cfg.get("mlp_bias", False)) if mt == "llama" else False,
        "qk_norm": mt in ("qwen3", "gemma3_text"),
        "gemma": mt in GEMMA,
    }


def param_shapes(cfg):
    """Every tensor of the family's CausalLM state dict, with its shape."""
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    sw = switches(cfg)
    s = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        s[pre + "input_layernorm.weight"] = [H]
        s[pre + "post_attention_layernorm.weight"] = [H]
        if sw["gemma"]:  # Gemma2DecoderLayer: norms before and after both blocks
            s[pre + "pre_feedforward_layernorm.weight"] = [H]
            s[pre + "post_feedforward_layernorm.weight"] = [H]
        for n, (o, k) in {"q": (nh * D, H), "k": (nkv * D, H), "v": (nkv * D, H), "o": (H, nh * D)}.items():
            s[pre + "self_attn.%s_proj.weight" % n] = [o, k]
            if (n != "o" and sw["qkv_bias"]) or (n == "o" and sw["o_bias"]):
                s[pre + "self_attn.%s_proj.bias" % n] = [o]
        if sw["qk_norm"]:
            s[pre + "self_attn.q_norm.weight"] = [D]
            s[pre + "self_attn.k_norm.weight"] = [D]
        for n, (o, k) in {"gate": (I, H), "up": (I, H), "down": (H, I)}.items():
            s[pre + "mlp.%s_proj.weight" % n] = [o, k]
            if sw["mlp_bias"]:
                s[pre + "mlp.%s_proj.bias" % n] = [o]
    if not cfg.get("tie_word_embeddings", False):
        s["lm_head.weight"] = [V, H]
    return s


def make_params(cfg, gen, torch):
    """Weights ~ N(0, initializer_range); biases ~ N(0, 0.05) (HF starts them
    at zero; random ones make their effect and gradients visible); norm
    weights 1 + 0.1 N(0, 1) (Gemma's, which scale by 1 + w: 0.1 N(0, 1)).
    Drawn in sorted name order, rounded to float32."""
    std = cfg["initializer_range"]
    one = 0.0 if cfg["model_type"] in GEMMA else 1.0
    p = {}
    for name, shape in sorted(param_shapes(cfg).items()):
        if name.endswith("norm.weight"):
            p[name] = one + 0.1 * torch.randn(*shape, generator=gen, dtype=torch.float64)
        elif name.endswith(".bias"):
            p[name] = 0.05 * torch.randn(*shape, generator=gen, dtype=torch.float64)
        else:
            p[name] = std * torch.randn(*shape, generator=gen, dtype=torch.float64)
    return {k: v.to(torch.float32) for k, v in p.items()}


def inv_freq(cfg, D, torch, local=False):
    """modeling_rope_utils: default, linear and llama3 (float64 here). local:
    Gemma 3's sliding layers (rotary_emb_local: rope_local_base_freq, no
    scaling)."""
    base = cfg["rope_local_base_freq"] if local else cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).to(torch.float64) / D))
    rs = None if local else cfg.get("rope_scaling")
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / rs["factor"]
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        out = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        return torch.where(medium, smoothed, out)
    raise SystemExit("rope_scaling type %r is not part of this reference" % kind)


def lin(x, p, name, F):
    return F.linear(x, p[name + ".weight"], p.get(name + ".bias"))


def gemma_sliding(cfg, li):
    """Gemma: layer_types when given, else every sliding_window_pattern-th
    layer attends fully (Gemma2: 2, Gemma3TextConfig: 6)."""
    if cfg.get("layer_types"):
        return cfg["layer_types"][li] == "sliding_attention"
    pattern = cfg.get("sliding_window_pattern", 2 if cfg["model_type"] == "gemma2" else 6)
    return bool((li + 1) % pattern)


def softcap(x, cap, torch):
    return torch.tanh(x / cap) * cap


def forward(cfg, p, input_ids, attention_mask, torch):
    F = torch.nn.functional
    B, T = input_ids.shape
    nh, nkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    n_rep, eps = nh // nkv, cfg["rms_norm_eps"]
    dt = p["model.norm.weight"].dtype
    sw = switches(cfg)
    qk_norm, gemma = sw["qk_norm"], sw["gemma"]

    def rope_tables(local):
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(cfg, D, torch, local))
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dt), emb.sin().to(dt)

    tables = {False: rope_tables(False)}
    if cfg["model_type"] == "gemma3_text":
        tables[True] = rope_tables(True)

    def norm(x, w):  # Gemma's RMSNorm scales by (1 + w)
        return rms_norm(x, 1.0 + w if gemma else w, eps, torch)

    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]

    def mask_of(window):
        keep = j <= i
        if window is not None:
            keep = keep & (i - j < window)   # HF's sliding window: keys within the last `window` positions
        keep = keep[None, :, :] & attention_mask.bool()[:, None, :]
        return torch.zeros(B, 1, T, T, dtype=dt).masked_fill(~keep[:, None], float("-inf"))

    def layer_window(li):
        if cfg["model_type"] == "mistral":
            return cfg.get("sliding_window")
        if cfg["model_type"] in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
            # layer_types: the first max_window_layers layers attend fully, the rest slide
            return cfg.get("sliding_window") if li >= cfg.get("max_window_layers", 0) else None
        if gemma:
            return cfg["sliding_window"] if gemma_sliding(cfg, li) else None
        return None

    x = F.embedding(input_ids.long(), p["model.embed_tokens.weight"])
    if gemma:  # Gemma2Model: the embeddings times sqrt(hidden) in their dtype
        x = x * torch.tensor(cfg["hidden_size"] ** 0.5, dtype=dt)
    # Gemma: scores times query_pre_attn_scalar ** -0.5, the others over sqrt(head_dim)
    scaling = cfg["query_pre_attn_scalar"] ** -0.5 if gemma else None
    for li in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % li
        window = layer_window(li)
        cos, sin = tables[cfg["model_type"] == "gemma3_text" and window is not None]
        h = norm(x, p[pre + "input_layernorm.weight"])
        q = lin(h, p, pre + "self_attn.q_proj", F).view(B, T, nh, D)
        k = lin(h, p, pre + "self_attn.k_proj", F).view(B, T, nkv, D)
        v = lin(h, p, pre + "self_attn.v_proj", F).view(B, T, nkv, D)
        if qk_norm:  # Qwen3, Gemma3: RMSNorm over each head's D features, before RoPE
            q = norm(q, p[pre + "self_attn.q_norm.weight"])
            k = norm(k, p[pre + "self_attn.k_norm.weight"])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q, torch) * sin
        k = k * cos + rotate_half(k, torch) * sin
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
        mask = mask_of(window)
        scores = (q @ k.transpose(-1, -2)) * scaling if gemma else q @ k.transpose(-1, -2) / math.sqrt(D)
        if gemma and cfg.get("attn_logit_softcapping"):
            scores = softcap(scores, cfg["attn_logit_softcapping"], torch)
        scores = scores + mask
        # a query that sees no key (a padding position whose window holds only
        # padding) gets zeros, as kiln's softmax of an all -inf row: no NaN
        seen = (mask > float("-inf")).any(-1, keepdim=True)
        probs = torch.softmax(torch.where(seen, scores, torch.zeros_like(scores)), dim=-1) * seen
        a = (probs @ v).transpose(1, 2).reshape(B, T, nh * D)
        a = lin(a, p, pre + "self_attn.o_proj", F)
        if gemma:
            x = x + norm(a, p[pre + "post_attention_layernorm.weight"])
            h = norm(x, p[pre + "pre_feedforward_layernorm.weight"])
            m = F.gelu(lin(h, p, pre + "mlp.gate_proj", F), approximate="tanh") * lin(h, p, pre + "mlp.up_proj", F)
            x = x + norm(lin(m, p, pre + "mlp.down_proj", F), p[pre + "post_feedforward_layernorm.weight"])
            continue
        x = x + a
        h = norm(x, p[pre + "post_attention_layernorm.weight"])
        m = F.silu(lin(h, p, pre + "mlp.gate_proj", F)) * lin(h, p, pre + "mlp.up_proj", F)
        x = x + lin(m, p, pre + "mlp.down_proj", F)
    x = norm(x, p["model.norm.weight"])
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else p["lm_head.weight"]
    logits = F.linear(x, head)
    if gemma and cfg.get("final_logit_softcapping"):
        logits = softcap(logits, cfg["final_logit_softcapping"], torch)
    return logits


def run(cfg, params, ids, mask, labels, torch):
    params = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    logits = forward(cfg, params, ids, mask, torch)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), labels.reshape(-1),
                                             ignore_index=-100, reduction="mean")
    names = sorted(params)
    grads = torch.autograd.grad(loss, [params[n] for n in names])
    return logits.detach(), loss.detach(), dict(zip(names, grads))


def base_config(model_type, **kw):
    c = {
        "architectures": [ARCH[model_type]],
        "model_type": model_type,
        "vocab_size": 61,
        "hidden_size": 48,
        "intermediate_size": 40,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 0,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    c.update(kw)
    return c


def configs():
    return {
        # wavelengths 2pi/inv_freq for D=16, theta 1e4: 6.3, 19.9, 62.8, ...: with
        # original_max_position_embeddings 32, low 1, high 4 the first stays
        # (< 8), the second is interpolated (8..32), the rest are divided by 8
        "llama3": base_config("llama", head_dim=16, attention_bias=True, mlp_bias=True, pretraining_tp=1,
                              eos_token_id=[0, 3],
                              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
        "linear": base_config("llama", tie_word_embeddings=True, rope_scaling={"type": "linear", "factor": 2.0}),
        "mistral": base_config("mistral", num_key_value_heads=1, sliding_window=64, rope_theta=1000000.0),
        "qwen2": base_config("qwen2", tie_word_embeddings=True, use_sliding_window=False, sliding_window=64,
                             max_window_layers=2, rope_theta=1000000.0, rms_norm_eps=1e-6),
        "qwen3": base_config("qwen3", head_dim=16, attention_bias=False, tie_word_embeddings=True,
                             use_sliding_window=False, sliding_window=None, max_window_layers=2, rms_norm_eps=1e-6),
    }


def extra_configs():
    """Families with sliding windows shorter than the sequence (T 37), with
    their own seeds (the seeds of configs() follow its sorted names)."""
    return {
        "mistral_swa": (200, base_config("mistral", num_key_value_heads=1, sliding_window=7, rope_theta=1000000.0)),
        # layer 0 attends fully, layer 1 slides (max_window_layers 1)
        "qwen2_swa": (201, base_config("qwen2", tie_word_embeddings=True, use_sliding_window=True, sliding_window=5,
                                       max_window_layers=1, rope_theta=1000000.0, rms_norm_eps=1e-6,
                                       layer_types=["full_attention", "sliding_attention"])),
        # Gemma 2: layers 0 and 2 slide (window 5), layer 1 attends fully; both
        # soft-caps at values the (larger than HF) weights reach; head_dim 16 x 4
        # heads != hidden 48, query_pre_attn_scalar 24 != head_dim
        "gemma2": (202, gemma_config("gemma2", num_hidden_layers=3, sliding_window=5, query_pre_attn_scalar=24,
                                     attn_logit_softcapping=0.5, final_logit_softcapping=1.5)),
        # Gemma 3: q/k norms, attention biases, every 3rd layer full (layers 0, 1
        # slide with rope_local_base_freq, layer 2 uses rope_theta with linear
        # scaling), window 6
        "gemma3": (203, gemma_config("gemma3_text", num_hidden_layers=3, sliding_window=6, sliding_window_pattern=3,
                                     query_pre_attn_scalar=16, attention_bias=True, rope_theta=1000000.0,
                                     rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
                                     final_logit_softcapping=None, attn_logit_softcapping=None)),
    }


def gemma_config(model_type, **kw):
    c = base_config(model_type, head_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-6, initializer_range=0.2,
                    hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=1, bos_token_id=2)
    del c["hidden_act"]
    c.update(kw)
    return c


def make_fixture(name, cfg, seed, torch):
    gen = torch.Generator().manual_seed(seed)
    p32 = make_params(cfg, gen, torch)
    ids, mask, labels = make_batch(cfg, gen, torch)
    logits, loss, grads = run(cfg, p32, ids, mask, labels, torch)
    l64, loss64, g64 = run(cfg, {k: v.double() for k, v in p32.items()}, ids, mask, labels, torch)
    worst = [("logits", rel_err(logits, l64)), ("loss", rel_err(loss, loss64))]
    worst += [("grad." + k, rel_err(grads[k], g64[k])) for k in grads]
    print("family_%s: loss %.6f, max rel err f32 vs f64: %s %.2e" % (name, loss.item(), *max(worst, key=lambda w: w[1])))
    bad = [(k, e) for k, e in worst if e > 1e-4]
    if bad:
        raise SystemExit("%s: float32 results unstable vs float64: %s" % (name, bad))
    out = dict(p32)
    out.update({"input_ids": ids, "attention_mask": mask, "labels": labels, "logits": logits, "loss": loss.reshape(1)})
    out.update({"grad." + k: g for k, g in grads.items()})
    tensors = [(k, *raw(v, torch)) for k, v in out.items()]
    tensors = [(k, dt, list(out[k].shape), b) for k, dt, b in tensors]
    meta = {"format": "pt", "generator": "tests/reference/make_family_fixtures.py",
            "torch": torch.__version__.split("+")[0], "seed": str(seed)}
    write_file(os.path.join(OUT, "family_%s.safetensors" % name), st_bytes(tensors, meta))
    with open(os.path.join(OUT, "family_%s.config.json" % name), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------- read-back
def read_st(path, torch):
    """safetensors -> {name: tensor} (F32, I32, BF16, F16), no library."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    kinds = {"F32": torch.float32, "I32": torch.int32, "BF16": torch.bfloat16, "F16": torch.float16}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = bytearray(data[base + a:base + b])
        t = torch.frombuffer(buf, dtype=kinds[info["dtype"]]) if buf else torch.zeros(0, dtype=kinds[info["dtype"]])
        out[name] = t.reshape(info["shape"]).float() if info["dtype"] != "I32" else t.reshape(info["shape"])
    return out


def check(model_dir, name, torch):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(OUT, "family_%s.config.json" % name)) as f:
        ref_cfg = json.load(f)
    problems = []
    mt = cfg.get("model_type")
    if mt not in ARCH:
        problems.append("model_type %r" % mt)
    elif cfg.get("architectures") != [ARCH[mt]]:
        problems.append("architectures %r for model_type %s" % (cfg.get("architectures"), mt))
    # every field of the original config that shapes the model survives the save
    def canon(k, v):  # HF reads rope_scaling's "type" as "rope_type"
        if k == "rope_scaling" and isinstance(v, dict) and "type" in v:
            v = dict(v)
            v.setdefault("rope_type", v.pop("type"))
        return v

    for k, v in ref_cfg.items():
        if k in ("torch_dtype", "use_cache", "transformers_version"):
            continue
        if canon(k, cfg.get(k)) != canon(k, v):
            problems.append("%s: saved %r, original %r" % (k, cfg.get(k), v))
    if problems:
        print("check %s: config.json differs: %s" % (name, "; ".join(problems)))
        return 1
    weights = read_st(os.path.join(model_dir, "model.safetensors"), torch)
    want = param_shapes(cfg)
    missing = sorted(set(want) - set(weights))
    extra = sorted(set(weights) - set(want))
    shapes = sorted(k for k in want if k in weights and list(weights[k].shape) != want[k])
    if missing or extra or shapes:
        print("check %s: tensors missing %s, unexpected %s, mis-shaped %s" % (name, missing, extra, shapes))
        return 1
    fix = read_st(os.path.join(OUT, "family_%s.safetensors" % name), torch)
    with torch.no_grad():
        logits = forward(cfg, weights, fix["input_ids"], fix["attention_mask"], torch)
    kiln_logits = read_st(os.path.join(model_dir, "kiln_logits.safetensors"), torch)["logits"]
    moved = rel_err(fix["logits"], kiln_logits)  # the weights are kiln's own (trained), not the fixture's
    if moved < 1e-3:
        print("check %s: the saved weights still give the fixture's logits (%.3g): nothing was trained" % (name, moved))
        return 1
    e = rel_err(logits, kiln_logits)
    print("check %s: %s read back as %s, %d tensors, logits max rel error %.3g" % (name, model_dir, mt, len(weights), e))
    return 0 if e < 1e-4 else 1


def main():
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if len(sys.argv) >= 4 and len(sys.argv) % 2 == 0 and sys.argv[1] == "--check":
        failed = 0
        for model_dir, name in zip(sys.argv[2::2], sys.argv[3::2]):
            rc = check(model_dir, name, torch)
            print("check %s: %s" % (name, "failed" if rc else "passed"))
            failed += rc != 0
        sys.exit(1 if failed else 0)
    only = sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "--only" else None
    if len(sys.argv) != 1 and only is None:
        raise SystemExit("usage: make_family_fixtures.py [--only NAME ...] [--check MODEL_DIR NAME [MODEL_DIR NAME ...]]")
    os.makedirs(OUT, exist_ok=True)
    todo = [(name, cfg, seed) for seed, (name, cfg) in enumerate(sorted(configs().items()), start=100)]
    todo += [(name, cfg, seed) for name, (seed, cfg) in sorted(extra_configs().items())]
    for name, cfg, seed in todo:
        if only is None or name in only:
            make_fixture(name, cfg, seed, torch)


if __name__ == "__main__":
    main()
