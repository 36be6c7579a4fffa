#!/usr/bin/env bash
# Instruction tuning end to end (README "Instruction tuning"): make a tiny
# chat dataset, tokenize it through a chat template with loss masks, fine-tune
# the demo model (runs/demo, from scripts/demo.sh) on it with `train --init`,
# and answer a question with `generate --chat`. Leaves runs/chat/.
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=./build/kiln
[ -x $kiln ] || make -j"$(nproc)" build/kiln
[ -s runs/demo/trainer_state.json ] || { echo "chat_example.sh: runs/demo is missing: run scripts/demo.sh first" >&2; exit 1; }
mkdir -p data/chat
# 480 made-up conversations: 40 capitals, 4 phrasings, some with a system
# message, some with a second turn (a question about another country)
awk 'BEGIN {
  n = split("France Paris|Italy Rome|Spain Madrid|Germany Berlin|Portugal Lisbon|Greece Athens|Egypt Cairo|Japan Tokyo|China Beijing|India Delhi|Russia Moscow|Poland Warsaw|Austria Vienna|Hungary Budapest|Ireland Dublin|Norway Oslo|Sweden Stockholm|Finland Helsinki|Denmark Copenhagen|Belgium Brussels|Peru Lima|Chile Santiago|Cuba Havana|Kenya Nairobi|Ghana Accra|Iran Tehran|Iraq Baghdad|Syria Damascus|Israel Jerusalem|Turkey Ankara|Canada Ottawa|Mexico Mexico City|Brazil Brasilia|Argentina Buenos Aires|Australia Canberra|Nepal Kathmandu|Thailand Bangkok|Vietnam Hanoi|Korea Seoul|Morocco Rabat", pairs, "|")
  split("What is the capital of %s?|Which city is the capital of %s?|Name the capital of %s.|Tell me the capital of %s.", q, "|")
  for (i = 1; i <= n; i++) { k = index(pairs[i], " "); land[i] = substr(pairs[i], 1, k - 1); city[i] = substr(pairs[i], k + 1) }
  for (i = 1; i <= n; i++) for (j = 1; j <= 4; j++) for (r = 0; r < 3; r++) {
    line = "{\"messages\": ["
    if (r == 1) line = line "{\"role\": \"system\", \"content\": \"You answer questions about geography.\"}, "
    line = line sprintf("{\"role\": \"user\", \"content\": \"" q[j] "\"}, ", land[i])
    line = line sprintf("{\"role\": \"assistant\", \"content\": \"The capital of %s is %s.\"}", land[i], city[i])
    if (r == 2) { o = (i * 7 + j) % n + 1
      line = line sprintf(", {\"role\": \"user\", \"content\": \"And of %s?\"}, {\"role\": \"assistant\", \"content\": \"The capital of %s is %s.\"}", land[o], land[o], city[o]) }
    print line "]}"
  } }' > data/chat/chat.jsonl
set -x
$kiln tokenizer render --config docs/examples/chat_tokenizer_config.json docs/examples/question.json --add-generation-prompt
$kiln tokenize data/chat/chat.jsonl --tokenizer runs/demo/tokenizer.json --config docs/examples/chat_tokenizer_config.json -o data/chat
rm -rf runs/chat
$kiln train --init runs/demo --data data/chat --run-dir runs/chat --steps 600 --batch 8 --seq-len 64 \
  --lr 2e-3 --min-lr 2e-4 --warmup 20 --eval-every 200 --eval-batches 4 --save-every 600 --no-plot
$kiln generate runs/chat --chat "What is the capital of Italy?" --temperature 0
$kiln generate runs/chat --chat "Which city is the capital of Kenya?" --system "You answer questions about geography." --temperature 0
