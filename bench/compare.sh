#!/usr/bin/env bash
# kiln against PyTorch on the same machine, in one go: for each model and
# batch, kiln eager and compiled (mode default) in fp32 and bf16 (`kiln
# bench`), and PyTorch 1.13 eager fp32 and bf16 autocast on 1 and 2 threads
# (bench/torch_small.py, the HF-exact model), the same step (forward +
# backward + clip + AdamW), several repetitions interleaved so that noise
# falls on all of them alike; prints one table of medians (tokens/s, MFU,
# peak RSS MB) with the ratio to PyTorch's best set-up of the same precision.
# MFU: model FLOPs against the fp32 FMA peak kiln probes once at the start
# (bf16 against twice that where the CPU has AVX512-BF16, against the same
# figure where bf16 products are emulated, as kiln bench counts it); every run uses that
# one figure. Beside them, llama.cpp's own trainer (bench/llamacpp_train: llama_opt_epoch of
# node-llama-cpp's prebuilt libllama, AdamW, fp32, 1 and 2 threads) on the same model exported
# as an F32 GGUF and the same tokens, in the same repetitions; the table's last column is
# tokens/s over llama.cpp's best set-up (skipped, with the reason, where its libraries or
# bench/llamacpp_train are missing). Run it on a quiet machine; it takes long (see README).
#
#   (kiln runs with --profile: the table is followed by its step split by op class)
#   bash bench/compare.sh [--reps 3] [--steps 3] [--configs "124m:4x1024 small:8x256"] [--precisions "fp32 bf16"]
#                         [--kiln build/kiln] [--python /usr/bin/python3] [--out DIR] [--quick]
#                         [--llamacpp BUILD/bench/llamacpp_train | --no-llamacpp]
# --quick: tiny:2x64, 1 repetition, 1 step (checks that the script works).
# --precisions fp32: skip the bf16 rows (PyTorch's bf16 autocast takes minutes a step where bf16 is emulated).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=3 steps=3 configs="124m:4x1024 small:8x256" precs="fp32 bf16" kiln=build/kiln py=/usr/bin/python3 out="" llt="" no_llt=0
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2;;
    --steps) steps=$2; shift 2;;
    --configs) configs=$2; shift 2;;
    --precisions) precs=$2; shift 2;;
    --kiln) kiln=$2; shift 2;;
    --python) py=$2; shift 2;;
    --out) out=$2; shift 2;;
    --llamacpp) llt=$2; shift 2;;
    --no-llamacpp) no_llt=1; shift;;
    --quick) configs="tiny:2x64" reps=1 steps=1; shift;;
    -h|--help) sed -n '2,23p' "$0"; exit 0;;
    *) echo "compare.sh: unknown argument '$1' (see --help)" >&2; exit 2;;
  esac
done
for n in "$reps" "$steps"; do
  case "$n" in ''|*[!0-9]*|0) echo "compare.sh: --reps and --steps take a positive integer (got '$n')" >&2; exit 2;; esac
done
[ -x "$kiln" ] || { echo "compare.sh: $kiln not found or not executable (make -j2 all)" >&2; exit 1; }
"$py" -c 'import torch' 2>/dev/null || { echo "compare.sh: $py cannot import torch (scripts/deps.sh installs python3-torch)" >&2; exit 1; }
for c in $configs; do
  case "$c" in *:*x*) ;; *) echo "compare.sh: config '$c' is not MODEL:BATCHxSEQ" >&2; exit 2;; esac
done
[ -n "$precs" ] || { echo "compare.sh: --precisions needs fp32, bf16 or both" >&2; exit 2; }
for p in $precs; do
  case "$p" in fp32|bf16) ;; *) echo "compare.sh: precision '$p' is not fp32 or bf16" >&2; exit 2;; esac
done
[ -n "$out" ] || out=$(mktemp -d /tmp/kiln-compare.XXXXXX)
mkdir -p "$out"
results="$out/results.txt"
: > "$results"

# one fp32 peak for every MFU in the table: kiln's probe, best of five
peak=$("$kiln" bench --model tiny --batch 1 --seq 8 --steps 1 --warmup 1 --modes eager --no-optim --results |
       sed -n 's/^RESULT .* peak_gflops=\([0-9.]*\).*/\1/p' | head -n1)
[ -n "$peak" ] || { echo "compare.sh: could not read the fp32 peak from kiln bench" >&2; exit 1; }
# the bf16 peak: twice that with AVX512-BF16, the same where bf16 is emulated
bf16peak=$("$kiln" bench --model tiny --batch 1 --seq 8 --steps 1 --warmup 1 --modes eager --no-optim --results \
             --precision bf16 --peak "$peak" | sed -n 's/^RESULT .* mfu_peak_gflops=\([0-9.]*\).*/\1/p' | head -n1)
