#!/usr/bin/env bash
# The env phase of scripts/gpu_check.sh: what the battery runs on. The
# driver and GPU, where NVRTC, the CUDA driver library and NCCL are found
# (the dynamic linker's cache and LD_LIBRARY_PATH, which gpu_check.sh
# extends with the CUDA toolkit and PyTorch's nvidia wheels), the CUDA
# headers CubeCL's bf16 kernels include, the tools, torch, and the sizes of
# the binaries it was given.
#
#   scripts/lib/gpu_env.sh BIN_DIR [GIVEN_DIR]
# (GIVEN_DIR: the folder the binaries came in, when BIN_DIR holds them
# unpacked.)
set -uo pipefail
bin=$1
given=${2:-$1}

section() { printf '\n== %s\n' "$1"; }

# Every file named like the shell pattern $1 in the linker cache and in
# LD_LIBRARY_PATH, one path a line; "not found" when none.
find_lib() {
    local found dir
    found=$( {
        PATH="$PATH:/sbin:/usr/sbin" ldconfig -p 2>/dev/null | awk -v p="$1" '$1 ~ p { print $NF }'
        IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
        for dir in "${dirs[@]}"; do
            compgen -G "$dir/$1*" || true
        done
    } | sort -u)
    if [ -n "$found" ]; then
        printf '%s\n' "$found" | sed "s/^/  /"
    else
        echo "  not found"
    fi
}

section "machine"
date -u '+%Y-%m-%dT%H:%M:%SZ'
uname -srm
echo "cpus: $(nproc)"
grep -E '^(MemTotal|MemAvailable)' /proc/meminfo

section "gpu"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    nvidia-smi
else
    echo "nvidia-smi is not on this machine"
fi

section "libraries (ldconfig cache and LD_LIBRARY_PATH)"
echo "libcuda (driver):"
find_lib libcuda.so
echo "NVRTC (CubeCL compiles its kernels with it):"
find_lib libnvrtc.so
echo "NCCL (--comm nccl; FERROTRON_NCCL_LIBRARY=${FERROTRON_NCCL_LIBRARY:-unset}):"
find_lib libnccl.so

section "CUDA headers (cubecl-cuda includes cuda_bf16.h from CUDA_PATH, else /usr/local/cuda)"
cuda=${CUDA_PATH:-/usr/local/cuda}
for h in include/cuda_bf16.h include/cuda_fp16.h include/cccl; do
    if [ -e "$cuda/$h" ]; then echo "  $cuda/$h"; else echo "  $cuda/$h: missing"; fi
done

section "tools"
for t in nvcc compute-sanitizer ncu python3; do
    if command -v "$t" >/dev/null; then
        echo "$t: $(command -v "$t") $("$t" --version 2>&1 | tail -n 1)"
    else
        echo "$t: not on the PATH"
    fi
done
python3 -c 'import torch; print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "no cuda", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tail -n 1

section "binaries as given ($given; the carry limit is 64 MiB with the working tree)"
ls -l "$given"/ferrotron* "$given"/kernels-* 2>/dev/null
total=$(find "$given" -maxdepth 1 -type f \( -name ferrotron -o -name 'kernels-*' -o -name '*.gz' \) -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
echo "together: $((total / 1048576)) MiB"
"$bin/ferrotron" --version
