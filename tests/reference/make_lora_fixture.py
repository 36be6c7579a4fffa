#!/usr/bin/python3
"""LoRA reference for kiln: tests/fixtures/lora_ref.safetensors.

Run with Debian's python3 (python3-torch):  /usr/bin/python3 tests/reference/make_lora_fixture.py

PEFT's LoRA forward on the tiny GQA Llama of make_fixtures.py: every targeted
linear computes  F.linear(x, W) + lora_B(lora_A(dropout(x))) * (lora_alpha / r)
(peft.tuners.lora.layer.Linear.forward, dropout p = 0, no rslora/dora), A
initialised as PEFT does (nn.init.kaiming_uniform_(A, a=math.sqrt(5))). B is
drawn non-zero here (PEFT starts it at zero) so the gradient of A is not
trivially zero. The base is frozen: only A and B get gradients.

Writes the base weights (HF names), the adapters under kiln's internal names
(model.layers.L.self_attn.q_proj.lora_A.weight ...), a padded batch, the mean
loss and the gradients of every A and B ("grad." + name); also a second
A drawn by kaiming_uniform_ alone ("init.A", [4, 48]) whose bound the C test
checks kiln's draw against. float32 results are checked against float64 first.
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

R, ALPHA = 4, 8.0
TARGETS = [("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"), ("self_attn", "o_proj"),
           ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj")]


def lora_forward(cfg, p, ad, ids, mask, torch):
    F = torch.nn.functional
    B, T = ids.shape
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim", H // nh)
    n_rep, eps, dt = nh // nkv, cfg["rms_norm_eps"], p["model.norm.weight"].dtype
    scaling = ALPHA / R

    def lin(x, name):
        y = F.linear(x, p[name + ".weight"])
        if name + ".lora_A.weight" in ad:
            y = y + F.linear(F.linear(x, ad[name + ".lora_A.weight"]), ad[name + ".lora_B.weight"]) * scaling
        return y

    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).to(torch.float64) / D))
    emb = torch.cat([torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)] * 2, dim=-1)
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)
    keep = torch.ones(T, T, dtype=torch.bool).tril()[None] & mask.bool()[:, None, :]
    amask = torch.zeros(B, 1, T, T, dtype=dt).masked_fill(~keep[:, None], float("-inf"))
    x = F.embedding(ids.long(), p["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        h = mf.rms_norm(x, p[pre + "input_layernorm.weight"], eps, torch)
        q = lin(h, pre + "self_attn.q_proj").view(B, T, nh, D).transpose(1, 2)
        k = lin(h, pre + "self_attn.k_proj").view(B, T, nkv, D).transpose(1, 2)
        v = lin(h, pre + "self_attn.v_proj").view(B, T, nkv, D).transpose(1, 2)
        q = q * cos + mf.rotate_half(q, torch) * sin
        k = k * cos + mf.rotate_half(k, torch) * sin
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + amask, dim=-1)
        a = (probs @ v).transpose(1, 2).reshape(B, T, nh * D)
        x = x + lin(a, pre + "self_attn.o_proj")
        h = mf.rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps, torch)
        x = x + lin(F.silu(lin(h, pre + "mlp.gate_proj")) * lin(h, pre + "mlp.up_proj"), pre + "mlp.down_proj")
    x = mf.rms_norm(x, p["model.norm.weight"], eps, torch)
    head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    return F.linear(x, head)


def run(cfg, p, ad, ids, mask, labels, torch):
    ad = {k: v.clone().requires_grad_(True) for k, v in ad.items()}
    logits = lora_forward(cfg, p, ad, ids, mask, torch)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), labels.reshape(-1),
                                             ignore_index=-100, reduction="mean")
    names = sorted(ad)
    return loss.detach(), dict(zip(names, torch.autograd.grad(loss, [ad[n] for n in names])))


def main():
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg = mf.config(False, 48, 72, 2)
    gen = torch.Generator().manual_seed(4321)
    p = mf.llama_params(cfg, gen, torch, torch.float32)
    ids, mask, labels = mf.make_batch(cfg, gen, torch)
    torch.manual_seed(99)
    ad = {}
    for l in range(cfg["num_hidden_layers"]):
        for parent, mod in TARGETS:
            name = "model.layers.%d.%s.%s" % (l, parent, mod)
            out_f, in_f = p[name + ".weight"].shape
            A = torch.empty(R, in_f)
            torch.nn.init.kaiming_uniform_(A, a=math.sqrt(5))  # PEFT's reset_lora_parameters
            ad[name + ".lora_A.weight"] = A
            ad[name + ".lora_B.weight"] = 0.05 * torch.randn(out_f, R)
    loss, grads = run(cfg, p, ad, ids, mask, labels, torch)
    loss64, g64 = run(cfg, {k: v.double() for k, v in p.items()}, {k: v.double() for k, v in ad.items()},
                      ids, mask, labels, torch)
    worst = max([mf.rel_err(loss, loss64)] + [mf.rel_err(grads[k], g64[k]) for k in grads])
    print("lora_ref: loss %.6f (f64 %.9f), max rel err f32 vs f64 %.2e" % (loss.item(), loss64.item(), worst))
    if worst > 1e-4:
        raise SystemExit("lora_ref: float32 unstable vs float64")
    init_a = torch.empty(R, 48)
    torch.nn.init.kaiming_uniform_(init_a, a=math.sqrt(5))
    out = dict(p)
    out.update(ad)
    out.update({"input_ids": ids, "attention_mask": mask, "labels": labels, "loss": loss.reshape(1), "init.A": init_a})
    out.update({"grad." + k: g for k, g in grads.items()})
    tensors = [(k, *mf.raw(v, torch)) for k, v in out.items()]
    tensors = [(k, dt, list(out[k].shape), b) for k, dt, b in tensors]
    meta = {"format": "pt", "generator": "tests/reference/make_lora_fixture.py", "r": str(R), "lora_alpha": str(ALPHA),
            "torch": torch.__version__.split("+")[0]}
    mf.write_file(os.path.join(mf.OUT, "lora_ref.safetensors"), mf.st_bytes(tensors, meta))


if __name__ == "__main__":
    main()