[ -n "$bf16peak" ] || { echo "compare.sh: could not read the bf16 peak from kiln bench" >&2; exit 1; }
echo "fp32 FMA peak (kiln's probe): $peak GFLOP/s, bf16 peak $bf16peak GFLOP/s; logs in $out"

# llama.cpp's trainer: the bench program beside this kiln (BUILD/kiln ->
# BUILD/bench/llamacpp_train), and per model one F32 GGUF of kiln's model
# (its config, random weights: kiln train of one step at lr 1e-9 writes the
# model directory, with a 512-token tokenizer of README.md that kiln export
# pads to the model's vocabulary). Both trainers then read kiln bench's tokens.
# Beside it a rank-1 LoRA adapter of every linear (pad-lora.gguf), which
# llamacpp_train loads and never applies: llama.cpp sizes its scheduler's
# graph for inference, adapters enlarge that budget, and the training graph
# of a model of more than ~2 layers aborts without the room.
[ -n "$llt" ] || llt=$(dirname "$kiln")/bench/llamacpp_train
llt_skip=""
if [ "$no_llt" = 1 ]; then llt_skip="--no-llamacpp"
elif [ ! -x "$llt" ]; then llt_skip="$llt not built (make $llt)"
else
  rc=0; probe=$("$llt" /nonexistent.gguf bench 2>&1 >/dev/null) || rc=$?
  [ "$rc" = 77 ] && llt_skip="${probe#llamacpp_train: skip: }"
fi
llt_gguf() { # MODEL T: makes $out/llamacpp/MODEL/model.gguf once; its log beside it
  local m=$1 T=$2 d="$out/llamacpp/$1"
  [ -f "$d/model.gguf" ] && return 0
  mkdir -p "$d"
  local cfg="import json, sys
sys.path.insert(0, 'bench')
import torch_small as ts
c = ts.load_config(sys.argv[1])
c.update(model_type='llama', architectures=['LlamaForCausalLM'], bos_token_id=0, eos_token_id=1,
         max_position_embeddings=max(int(c.get('max_position_embeddings', 1024)), int(sys.argv[2])))
json.dump(c, open(sys.argv[3], 'w'), indent=1)"
  if "$kiln" tokenizer train README.md --vocab-size 512 -o "$d/tok.json" > "$d/make.log" 2>&1 &&
     "$kiln" tokenize README.md --tokenizer "$d/tok.json" -o "$d/data" >> "$d/make.log" 2>&1 &&
     "$py" -c "$cfg" "$m" "$T" "$d/config.json" >> "$d/make.log" 2>&1 &&
     "$kiln" train --model "$d/config.json" --data "$d/data" --tokenizer "$d/tok.json" --run-dir "$d/run" --steps 1 \
       --batch 1 --accum 1 --seq-len 64 --lr 1e-9 --min-lr 0 --warmup 0 --eval-every 0 --no-plot >> "$d/make.log" 2>&1 &&
     "$kiln" train --init "$d/run" --data "$d/data" --tokenizer "$d/tok.json" --run-dir "$d/lora" --lora-rank 1 \
       --lora-targets all --steps 1 --batch 1 --accum 1 --seq-len 64 --lr 1e-9 --min-lr 0 --warmup 0 --eval-every 0 \
       --no-plot >> "$d/make.log" 2>&1 &&
     "$kiln" export "$d/lora" --gguf-lora "$d/pad-lora.gguf" >> "$d/make.log" 2>&1 &&
     "$kiln" export "$d/run" --gguf "$d/model.gguf" --type f32 >> "$d/make.log" 2>&1; then
    rm -rf "$d/run" "$d/lora" "$d/data"
  else
    echo "  could not make the GGUF of $m: see $d/make.log"
  fi
}
if [ -z "$llt_skip" ]; then echo "llama.cpp's trainer: $llt"; else echo "llama.cpp's trainer: skipped: $llt_skip"; fi

