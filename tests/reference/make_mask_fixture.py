#!/usr/bin/python3
"""tests/fixtures/mask_ref.*: a loss-masked batch (instruction tuning) for
tests/test_chat.c. A token stream of 3*24+1 tokens carries a loss mask made
of alternating context and target runs, as a chat shard has (prompt, answer,
prompt, ...); packed rows of 24 give input_ids = stream[:-1] and
labels[t] = stream[t+1] where loss_mask[t+1] == 1, else -100 (ignored), as
Hugging Face's DataCollatorForCompletionOnlyLM builds them. The Llama forward
and the mean cross-entropy with ignore_index=-100 are make_fixtures.py's.
Run with Debian's python: /usr/bin/python3 tests/reference/make_mask_fixture.py"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402


def main():
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg = mf.config(False, 48, 72, 2)
    gen = torch.Generator().manual_seed(2468)
    p32 = mf.llama_params(cfg, gen, torch, torch.float32)
    B, T = 3, 24
    n = B * T + 1
    stream = torch.randint(3, cfg["vocab_size"], (n,), generator=gen, dtype=torch.int64)
    mask = torch.zeros(n, dtype=torch.int64)
    pos, target = 0, False
    while pos < n:  # context and target runs of 2..9 tokens
        run = int(torch.randint(2, 10, (1,), generator=gen))
        mask[pos:pos + run] = int(target)
        pos, target = pos + run, not target
    ids = stream[:-1].reshape(B, T)
    labels = torch.where(mask[1:] == 1, stream[1:], torch.full_like(stream[1:], -100)).reshape(B, T)
    attn = torch.ones(B, T, dtype=torch.int64)
    logits, loss, grads = mf.run_model(cfg, p32, ids, attn, labels, torch)
    print("mask_ref: loss %.6f over %d of %d targets" % (loss.item(), int((labels != -100).sum()), B * T))
    out = dict(p32)
    out.update({"stream": stream, "loss_mask": mask, "labels": labels, "loss": loss.reshape(1)})
    out.update({"grad." + k: g for k, g in grads.items()})
    tensors = [(k, *mf.raw(v, torch)) for k, v in out.items()]
    tensors = [(k, dt, list(out[k].shape), b) for k, dt, b in tensors]
    meta = {"format": "pt", "generator": "tests/reference/make_mask_fixture.py",
            "torch": torch.__version__.split("+")[0], "seed": "2468"}
    mf.write_file(os.path.join(mf.OUT, "mask_ref.safetensors"), mf.st_bytes(tensors, meta))
    with open(os.path.join(mf.OUT, "mask_ref.config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
