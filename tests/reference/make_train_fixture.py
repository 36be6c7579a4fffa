#!/usr/bin/python3
"""Writes tests/fixtures/train_ref.{safetensors,config.json}: six optimiser
steps of a tiny Llama trained by the textbook PyTorch loop (token-normalised
gradient accumulation, clip_grad_norm_, torch.optim.AdamW with two parameter
groups, warm-up + cosine learning rate), for tests/test_train_torch.c.

Run with Debian's python3 (it has python3-torch):
    /usr/bin/python3 tests/reference/make_train_fixture.py
Output is bit-identical on every run (fixed seed, one thread, float32 on CPU).

The model code (init, forward, safetensors writer) is make_fixtures.py's.
The same loop also runs in float64 from the same float32 weights; the script
fails if the float32 results drift from it by more than 2e-5 relative, so the
test's 1e-4 bar measures kiln and not float32 noise.
"""
import json
import math
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import OUT, config, llama_forward, llama_params, raw, rel_err, st_bytes, write_file  # noqa: E402

SEED = 2
B, T, PAD = 2, 16, 2
# Right padding per micro-batch and row: every count differs, so the number
# of target tokens differs between rows, micro-batches and windows.
PADS = [(0, 5), (3, 11), (8, 1), (2, 6), (12, 0), (4, 9), (7, 3)]
ACCUM, EPOCHS = 3, 2
LR, MIN_LR, WARMUP = 3e-3, 3e-4, 2
BETAS, EPS, WEIGHT_DECAY, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0
# Init std (HF's initializer_range), smaller than the usual 0.02 so that the
# pre-clip gradient norm starts below CLIP and grows above it: some steps
# clip and some do not.
INIT_STD = 0.003


def windows():
    """Micro-batch indices of each optimiser step: windows of ACCUM, the
    last of each epoch cut short by the end of the data."""
    out = []
    for _ in range(EPOCHS):
        for start in range(0, len(PADS), ACCUM):
            out.append(list(range(start, min(start + ACCUM, len(PADS)))))
    return out


TOTAL = len(windows())


def lr_at(step):
    """Linear warm-up, then cosine from LR to MIN_LR at TOTAL (as kiln_lr_at)."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    p = min(1.0, (step - WARMUP) / (TOTAL - WARMUP))
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1.0 + math.cos(math.pi * p))


def make_micro_batches(cfg, gen, torch):
    """labels[b, t] = ids[b, t+1] if mask[b, t+1] else -100; last position -100."""
    out = []
    for pads in PADS:
        ids = torch.randint(3, cfg["vocab_size"], (B, T), generator=gen, dtype=torch.int64)
        mask = torch.ones(B, T, dtype=torch.int64)
        for r, n in enumerate(pads):
            if n:
                mask[r, T - n:] = 0
                ids[r, T - n:] = PAD
        labels = torch.full((B, T), -100, dtype=torch.int64)
        labels[:, :-1] = torch.where(mask[:, 1:] == 1, ids[:, 1:], torch.full_like(ids[:, 1:], -100))
        out.append((ids, mask, labels))
    return out


def train(cfg, init, mbs, torch, dtype):
    """The textbook loop. Returns per-step (loss, lr, pre-clip norm) and the final weights."""
    F = torch.nn.functional
    params = {k: torch.nn.Parameter(v.clone().to(dtype)) for k, v in init.items()}
    decay = [p for k, p in params.items() if p.ndim == 2 and k != "model.embed_tokens.weight"]
    no_decay = [p for k, p in params.items() if not (p.ndim == 2 and k != "model.embed_tokens.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=False)
    V = cfg["vocab_size"]
    steps = []
    for s, win in enumerate(windows()):
        n_tokens = sum(int((mbs[i][2] != -100).sum()) for i in win)
        total = 0.0
        for i in win:
            ids, mask, labels = mbs[i]
            logits = llama_forward(cfg, params, ids, mask, torch)
            summed = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100, reduction="sum")
            total += float(summed.item())
            loss = summed / n_tokens
            loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)
        lr = lr_at(s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad()
        steps.append((total / n_tokens, lr, float(norm.item())))
    return steps, {k: p.detach() for k, p in params.items()}


def main():
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg = config(False, 48, 32, 2)
    cfg["initializer_range"] = INIT_STD
    gen = torch.Generator().manual_seed(SEED)
    init = llama_params(cfg, gen, torch, torch.float32)
    mbs = make_micro_batches(cfg, gen, torch)

    steps, final = train(cfg, init, mbs, torch, torch.float32)
    steps64, final64 = train(cfg, init, mbs, torch, torch.float64)
    for s, ((loss, lr, norm), (l64, _, n64)) in enumerate(zip(steps, steps64)):
        print("step %d: loss %.7f  lr %.6g  grad norm %.6f%s   (f64: loss %.9f norm %.9f)"
              % (s, loss, lr, norm, "  clipped" if norm > CLIP else "", l64, n64))
    worst = [("loss", max(abs(a[0] - b[0]) / abs(b[0]) for a, b in zip(steps, steps64))),
             ("grad_norm", max(abs(a[2] - b[2]) / abs(b[2]) for a, b in zip(steps, steps64)))]
    worst += [("final." + k, rel_err(final[k], final64[k])) for k in final]
    name, err = max(worst, key=lambda x: x[1])
    print("max rel err f32 vs f64: %s %.2e" % (name, err))
    if err > 2e-5:
        raise SystemExit("float32 training unstable vs float64 (%s %.2e): the 1e-4 test bar would be noise" % (name, err))
    clipped = [s for s, st in enumerate(steps) if st[2] > CLIP]
    if not clipped or len(clipped) == len(steps):
        raise SystemExit("clipping should trigger on some steps but not all: %s" % clipped)

    out = dict(init)
    out.update({"final." + k: v for k, v in final.items()})
    for i, (ids, mask, labels) in enumerate(mbs):
        out.update({"mb.%d.input_ids" % i: ids, "mb.%d.attention_mask" % i: mask, "mb.%d.labels" % i: labels})
    for j, key in enumerate(("step_loss", "step_lr", "step_grad_norm")):
        out[key] = torch.tensor([st[j] for st in steps], dtype=torch.float32)
    tensors = [(k, *raw(v, torch)) for k, v in out.items()]
    tensors = [(k, dt, list(out[k].shape), b) for k, dt, b in tensors]
    meta = {"format": "pt", "generator": "tests/reference/make_train_fixture.py",
            "torch": torch.__version__.split("+")[0], "seed": str(SEED),
            "accum": str(ACCUM), "epochs": str(EPOCHS), "steps": str(TOTAL),
            "lr": repr(LR), "min_lr": repr(MIN_LR), "warmup": str(WARMUP),
            "betas": "%r,%r" % BETAS, "eps": repr(EPS), "weight_decay": repr(WEIGHT_DECAY),
            "clip": repr(CLIP), "clipped_steps": ",".join(map(str, clipped))}
    write_file(os.path.join(OUT, "train_ref.safetensors"), st_bytes(tensors, meta))
    with open(os.path.join(OUT, "train_ref.config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
