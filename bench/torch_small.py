#!/usr/bin/python3
"""PyTorch reference benchmark for `kiln bench`: the same 'small' Llama
(vocab 8192, hidden 512, intermediate 1376, 8 layers, 8 heads, tied), batch
8 x 256, forward + backward per step, with the HF-exact model code of
tests/reference/make_fixtures.py. Run with Debian's python3-torch:
    /usr/bin/python3 bench/torch_small.py [--steps 5] [--seq 256]
Prints ms/step and tokens/s (median), as `kiln bench` does."""
import argparse, os, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
import torch  # noqa: E402
import make_fixtures as mf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads (default: all cores)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = {"vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8,
           "num_attention_heads": 8, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "initializer_range": 0.02}
    gen = torch.Generator().manual_seed(0)
    params = {k: v.requires_grad_(True) for k, v in mf.llama_params(cfg, gen, torch, torch.float32).items()}
    B, T = a.batch, a.seq
    ids = torch.randint(0, 8192, (B, T), generator=gen)
    labels = torch.randint(0, 8192, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.int64)
    times = []
    for i in range(a.steps + 1):
        t0 = time.perf_counter()
        logits = mf.llama_forward(cfg, params, ids, mask, torch)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 8192), labels.reshape(-1))
        loss.backward()
        dt = time.perf_counter() - t0
        if i:
            times.append(dt)
    times.sort()
    med = times[len(times) // 2]
    print("pytorch %s eager, %d threads: %.1f ms/step, %.0f tokens/s (median of %d)"
          % (torch.__version__, torch.get_num_threads(), med * 1e3, B * T / med, a.steps))


if __name__ == "__main__":
    main()
