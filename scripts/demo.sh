#!/usr/bin/env bash
# The main job: install what kiln needs, build it, make the default corpus
# (the King James Bible from Debian's bible-kjv), train a byte-level BPE
# tokenizer, tokenize, train a small Llama with gradient accumulation for a
# few minutes, then print a sample. Leaves runs/demo/ with checkpoints,
# metrics.jsonl and loss.svg. Extra arguments go to `kiln train`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
make -j"$(nproc)" build/kiln
kiln=./build/kiln
mkdir -p data
[ -s data/kjv.txt ] || bash scripts/corpus.sh data/kjv.txt
[ -s data/tokenizer.json ] || $kiln tokenizer train data/kjv.txt --vocab-size 4096 -o data/tokenizer.json
[ -s data/kjv/train.bin ] || $kiln tokenize data/kjv.txt --tokenizer data/tokenizer.json -o data/kjv
rm -rf runs/demo
$kiln train --data data/kjv --tokenizer data/tokenizer.json --run-dir runs/demo --model demo \
  --batch 8 --accum 4 --seq-len 128 --steps 360 --warmup 20 --lr 2e-3 --min-lr 2e-4 \
  --eval-every 40 --eval-batches 16 --save-every 120 "$@"
echo
echo "== sample =="
$kiln generate runs/demo --prompt "And God said" --max-tokens 80 --temperature 0.8 --top-k 40 --seed 7
echo
echo "run directory: runs/demo (model.safetensors, config.json, tokenizer.json, metrics.jsonl, loss.svg)"
