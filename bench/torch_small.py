#!/usr/bin/python3
"""PyTorch reference benchmark for `kiln bench`: the same Llama, the same
step (forward + backward, then clip_grad_norm_ and AdamW, as kiln bench and
kiln train run it), with the HF-exact model code of
tests/reference/make_fixtures.py. Run with Debian's python3-torch (1.13):
    /usr/bin/python3 bench/torch_small.py [--model small|124m|demo|tiny|config.json]
        [--batch 8] [--seq 256] [--steps 5] [--threads N] [--bf16] [--peak GFLOPS]
Prints ms/step, tokens/s and the optimiser's share (medians), MFU against
--peak (the peak of the precision run, as `kiln bench --results` prints it
in mfu_peak_gflops, so both use one figure: for bf16 twice the fp32 FMA peak
where the CPU has AVX512-BF16, the fp32 peak where it has not) and peak
memory (ru_maxrss). The last line is one machine-readable record:
    RESULT tokens_s=... mfu=... peak_mb=... ms=... optim_ms=..."""
import argparse, json, math, os, resource, sys, time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
import torch  # noqa: E402
import make_fixtures as mf  # noqa: E402

# kiln's named configs (src/model/config.c, kiln_llama_config_preset)
BASE = {"rms_norm_eps": 1e-5, "rope_theta": 10000.0, "initializer_range": 0.02, "tie_word_embeddings": False,
        "vocab_size": 8192}
PRESETS = {
    "tiny": {"hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2, "num_attention_heads": 4},
    "small": {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8,
              "tie_word_embeddings": True},
    "demo": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 4096, "tie_word_embeddings": True},
    "124m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
             "vocab_size": 32000, "tie_word_embeddings": True},
}
SUPPORTED = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
             "initializer_range", "max_position_embeddings", "model_type", "architectures", "torch_dtype",
             "hidden_act", "bos_token_id", "eos_token_id", "pad_token_id", "transformers_version",
             "attention_bias", "mlp_bias", "use_cache", "pretraining_tp", "rope_scaling", "attention_dropout"}


def load_config(name):
    if name in PRESETS:
        cfg = dict(BASE, **PRESETS[name])
    elif os.path.exists(name) or name.endswith(".json") or "/" in name:
        try:
            with open(name) as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit("torch_small.py: %s: %s" % (name, e))
        for k, v in raw.items():
            if k not in SUPPORTED:
                sys.exit("torch_small.py: %s: field '%s' is not supported by this benchmark" % (name, k))
        for k in ("attention_bias", "mlp_bias"):
            if raw.get(k):
                sys.exit("torch_small.py: %s: %s = true is not supported by this benchmark" % (name, k))
        if raw.get("rope_scaling"):
            sys.exit("torch_small.py: %s: rope_scaling is not supported by this benchmark" % name)
        cfg = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "initializer_range": 0.02, "tie_word_embeddings": False}
        cfg.update(raw)
        for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if not isinstance(cfg.get(k), int) or cfg[k] <= 0:
                sys.exit("torch_small.py: %s: field '%s' must be a positive integer (got %r)" % (name, k, cfg.get(k)))
    else:
        sys.exit("torch_small.py: unknown model '%s' (%s, or a config.json path)" % (name, ", ".join(PRESETS)))
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return cfg


def flops_per_token(c, T):
    """kiln_llama_flops_per_token (src/model/llama.c): 6 x matmul parameters
    (a tied head counted once as a product) + 6 x layers x T x query width
    (causal attention counted as executed)."""
    C, qd, kd, I = c["hidden_size"], c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"], \
        c["intermediate_size"]
    n_mm = c["num_hidden_layers"] * (2 * C * qd + 2 * C * kd + 3 * C * I) + c["vocab_size"] * C
    return 6.0 * n_mm + 6.0 * c["num_hidden_layers"] * T * qd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small", help="tiny, small (default), demo, 124m or a config.json")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="intra-op threads (default: all cores)")
    ap.add_argument("--bf16", action="store_true", help='torch.autocast("cpu", dtype=torch.bfloat16)')
    ap.add_argument("--peak", type=float, default=0.0, help="peak GFLOP/s of the precision run, for MFU (kiln bench --results prints it as mfu_peak_gflops)")
    ap.add_argument("--no-optim", action="store_true", help="forward + backward only")
    a = ap.parse_args()
    if a.steps < 1 or a.batch < 1 or a.seq < 2 or a.threads < 1 or a.warmup < 0:
        sys.exit("torch_small.py: --steps, --batch, --threads must be >= 1, --seq >= 2, --warmup >= 0")
    torch.set_num_threads(a.threads)
    cfg = load_config(a.model)
    V = cfg["vocab_size"]
    gen = torch.Generator().manual_seed(0)
    params = {k: v.requires_grad_(True) for k, v in mf.llama_params(cfg, gen, torch, torch.float32).items()}
    n_params = sum(p.numel() for p in params.values())
    # kiln's defaults (include/kiln/train.h): lr 1e-3, betas 0.9/0.95, eps 1e-8,
    # weight decay 0.1 on matrices but not the embedding (nor a head tied to it)
    decay = [p for k, p in params.items() if p.dim() >= 2 and k != "model.embed_tokens.weight"]
    other = [p for k, p in params.items() if not (p.dim() >= 2 and k != "model.embed_tokens.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    B, T = a.batch, a.seq
    ids = torch.randint(0, V, (B, T), generator=gen)
    labels = torch.randint(0, V, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.int64)
    times, opt_times = [], []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
            logits = mf.llama_forward(cfg, params, ids, mask, torch)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, V), labels.reshape(-1))
        loss.backward()
        t1 = time.perf_counter()
        if not a.no_optim:
            torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=False)
        t2 = time.perf_counter()
        if i >= a.warmup:
            times.append(t2 - t0)
            opt_times.append(t2 - t1)
    times.sort()
    opt_times.sort()
    med, omed = times[len(times) // 2], opt_times[len(opt_times) // 2]
    tok_s = B * T / med
    flops = flops_per_token(cfg, T) * B * T
    peak = a.peak
    mfu = flops / med / 1e9 / peak if peak > 0 else float("nan")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # Linux: KiB
    prec = "bf16 autocast" if a.bf16 else "fp32"
    print("pytorch %s eager %s, model %s (%.2fM parameters), batch %d x %d, %d threads" %
          (torch.__version__, prec, a.model, n_params / 1e6, B, T, torch.get_num_threads()))
    print("  %.1f ms/step (optimiser %.1f ms, %.1f%%), %.0f tokens/s, %.1f GFLOP/s, MFU %s, peak RSS %.0f MB (median of %d)"
          % (med * 1e3, omed * 1e3, 100 * omed / med, tok_s, flops / med / 1e9,
             "%.1f%%" % (100 * mfu) if not math.isnan(mfu) else "n/a (no --peak)", peak_mb, a.steps))
    print("RESULT tokens_s=%.1f mfu=%.4f peak_mb=%.0f ms=%.1f optim_ms=%.2f" % (tok_s, mfu, peak_mb, med * 1e3, omed * 1e3))


if __name__ == "__main__":
    main()