for r in $(seq 1 "$reps"); do
  for c in $configs; do
    model=${c%%:*} bt=${c#*:} B=${bt%x*} T=${bt#*x}
    for prec in $precs; do
      log="$out/kiln-$model-${B}x$T-$prec-$r.txt"
      echo "rep $r: kiln $model ${B}x$T $prec (eager, compiled)"
      if nice "$kiln" bench --model "$model" --batch "$B" --seq "$T" --steps "$steps" --modes eager,default \
           --precision "$prec" --peak "$peak" --results --profile > "$log" 2>&1; then :; else echo "  failed: see $log"; fi
      sed -n "s/^RESULT mode=\([a-z-]*\) /$model ${B}x$T kiln-\1 /p" "$log" |
        sed 's/kiln-default/kiln-compiled/' >> "$results"
      for th in 1 2; do
        log="$out/torch-$model-${B}x$T-$prec-t$th-$r.txt"
        echo "rep $r: pytorch $model ${B}x$T $prec $th thread(s)"
        flag="" p=$peak; [ "$prec" = bf16 ] && flag=--bf16 p=$bf16peak
        if nice "$py" bench/torch_small.py --model "$model" --batch "$B" --seq "$T" --steps "$steps" --threads "$th" \
             --peak "$p" $flag > "$log" 2>&1; then :; else echo "  failed: see $log"; fi
        sed -n "s/^RESULT /$model ${B}x$T pytorch precision=$prec threads=$th /p" "$log" >> "$results"
      done
    done
    if [ -z "$llt_skip" ]; then
      llt_gguf "$model" "$T"
      for th in 1 2; do
        log="$out/llamacpp-$model-${B}x$T-t$th-$r.txt"
        echo "rep $r: llama.cpp $model ${B}x$T fp32 $th thread(s)"
        if [ -f "$out/llamacpp/$model/model.gguf" ] && nice "$llt" "$out/llamacpp/$model/model.gguf" bench --ctx "$T" \
             --batch "$B" --steps "$steps" --warmup 1 --threads "$th" --peak "$peak" --pad-lora "$out/llamacpp/$model/pad-lora.gguf" > "$log" 2>&1; then :
        else echo "  failed: see $log"; fi
        sed -n "s/^RESULT mode=llamacpp /$model ${B}x$T llama.cpp /p" "$log" >> "$results"
      done
    fi
  done
done

"$py" - "$results" "$reps" "$steps" <<'EOF'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 4:
        continue
    kv = dict(x.split("=", 1) for x in f[3:] if "=" in x)
    key = (f[0], f[1], f[2], kv["precision"], int(kv["threads"]))
    rows.setdefault(key, []).append(kv)
def med(v, k):
    return statistics.median(float(x[k]) for x in v)
print("\nmedians of %s repetitions (each the median of %s steps); MFU against kiln's fp32 FMA peak"
      "\n(bf16: 2x with AVX512-BF16, 1x where bf16 products are emulated);"
      "\nthe ratio is tokens/s over PyTorch's best set-up (threads) of the same model, batch and precision;"
      "\nvs llama.cpp: over llama.cpp's trainer's best set-up (threads; fp32) on the same model and batch" %
      (sys.argv[2], sys.argv[3]))
print("%-6s %-8s %-14s %-5s %7s %10s %7s %9s %9s %12s %12s" % ("model", "batch", "engine", "prec", "threads", "tokens/s",
                                                                "MFU", "peak MB", "optim ms", "vs PyTorch", "vs llama.cpp"))
for model_batch in sorted({k[:2] for k in rows}, key=lambda x: x[0]):
    for prec in ("fp32", "bf16"):
        best = max((med(v, "tokens_s") for k, v in rows.items() if k[:2] == model_batch and k[2] == "pytorch"
                    and k[3] == prec), default=0)
        llama = max((med(v, "tokens_s") for k, v in rows.items() if k[:2] == model_batch and k[2] == "llama.cpp"
                     and k[3] == "fp32"), default=0)
        for k in sorted((k for k in rows if k[:2] == model_batch and k[3] == prec), key=lambda k: (k[2], k[4])):
            v = rows[k]
            t = med(v, "tokens_s")
            print("%-6s %-8s %-14s %-5s %7d %10.0f %6.1f%% %9.0f %9.1f %11s %12s" % (
                k[0], k[1], k[2], prec, k[4], t, 100 * med(v, "mfu"), med(v, "peak_mb"), med(v, "optim_ms"),
                "%.2fx" % (t / best) if best > 0 else "n/a",
                "%.2fx" % (t / llama) if llama > 0 and prec == "fp32" else "n/a"))
EOF
# where kiln's step goes: the last repetition's split by op class (kiln bench --profile)
for c in $configs; do
  model=${c%%:*} bt=${c#*:} B=${bt%x*} T=${bt#*x}
  for prec in fp32 bf16; do
    log="$out/kiln-$model-${B}x$T-$prec-$reps.txt"
    [ -f "$log" ] || continue
    for m in eager default; do
      sed -n "/^step time by op class, $m /,/^  rest/p" "$log" | sed "1s/^/\n$model ${B}x$T $prec: /"
    done
  done
done
