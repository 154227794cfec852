#!/usr/bin/env bash
# Compiles every CubeCL kernel for sm_80 and sm_90a with NVRTC, on a
# machine without a GPU or a CUDA toolkit: the kernels' `cuda_source` test
# writes the CUDA C++ that CubeCL's CUDA compiler makes of each launch,
# then scripts/nvrtc_compile.py compiles it with NVIDIA's NVRTC from PyPI
# and prints each kernel's registers, spills and, disassembled with
# nvdisasm, the instructions of its matrix-unit kernels' main loop.
#
#   scripts/cuda_compile_check.sh [--json OUT] [--sources DIR]
#
#   --json OUT     also write the per-kernel report as JSON
#   --sources DIR  compile the sources already written there (CI sets
#                  FERROTRON_CUDA_SOURCE_DIR for its test run) instead of
#                  running the test
#
# NVRTC, the CUDA headers, CCCL and nvdisasm (NVIDIA's wheels, pinned
# below, about 145 MB) are unpacked once into FERROTRON_NVRTC_DIR (default
# ~/.cache/ferrotron/nvrtc-12.9). Exits 1 if a kernel does not compile,
# 2 on a bad argument.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '8,13p' "$0" >&2; exit 2; }
json=() sources=""
while [ $# -gt 0 ]; do
  case "$1" in
    --json) [ $# -ge 2 ] || usage; json=(--json "$2"); shift 2 ;;
    --sources) [ $# -ge 2 ] || usage; sources="$2"; shift 2 ;;
    *) echo "cuda_compile_check.sh: unknown argument '$1'" >&2; usage ;;
  esac
done

cache="${FERROTRON_NVRTC_DIR:-$HOME/.cache/ferrotron/nvrtc-12.9}"
wheels=(
  nvidia-cuda-nvrtc-cu12==12.9.86   # libnvrtc (with ptxas inside)
  nvidia-cuda-runtime-cu12==12.9.79 # cuda_runtime.h, cuda_bf16.h, mma.h
  nvidia-cuda-nvcc-cu12==12.9.86    # crt/mma.h, which mma.h includes
  nvidia-cuda-cccl-cu12==12.9.27    # cuda/barrier and friends
  nvidia-cuda-nvdisasm==13.5.37     # nvdisasm (cu13/bin), reads 12.9's cubins
)
if [ ! -e "$cache/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ] ||
  [ ! -e "$cache/nvidia/cu13/bin/nvdisasm" ]; then
  echo "unpacking NVRTC 12.9 into $cache"
  rm -rf "$cache" && mkdir -p "$cache/wheels"
  if python3 -m pip --version >/dev/null 2>&1; then
    pip=(python3 -m pip)
  else # Debian's python3 without python3-pip
    python3 -m venv "$cache/venv"
    pip=("$cache/venv/bin/pip")
  fi
  "${pip[@]}" download -q --no-deps -d "$cache/wheels" "${wheels[@]}"
  for wheel in "$cache"/wheels/*.whl; do
    python3 -m zipfile -e "$wheel" "$cache/unpacked"
  done
  mv "$cache/unpacked/nvidia" "$cache/nvidia"
  chmod +x "$cache/nvidia/cu13/bin/nvdisasm"
  # Only the headers, libnvrtc and nvdisasm are used; nvcc's binaries are not.
  rm -rf "$cache/wheels" "$cache/unpacked" "$cache/venv" "$cache/nvidia/cuda_nvcc/bin"
fi

if [ -z "$sources" ]; then
  sources="$(mktemp -d)"
  trap 'rm -rf "$sources"' EXIT
  FERROTRON_CUDA_SOURCE_DIR="$sources" cargo test -q -p ferrotron-kernels --test cuda_source
fi
python3 scripts/nvrtc_compile.py "$sources" "$cache/nvidia" ${json[@]+"${json[@]}"}
