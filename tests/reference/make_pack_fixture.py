#!/usr/bin/python3
"""tests/fixtures/pack_ref.*: documents packed into rows (--pack documents)
for tests/test_pack.c. A token stream of documents, each ending with eos,
is cut as kiln's loader documents it: each document's inputs (all its tokens
but the closing eos) in pieces of at most T, the pieces put whole into rows
in file order, each into the first of the last 8 open rows with room, the
rest of a row padding. Per token: position_ids restarting at 0 at each
piece (Hugging Face's DataCollatorWithFlattening convention) and a segment
id; labels[t] = the next token of the same document, -100 on padding.
The Llama forward is make_fixtures.py's, with RoPE at position_ids and the
attention mask block-diagonal (causal, key not padding, same segment), as
flash-attention's varlen path computes packed sequences in transformers.
Run with Debian's python: /usr/bin/python3 tests/reference/make_pack_fixture.py"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

T = 32
OPEN_ROWS = 8


def pack(docs):
    """docs: lists of tokens ending with eos -> rows of (doc, start, length) pieces"""
    rows, free = [], []
    for d, toks in enumerate(docs):
        n = len(toks) - 1
        for o in range(0, n, T):
            ln = min(T, n - o)
            r = max(0, len(rows) - OPEN_ROWS)
            while r < len(rows) and free[r] < ln:
                r += 1
            if r == len(rows):
                rows.append([])
                free.append(T)
            rows[r].append((d, o, ln))
            free[r] -= ln
    return rows


def forward(cfg, p, ids, attn, pos, seg, torch):
    F = torch.nn.functional
    B, T_ = ids.shape
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim", H // nh)
    n_rep, eps = nh // nkv, cfg["rms_norm_eps"]
    dt = p["model.norm.weight"].dtype
    # RoPE at each token's position (in float64, as make_fixtures.py forms the angles)
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).to(torch.float64) / D))
    freqs = pos.to(torch.float64)[:, :, None] * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dt)[:, None], emb.sin().to(dt)[:, None]  # B x 1 x T x D
    causal = torch.ones(T_, T_, dtype=torch.bool).tril()
    keep = causal[None] & attn.bool()[:, None, :] & (seg[:, :, None] == seg[:, None, :])
    mask = torch.zeros(B, 1, T_, T_, dtype=dt).masked_fill(~keep[:, None], float("-inf"))
    x = F.embedding(ids.long(), p["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        h = mf.rms_norm(x, p[pre + "input_layernorm.weight"], eps, torch)
        q = F.linear(h, p[pre + "self_attn.q_proj.weight"]).view(B, T_, nh, D).transpose(1, 2)
        k = F.linear(h, p[pre + "self_attn.k_proj.weight"]).view(B, T_, nkv, D).transpose(1, 2)
        v = F.linear(h, p[pre + "self_attn.v_proj.weight"]).view(B, T_, nkv, D).transpose(1, 2)
        q = q * cos + mf.rotate_half(q, torch) * sin
        k = k * cos + mf.rotate_half(k, torch) * sin
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D) + mask
        # a padding query sees no key: its row is all -inf; HF's kernels give 0 there
        probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        a = (probs @ v).transpose(1, 2).reshape(B, T_, nh * D)
        x = x + F.linear(a, p[pre + "self_attn.o_proj.weight"])
        h = mf.rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps, torch)
        m = F.silu(F.linear(h, p[pre + "mlp.gate_proj.weight"])) * F.linear(h, p[pre + "mlp.up_proj.weight"])
        x = x + F.linear(m, p[pre + "mlp.down_proj.weight"])
    x = mf.rms_norm(x, p["model.norm.weight"], eps, torch)
    head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    return F.linear(x, head)


def main():
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg = mf.config(False, 48, 72, 2)
    eos = cfg["eos_token_id"]
    gen = torch.Generator().manual_seed(1357)
    p32 = mf.llama_params(cfg, gen, torch, torch.float32)
    docs = []
    for _ in range(9):  # 2..45 inputs: short ones share rows, long ones are cut
        n = int(torch.randint(3, 47, (1,), generator=gen))
        docs.append([int(t) for t in torch.randint(3, cfg["vocab_size"], (n - 1,), generator=gen)] + [eos])
    stream = [t for d in docs for t in d]
    rows = pack(docs)
    B = len(rows)
    ids = torch.full((B, T), 2, dtype=torch.int64)
    labels = torch.full((B, T), -100, dtype=torch.int64)
    attn = torch.zeros(B, T, dtype=torch.int64)
    pos = torch.zeros(B, T, dtype=torch.int64)
    seg = torch.zeros(B, T, dtype=torch.int64)
    for r, pieces in enumerate(rows):
        at = 0
        for s, (d, o, ln) in enumerate(pieces):
            for t in range(ln):
                ids[r, at + t] = docs[d][o + t]
                labels[r, at + t] = docs[d][o + t + 1]
                attn[r, at + t] = 1
                pos[r, at + t] = t
                seg[r, at + t] = s + 1
            at += ln
        for t in range(at, T):
            pos[r, t] = t
    params = {k: v.clone().requires_grad_(True) for k, v in p32.items()}
    logits = forward(cfg, params, ids, attn, pos, seg, torch)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), labels.reshape(-1),
                                             ignore_index=-100, reduction="mean")
    names = sorted(params)
    grads = dict(zip(names, torch.autograd.grad(loss, [params[n] for n in names])))
    print("pack_ref: %d documents, %d tokens in %d rows of %d, loss %.6f over %d targets"
          % (len(docs), len(stream), B, T, loss.item(), int((labels != -100).sum())))
    out = dict(p32)
    out.update({"stream": torch.tensor(stream, dtype=torch.int64), "input_ids": ids, "labels": labels,
                "attention_mask": attn, "position_ids": pos, "segment_ids": seg, "logits": logits.detach(),
                "loss": loss.detach().reshape(1)})
    out.update({"grad." + k: g for k, g in grads.items()})
    tensors = [(k, *mf.raw(v, torch)) for k, v in out.items()]
    tensors = [(k, dt, list(out[k].shape), b) for k, dt, b in tensors]
    meta = {"format": "pt", "generator": "tests/reference/make_pack_fixture.py",
            "torch": torch.__version__.split("+")[0], "seed": "1357"}
    mf.write_file(os.path.join(mf.OUT, "pack_ref.safetensors"), mf.st_bytes(tensors, meta))
    with open(os.path.join(mf.OUT, "pack_ref.config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
