#!/usr/bin/python3
"""Checkpoints as people ship them, made from tests/fixtures/tiny_gqa.safetensors.

Run with Debian's python3 (it has python3-torch):  /usr/bin/python3 tests/reference/make_dtype_fixtures.py
Output is bit-identical on every run.

  tiny_gqa_f16/{config.json,model.safetensors}    the F32 weights rounded by torch to float16
  tiny_gqa_bf16/{config.json,model.safetensors}   ... to bfloat16
  tiny_gqa_sharded/{config.json,model.safetensors.index.json,model-0000{1,2,3}-of-00003.safetensors}
                                                  the F32 weights in three shards, cut as the
                                                  Hugging Face library cuts them (parameters in
                                                  module order, a new file when the next would pass
                                                  max_shard_size = 64000 bytes)
  tiny_gqa_dtypes.json                            the loss of each on the fixture's batch, computed
                                                  by torch with the stored weights upcast to float32
                                                  (what loading into float32 parameters gives)
"""
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_fixtures import OUT, llama_forward, write_file  # noqa: E402

RANK = {"F16": 11, "BF16": 12, "I32": 13, "F32": 15}
SIZE = {"F16": 2, "BF16": 2, "I32": 4, "F32": 4}


def read_st(path, torch):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = bytearray(data[base + b:base + end])
        dt = {"F32": torch.float32, "I32": torch.int32}[e["dtype"]]
        out[name] = torch.frombuffer(raw, dtype=dt).reshape(e["shape"]).clone() if raw else torch.zeros(e["shape"], dtype=dt)
    return out


def raw_bytes(t, torch):
    t = t.detach().contiguous().reshape(-1)
    dt = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}[t.dtype]
    return dt, bytes(t.view(torch.uint8).tolist())


def st_bytes(tensors, metadata):
    """tensors: list of (name, dtype, shape, bytes); the Rust library's layout."""
    order = sorted(tensors, key=lambda t: (-RANK[t[1]], t[0].encode("utf-8")))
    header = {"__metadata__": {k: metadata[k] for k in sorted(metadata)}}
    pos = 0
    for name, dtype, shape, raw in order:
        assert len(raw) == math.prod(shape) * SIZE[dtype], name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + len(raw)]}
        pos += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in order)


def module_order(cfg):
    """Parameter names in LlamaForCausalLM's state_dict order."""
    names = ["model.embed_tokens.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        names += [p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight",
                  p + "self_attn.o_proj.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                  p + "mlp.down_proj.weight", p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not cfg["tie_word_embeddings"]:
        names.append("lm_head.weight")
    return names


def loss_of(cfg, params, fx, torch):
    with torch.no_grad():
        logits = llama_forward(cfg, params, fx["input_ids"], fx["attention_mask"], torch)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), fx["labels"].long().reshape(-1),
                                                 ignore_index=-100).item()


def write_dir(name, cfg, files):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    for fname, data in files.items():
        write_file(os.path.join(d, fname), data)
    write_file(os.path.join(d, "config.json"), (json.dumps(cfg, indent=2, sort_keys=True) + "\n").encode())


def main():
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with open(os.path.join(OUT, "tiny_gqa.config.json")) as f:
        cfg = json.load(f)
    fx = read_st(os.path.join(OUT, "tiny_gqa.safetensors"), torch)
    names = module_order(cfg)
    p32 = {k: fx[k] for k in names}
    meta = {"format": "pt", "generator": "tests/reference/make_dtype_fixtures.py",
            "torch": torch.__version__.split("+")[0]}
    losses = {"f32": loss_of(cfg, p32, fx, torch)}

    for tag, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        pd = {k: v.to(dt) for k, v in p32.items()}
        c = dict(cfg, torch_dtype={"f16": "float16", "bf16": "bfloat16"}[tag])
        tensors = [(k, *raw_bytes(v, torch)) for k, v in pd.items()]
        tensors = [(k, d, list(pd[k].shape), b) for k, d, b in tensors]
        write_dir("tiny_gqa_" + tag, c, {"model.safetensors": st_bytes(tensors, meta)})
        losses[tag] = loss_of(cfg, {k: v.to(torch.float32) for k, v in pd.items()}, fx, torch)

    max_shard = 64000
    shards, cur, size = [], [], 0
    for k in names:
        b = p32[k].numel() * 4
        if cur and size + b > max_shard:
            shards.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += b
    shards.append(cur)
    files, weight_map = {}, {}
    for i, ks in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        files[fname] = st_bytes([(k, "F32", list(p32[k].shape), raw_bytes(p32[k], torch)[1]) for k in ks], meta)
        weight_map.update({k: fname for k in ks})
    index = {"metadata": {"total_size": sum(p32[k].numel() * 4 for k in names)},
             "weight_map": {k: weight_map[k] for k in sorted(weight_map)}}
    files["model.safetensors.index.json"] = (json.dumps(index, indent=2) + "\n").encode()
    write_dir("tiny_gqa_sharded", cfg, files)
    losses["sharded"] = losses["f32"]
    print("shards: %s" % [len(s) for s in shards])

    for k, v in losses.items():
        print("%-8s loss %.9f  (vs f32: %+.3e relative)" % (k, v, (v - losses["f32"]) / losses["f32"]))
    write_file(os.path.join(OUT, "tiny_gqa_dtypes.json"),
               (json.dumps({k: float("%.9g" % v) for k, v in losses.items()}, indent=2, sort_keys=True) + "\n").encode())


if __name__ == "__main__":
    main()
