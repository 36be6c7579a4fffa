#!/usr/bin/env bash
# Prints, for each layer under src/, the kiln headers its files include
# (docs/DESIGN.md's layer table says which are allowed), and exits 1 if a
# layer includes a header of a layer it may not use.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A allowed=(
  [core]="core opmath"
  [kernels]="core kernels simd quant opmath"
  [ops]="core kernels simd quant ops backend"
  [eager]="core ops eager"
  [graph]="core kernels simd quant ops graph backend"
  [compile]="core kernels simd quant ops graph compile build backend"
  [backend]="core kernels simd quant ops graph compile build backend opmath"
  [model]="core ops model"
  [tokenizer]="core tokenizer"
  [template]="core template"
  [formats]="core tokenizer safetensors gguf model_meta"
  [data]="core tokenizer template data"
  [train]="core kernels simd quant ops eager graph compile build model tokenizer template data safetensors gguf model_meta train backend"
  [cli]="core kernels simd quant ops eager graph compile build model tokenizer template data safetensors gguf model_meta train backend"
)
bad=0
for layer in core kernels ops eager graph compile backend model tokenizer template formats data train cli; do
  used=$(grep -rho '#include "kiln/[a-z_]*\.h"' --include='*.[ch]' src/$layer 2>/dev/null | sed 's/#include "kiln\///; s/\.h"//' | sort -u | tr '\n' ' ')
  extra=""
  for h in $used; do [[ " ${allowed[$layer]} " == *" $h "* ]] || extra+="$h "; done
  printf '%-8s includes: %s\n' "$layer" "$used"
  if [ -n "$extra" ]; then echo "  NOT ALLOWED: $extra"; bad=1; fi
done
exit $bad
