#!/usr/bin/python3
"""tests/fixtures/pref_ref.*: preference-tuning reference (issue 25).

Run with Debian's python3 (python3-torch):  /usr/bin/python3 tests/reference/make_pref_fixture.py

Written from the papers (DPO, Rafailov et al. 2023; IPO, Azar et al. 2023;
SimPO, Meng et al. 2024; ORPO, Hong et al. 2024) and the loss formulas of
TRL v1.9.0 (DPOTrainer._compute_loss for loss_type sigmoid/ipo/hinge,
experimental CPOTrainer.cpo_loss for simpo, experimental
ORPOTrainer.odds_ratio_loss/concatenated_forward); no TRL code is used.

The model is the tiny GQA Llama of make_fixtures.py with LoRA adapters on
q_proj and v_proj (make_lora_fixture.py's forward, r 4, alpha 8, B drawn
non-zero). Policy = base + adapters, reference = the base alone (adapters
off, as TRL's PEFT path). Full fine-tuning: policy = the base with a fixed
random perturbation, reference = the base. Rows 2i / 2i+1 are prompt_i +
chosen_i / prompt_i + rejected_i; labels are kiln's (answer tokens only,
already aligned with the logits). float32 results are checked against a
float64 run of the same (float32) weights. See tests/reference/README.md.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402
import make_lora_fixture as ml  # noqa: E402

SEED = 2525
T = 20
PROMPT = (6, 4, 8)        # prompt lengths of the 3 pairs (first token bos)
CHOSEN = (9, 16, 5)       # answer lengths (each answer ends with eos)
REJECTED = (14, 7, 12)
PAD, BOS, EOS = 2, 1, 0
TARGETS = ("q_proj", "v_proj")
B_STD = 0.2               # LoRA B ~ N(0, B_STD), not zero: policy != reference
FULL_STD = 0.01           # full fine-tuning policy = base + FULL_STD * N(0, 1)
DPO_BETA = 0.1
SIMPO_BETA, SIMPO_GAMMA = 2.0, 1.0
ORPO_BETA = 0.1           # lambda
TRL = "1.9.0"


def make_batch(gen, torch):
    rows, kinds = [], []
    for i in range(len(PROMPT)):
        prompt = [BOS] + torch.randint(3, 61, (PROMPT[i] - 1,), generator=gen).tolist()
        for n in (CHOSEN[i], REJECTED[i]):
            ans = torch.randint(3, 61, (n - 1,), generator=gen).tolist() + [EOS]
            rows.append(prompt + ans)
            kinds.append([0] * len(prompt) + [1] * n)
    P2 = len(rows)
    ids = torch.full((P2, T), PAD, dtype=torch.int64)
    mask = torch.zeros(P2, T, dtype=torch.int64)
    answer = torch.zeros(P2, T, dtype=torch.int64)
    for r, (toks, k) in enumerate(zip(rows, kinds)):
        assert len(toks) <= T
        ids[r, :len(toks)] = torch.tensor(toks)
        mask[r, :len(toks)] = 1
        answer[r, :len(toks)] = torch.tensor(k)
    labels = torch.full((P2, T), -100, dtype=torch.int64)
    labels[:, :-1] = torch.where(answer[:, 1:] == 1, ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    # TRL's ORPO NLL targets every real token after the first (prompt included)
    labels_full = torch.full((P2, T), -100, dtype=torch.int64)
    labels_full[:, :-1] = torch.where(mask[:, 1:] == 1, ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    return ids, mask, labels, labels_full


def row_logps(logits, labels, torch):
    """per row: sum of log softmax(logits)[label] over labels != -100, and that count"""
    lp = torch.log_softmax(logits, dim=-1)
    keep = labels != -100
    tok = lp.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return (tok * keep).sum(-1), keep.sum(-1)


def log1mexp(x, torch):
    """log(1 - exp(x)) for x < 0"""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def dpo_terms(pc, pr, rc, rr, nc, nr, kind, torch):
    F = torch.nn.functional
    dc, dr = pc - rc, pr - rr                       # chosen / rejected log-ratios (summed logps)
    delta = dc - dr
    if kind == "sigmoid":
        losses = -F.logsigmoid(DPO_BETA * delta)
    elif kind == "hinge":
        losses = torch.relu(1 - DPO_BETA * delta)
    elif kind == "ipo":                              # TRL >= 0.20: log-ratios averaged over answer tokens
        losses = (dc / nc - dr / nr - 1 / (2 * DPO_BETA)) ** 2
    else:
        raise ValueError(kind)
    return losses, DPO_BETA * dc.detach(), DPO_BETA * dr.detach()


def compute(cfg, p, ad, full, ids, mask, labels, labels_full, torch):
    """everything the fixture holds, in the dtype of p"""
    out = {}
    names = sorted(ad)
    fnames = sorted(full)
    with torch.no_grad():
        ref_logits = ml.lora_forward(cfg, p, {}, ids, mask, torch)
    ref, n = row_logps(ref_logits, labels, torch)
    n = n.to(ref.dtype)
    rc, rr, nc, nr = ref[0::2], ref[1::2], n[0::2], n[1::2]
    out["ref.logps"] = ref
    out["n_tokens"] = n.to(torch.int64)

    def lora_logits(rows=None):
        a = {k: v.clone().requires_grad_(True) for k, v in ad.items()}
        sl = slice(None) if rows is None else rows
        return a, ml.lora_forward(cfg, p, a, ids[sl], mask[sl], torch)

    def grads(loss, a, prefix, ns):
        g = torch.autograd.grad(loss, [a[k] for k in ns])
        for k, v in zip(ns, g):
            out[prefix + ".grad." + k] = v

    # ---- DPO (LoRA): sigmoid, ipo, hinge
    for kind in ("sigmoid", "ipo", "hinge"):
        a, logits = lora_logits()
        pol, _ = row_logps(logits, labels, torch)
        pc, pr = pol[0::2], pol[1::2]
        losses, rwc, rwr = dpo_terms(pc, pr, rc, rr, nc, nr, kind, torch)
        loss = losses.mean()
        pre = "dpo_" + kind
        out[pre + ".losses"] = losses.detach()
        out[pre + ".loss"] = loss.detach().reshape(1)
        out[pre + ".rewards/chosen"] = rwc
        out[pre + ".rewards/rejected"] = rwr
        out[pre + ".rewards/margins"] = rwc - rwr
        out[pre + ".rewards/accuracies"] = (rwc > rwr).to(rwc.dtype).mean().reshape(1)
        out[pre + ".logps/chosen"] = pc.detach()
        out[pre + ".logps/rejected"] = pr.detach()
        if kind == "sigmoid":
            out["policy.logps"] = pol.detach()
        grads(loss, a, pre, names)

    # ---- DPO sigmoid, accumulated over micro-batches of pairs {0,1} and {2}
    P = len(PROMPT)
    acc_loss, acc_grads = 0.0, None
    for part, pairs in enumerate(((0, 1), (2,))):
        rows = slice(2 * pairs[0], 2 * pairs[-1] + 2)
        a, logits = lora_logits(rows)
        pol, _ = row_logps(logits, labels[rows], torch)
        losses, _, _ = dpo_terms(pol[0::2], pol[1::2], rc[list(pairs)], rr[list(pairs)],
                                 nc[list(pairs)], nr[list(pairs)], "sigmoid", torch)
        loss = losses.sum() / P
        out["dpo_sigmoid_accum.part%d.loss" % part] = loss.detach().reshape(1)
        g = torch.autograd.grad(loss, [a[k] for k in names])
        acc_loss = acc_loss + loss.detach()
        acc_grads = list(g) if acc_grads is None else [x + y for x, y in zip(acc_grads, g)]
    out["dpo_sigmoid_accum.loss"] = acc_loss.reshape(1)
    for k, v in zip(names, acc_grads):
        out["dpo_sigmoid_accum.grad." + k] = v

    # ---- DPO sigmoid, full fine-tuning
    fp = {k: v.clone().requires_grad_(True) for k, v in full.items()}
    pol, _ = row_logps(mf.llama_forward(cfg, fp, ids, mask, torch), labels, torch)
    pc, pr = pol[0::2], pol[1::2]
    losses, rwc, rwr = dpo_terms(pc, pr, rc, rr, nc, nr, "sigmoid", torch)
    loss = losses.mean()
    pre = "dpo_full"
    out[pre + ".losses"] = losses.detach()
    out[pre + ".loss"] = loss.detach().reshape(1)
    out[pre + ".rewards/chosen"] = rwc
    out[pre + ".rewards/rejected"] = rwr
    out[pre + ".rewards/margins"] = rwc - rwr
    out[pre + ".rewards/accuracies"] = (rwc > rwr).to(rwc.dtype).mean().reshape(1)
    out[pre + ".logps/chosen"] = pc.detach()
    out[pre + ".logps/rejected"] = pr.detach()
    out["full.logps"] = pol.detach()
    grads(loss, fp, pre, fnames)

    F = torch.nn.functional

    def policy(lora):
        """the policy's trainable tensors and logits: the adapters, or every weight"""
        if lora:
            a, logits = lora_logits()
            return a, names, logits
        fp = {k: v.clone().requires_grad_(True) for k, v in full.items()}
        return fp, fnames, mf.llama_forward(cfg, fp, ids, mask, torch)

    # ---- DPO ipo and hinge, full fine-tuning (sigmoid: dpo_full above)
    for kind in ("ipo", "hinge"):
        a, ns, logits = policy(False)
        pol, _ = row_logps(logits, labels, torch)
        pc, pr = pol[0::2], pol[1::2]
        losses, rwc, rwr = dpo_terms(pc, pr, rc, rr, nc, nr, kind, torch)
        loss = losses.mean()
        pre = "dpo_%s_full" % kind
        out[pre + ".loss"] = loss.detach().reshape(1)
        out[pre + ".rewards/chosen"] = rwc
        out[pre + ".rewards/rejected"] = rwr
        out[pre + ".rewards/accuracies"] = (rwc > rwr).to(rwc.dtype).mean().reshape(1)
        out[pre + ".logps/chosen"] = pc.detach()
        out[pre + ".logps/rejected"] = pr.detach()
        grads(loss, a, pre, ns)

    # ---- SimPO (CPOTrainer loss_type="simpo", cpo_alpha=0): no reference
    for lora in (True, False):
        a, ns, logits = policy(lora)
        pol, _ = row_logps(logits, labels, torch)
        avg = pol / n
        ac, ar = avg[0::2], avg[1::2]
        losses = -F.logsigmoid(SIMPO_BETA * (ac - ar) - SIMPO_GAMMA)
        loss = losses.mean()
        pre = "simpo" if lora else "simpo_full"
        out[pre + ".losses"] = losses.detach()
        out[pre + ".loss"] = loss.detach().reshape(1)
        out[pre + ".logps/chosen"] = ac.detach()
        out[pre + ".logps/rejected"] = ar.detach()
        out[pre + ".rewards/chosen"] = SIMPO_BETA * ac.detach()
        out[pre + ".rewards/rejected"] = SIMPO_BETA * ar.detach()
        out[pre + ".rewards/accuracies"] = (ac > ar).to(ac.dtype).mean().reshape(1)
        grads(loss, a, pre, ns)

    # ---- ORPO: answer-only NLL (kiln's labels), LoRA and full; and TRL's prompt-inclusive NLL (LoRA)
    for pre, nll_labels, lora in (("orpo", labels, True), ("orpo_full", labels, False), ("orpo_trl", labels_full, True)):
        a, ns, logits = policy(lora)
        pol, _ = row_logps(logits, labels, torch)
        avg = pol / n
        ac, ar = avg[0::2], avg[1::2]
        log_odds = (ac - ar) - (log1mexp(ac, torch) - log1mexp(ar, torch))
        or_losses = -F.logsigmoid(log_odds)
        cl = nll_labels[0::2]
        nll = F.cross_entropy(logits[0::2].reshape(-1, cfg["vocab_size"]), cl.reshape(-1),
                              ignore_index=-100, reduction="mean")   # mean over all chosen targets of the batch
        loss = nll + ORPO_BETA * or_losses.mean()
        out[pre + ".nll"] = nll.detach().reshape(1)
        out[pre + ".loss"] = loss.detach().reshape(1)
        if pre != "orpo_trl":
            out[pre + ".log_odds"] = log_odds.detach()
            out[pre + ".or_losses"] = or_losses.detach()
            out[pre + ".logps/chosen"] = ac.detach()
            out[pre + ".logps/rejected"] = ar.detach()
            out[pre + ".rewards/chosen"] = ORPO_BETA * ac.detach()
            out[pre + ".rewards/rejected"] = ORPO_BETA * ar.detach()
            out[pre + ".rewards/accuracies"] = (ac > ar).to(ac.dtype).mean().reshape(1)
        grads(loss, a, pre, ns)
    return out


