#!/usr/bin/env bash
# Preference tuning end to end (README "Preference tuning"): make preference
# pairs in TRL's conversational form, tokenize them through the chat template,
# tune the instruction-tuned model (runs/chat, from scripts/chat_example.sh)
# with DPO on LoRA adapters, and answer with `generate --chat`. Leaves
# runs/pref/.
#
# runs/chat answers "The capital of Italy is Rome."; the pairs prefer the
# shorter "The capital is Rome." (chosen) to that sentence (rejected).
# Held-out pairs are chosen by phrasing, not by tokenize's hash split: the 160
# training pairs ask about the 40 countries in 4 phrasings, the 40 validation
# pairs in a fifth ("What's the capital of X?") that training never sees. Each
# part is tokenized with --val-frac 0 and the held-out part's shard becomes
# data/pref/val.bin.
#
# beta is 1.0, not TRL's 0.1: with 0.1 this tiny, very confident model lowers
# the rejected answers until its greedy answers degenerate ("The capita is",
# "The capitalalal") before the chosen style wins.
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=./build/kiln
[ -x $kiln ] || make -j"$(nproc)" build/kiln
[ -s runs/chat/trainer_state.json ] || { echo "pref_example.sh: runs/chat is missing: run scripts/chat_example.sh first" >&2; exit 1; }
caps="France Paris|Italy Rome|Spain Madrid|Germany Berlin|Portugal Lisbon|Greece Athens|Egypt Cairo|Japan Tokyo|China Beijing|India Delhi|Russia Moscow|Poland Warsaw|Austria Vienna|Hungary Budapest|Ireland Dublin|Norway Oslo|Sweden Stockholm|Finland Helsinki|Denmark Copenhagen|Belgium Brussels|Peru Lima|Chile Santiago|Cuba Havana|Kenya Nairobi|Ghana Accra|Iran Tehran|Iraq Baghdad|Syria Damascus|Israel Jerusalem|Turkey Ankara|Canada Ottawa|Mexico Mexico City|Brazil Brasilia|Argentina Buenos Aires|Australia Canberra|Nepal Kathmandu|Thailand Bangkok|Vietnam Hanoi|Korea Seoul|Morocco Rabat"
mkdir -p data/pref
awk -v caps="$caps" 'BEGIN {
  n = split(caps, pairs, "|")
  split("What is the capital of %s?|Which city is the capital of %s?|Name the capital of %s.|Tell me the capital of %s.|What'"'"'s the capital of %s?", q, "|")
  for (i = 1; i <= n; i++) { k = index(pairs[i], " "); land = substr(pairs[i], 1, k - 1); city = substr(pairs[i], k + 1)
    for (j = 1; j <= 5; j++) {
      line = sprintf("{\"prompt\": [{\"role\": \"user\", \"content\": \"" q[j] "\"}], ", land)
      line = line sprintf("\"chosen\": [{\"role\": \"assistant\", \"content\": \"The capital is %s.\"}], ", city)
      line = line sprintf("\"rejected\": [{\"role\": \"assistant\", \"content\": \"The capital of %s is %s.\"}]}", land, city)
      print line > (j == 5 ? "data/pref/heldout.jsonl" : "data/pref/train.jsonl")
    } } }'
set -x
head -1 data/pref/train.jsonl
$kiln tokenize data/pref/train.jsonl --tokenizer runs/demo/tokenizer.json --config docs/examples/chat_tokenizer_config.json \
  --val-frac 0 -o data/pref
$kiln tokenize data/pref/heldout.jsonl --tokenizer runs/demo/tokenizer.json --config docs/examples/chat_tokenizer_config.json \
  --val-frac 0 -o data/pref/heldout
mv data/pref/heldout/train.bin data/pref/val.bin
rm -rf runs/pref
$kiln train --init runs/chat --data data/pref --run-dir runs/pref --objective dpo --beta 1.0 --pack pairs \
  --lora-rank 8 --lora-alpha 16 --batch 16 --accum 1 --seq-len 48 --steps 40 --lr 2e-3 --min-lr 1e-4 --warmup 4 \
  --eval-every 10 --eval-batches 0 --save-every 40 --no-plot
tail -1 runs/pref/metrics.jsonl
$kiln generate runs/pref --chat "What is the capital of Italy?" --temperature 0
$kiln generate runs/pref --chat "What's the capital of Kenya?" --temperature 0
{ set +x; } 2>/dev/null
# every held-out question, greedy: how many answers take the chosen form, and
# how many of those name the right city
styled=0 right=0 wrong=""
IFS='|' read -ra list <<< "$caps"
for p in "${list[@]}"; do
  land=${p%% *} city=${p#* }
  a=$($kiln generate runs/pref --chat "What's the capital of $land?" --temperature 0 --max-tokens 20 2>/dev/null)
  case "$a" in " The capital is "*) styled=$((styled + 1)) ;; esac
  if [ "$a" = " The capital is $city." ]; then right=$((right + 1)); else wrong="$wrong  $land:$a"$'\n'; fi
done
echo "held-out questions: $styled of ${#list[@]} answers in the chosen form, $right with the right city; the others:"
printf '%s' "$wrong"
