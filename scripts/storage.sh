#!/usr/bin/env bash
# The device seam, checked (docs/DESIGN.md, "Devices"): outside src/backend/,
# src/kernels/ and core's tensor.c, no file reads or writes tensor storage
# itself. Host code moves bytes with kiln_tensor_set / _get / _copy, maps a
# host-mappable tensor with kiln_tensor_map, and hands device addresses
# (kiln_tensor_ptr) only to code that runs inside kiln_backend_exec. Flagged:
# the raw element accessors kiln_f32( / kiln_i32(, a tensor's ->data, and a
# cast of kiln_tensor_ptr (an address turned into something to dereference).
# Prints each offending line; exits 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
pat='kiln_f32\(|kiln_i32\(|->data\b|\*\) *kiln_tensor_ptr\('
hits=$(grep -nE "$pat" $(find src -name '*.c' -o -name '*.h' | grep -v -e '^src/backend/' -e '^src/kernels/' -e '^src/core/tensor.c$' | sort) || true)
# rooms without a kiln_tensor (their ->data is a file's or a buffer's), and
# the run settings' `data` path (kiln_train_config)
hits=$(grep -vE '^src/(tokenizer|template|data|formats)/' <<<"$hits" | grep -vE '\b(c|cfg)->data\b' | grep -v '^$' || true)
for room in tokenizer template data formats; do
  if grep -qw kiln_tensor src/$room/*.c; then echo "storage: src/$room now uses kiln_tensor: check it too"; exit 1; fi
done
if [ -n "$hits" ]; then
  echo "tensor storage touched outside the backends (use kiln_tensor_get/set/copy/map):"
  echo "$hits"
  echo "storage: $(wc -l <<<"$hits") lines"
  exit 1
fi
echo "storage: no tensor storage touched outside src/backend, src/kernels and core"