def main():
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg = mf.config(False, 48, 72, 2)
    gen = torch.Generator().manual_seed(SEED)
    p = mf.llama_params(cfg, gen, torch, torch.float32)
    ids, mask, labels, labels_full = make_batch(gen, torch)
    ad = {}
    torch.manual_seed(SEED)   # kaiming_uniform_ draws from the global generator (PEFT's init)
    for l in range(cfg["num_hidden_layers"]):
        for mod in TARGETS:
            name = "model.layers.%d.self_attn.%s" % (l, mod)
            out_f, in_f = p[name + ".weight"].shape
            A = torch.empty(ml.R, in_f)
            torch.nn.init.kaiming_uniform_(A, a=math.sqrt(5))
            ad[name + ".lora_A.weight"] = A
            ad[name + ".lora_B.weight"] = B_STD * torch.randn(out_f, ml.R, generator=gen)
    full = {k: (v.double() + FULL_STD * torch.randn(v.shape, generator=gen, dtype=torch.float64)).float()
            for k, v in sorted(p.items())}

    res = compute(cfg, p, ad, full, ids, mask, labels, labels_full, torch)
    d = lambda m: {k: v.double() for k, v in m.items()}
    res64 = compute(cfg, d(p), d(ad), d(full), ids, mask, labels, labels_full, torch)
    worst, wname = 0.0, ""
    for k, v in res.items():
        if v.dtype == torch.int64 or "accuracies" in k:
            if not torch.equal(v, res64[k].to(v.dtype)):
                raise SystemExit("pref_ref: %s differs in float64" % k)
            continue
        e = mf.rel_err(v, res64[k])
        if e > worst:
            worst, wname = e, k
    acc = (res["dpo_sigmoid_accum.loss"] - res["dpo_sigmoid.loss"]).abs().item()
    print("pref_ref: dpo sigmoid %.6f ipo %.6f hinge %.6f full %.6f simpo %.6f orpo %.6f orpo_trl %.6f; "
          "accum-big %.1e; max rel err f32 vs f64 %s %.2e"
          % tuple([res[k].item() for k in ("dpo_sigmoid.loss", "dpo_ipo.loss", "dpo_hinge.loss",
                                           "dpo_full.loss", "simpo.loss", "orpo.loss", "orpo_trl.loss")]
                  + [acc, wname, worst]))
    if worst > 1e-4:
        raise SystemExit("pref_ref: float32 unstable vs float64")

    out = dict(p)
    out.update(ad)
    out.update({"full.policy." + k: v for k, v in full.items()})
    out.update({"input_ids": ids, "attention_mask": mask, "labels": labels, "labels_orpo_trl": labels_full})
    out.update(res)
    tensors = [(k, *mf.raw(v, torch)) for k, v in out.items()]
    tensors = [(k, dt, list(out[k].shape), b) for k, dt, b in tensors]
    meta = {"format": "pt", "generator": "tests/reference/make_pref_fixture.py", "seed": str(SEED),
            "torch": torch.__version__.split("+")[0], "trl_formulas": TRL,
            "r": str(ml.R), "lora_alpha": str(ml.ALPHA), "target_modules": ",".join(TARGETS),
            "dpo_beta": str(DPO_BETA), "simpo_beta": str(SIMPO_BETA), "simpo_gamma": str(SIMPO_GAMMA),
            "orpo_beta": str(ORPO_BETA)}
    mf.write_file(os.path.join(mf.OUT, "pref_ref.safetensors"), mf.st_bytes(tensors, meta))
    with open(os.path.join(mf.OUT, "pref_ref.config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    scal = {k: round(v.item(), 8) for k, v in sorted(res.items()) if v.numel() == 1 and v.dtype != torch.int64}
    with open(os.path.join(mf.OUT, "pref_ref.results.json"), "w") as f:
        json.dump(scal, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
