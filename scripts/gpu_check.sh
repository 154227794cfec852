#!/usr/bin/env bash
# The checks and benchmarks that need an NVIDIA GPU, in one run, for a GPU
# machine without a Rust toolchain: binaries built elsewhere come in a
# folder, results go to another.
#
#   scripts/gpu_check.sh BIN_DIR OUT_DIR [PART ...]
#
# BIN_DIR holds `ferrotron` (built with --features cuda,kernels-bench) and
# the kernels' integration test binaries (built with --features test-cuda:
# `cargo test --release -p ferrotron-kernels --features test-cuda --no-run`,
# copied as kernels-<name>). PARTs (default: all, in this order):
#   kernels  the kernel tests on CUDA device 0 (every kernel against its
#            host reference, as on lavapipe in CI)
#   train    `ferrotron train` on cuda against flex: the same gpt-mini run
#            (fp32, and the default bf16) for 20 steps; prints both losses
#   bench    `ferrotron bench kernels` on cuda (attention up to 4096 tokens)
#   step     `ferrotron bench train` on cuda and scripts/bench_torch.py on
#            cuda, back to back, per shape and precision; one merged table
#            (SHAPES="a b c d" by default: README's CPU shapes A and B in bf16
#            and fp32, GPT-2 small and a 1.1B Llama in bf16; PRECISIONS="bf16"
#            keeps A and B to bf16)
# DEVICE_TYPE (default h100-80gb) names the GPU for bench train's MFU;
# STEP_TIMEOUT (default 150 s) bounds each bench train run: on a fresh
# machine the first use of each kernel compiles (NVRTC) and autotunes for
# minutes (a 20-step gpt-mini run on an H100 took 140 s, nearly all of it
# that).
# KERNEL_TEST_ARGS is passed to every kernel test binary (a filter,
# --nocapture).
# Each part writes its log to OUT_DIR/<part>.log; JSON results land there
# too. NVRTC (which CubeCL compiles kernels with) is looked up in the CUDA
# toolkit and in PyTorch's wheels.
set -uo pipefail
bin=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
shift 2
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(kernels train bench step)
F="$bin/ferrotron"

for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, sub, "lib") for p in nvidia.__path__ for sub in os.listdir(p)))' 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"

# Shapes A and B of README's CPU table, and GPT-2 small / a 1B Llama at
# the sequence lengths GPUs train at.
shape_a="--family gpt --layers 6 --hidden 384 --heads 6 --ffn 1536 --vocab 50304 --batch 8 --seq 256"
shape_b="--family llama --layers 6 --hidden 384 --heads 6 --kv-heads 2 --ffn 1024 --vocab 32000 --batch 8 --seq 256"
shape_c="--family gpt --layers 12 --hidden 768 --heads 12 --ffn 3072 --vocab 50304 --batch 8 --seq 1024"
shape_d="--family llama --layers 16 --hidden 2048 --heads 32 --kv-heads 8 --ffn 8192 --vocab 32000 --batch 4 --seq 2048"

run_part() {
    case "$1" in
    kernels)
        for t in "$bin"/kernels-*; do
            echo "== $(basename "$t")"
            # shellcheck disable=SC2086
            timeout -k 5 200 "$t" --test-threads 1 ${KERNEL_TEST_ARGS:-} 2>&1 ||
                echo "FAILED: $(basename "$t") exit $?"
        done
        ;;
    train)
        for p in fp32 bf16; do
            for b in flex cuda; do
                [ "$b" = flex ] && [ "$p" = bf16 ] && continue
                echo "== train $b $p"
                timeout -k 5 150 "$F" train --model gpt-mini --backend "$b" --precision "$p" \
                    --steps 20 --seed 1 --out "/tmp/train-$b-$p" > "$out/train-$b-$p.log" 2>&1
                echo "exit $? at $(date +%T)"
                tail -3 "$out/train-$b-$p.log"
                grep -o '"loss":[0-9.]*' "/tmp/train-$b-$p/metrics.jsonl" | head -20 | tr '\n' ' '
                echo
            done
        done
        ;;
    bench)
        timeout -k 5 240 "$F" bench kernels --backends cuda --max-seq 4096 --json "$out/kernels.json" 2>&1
        ;;
    step)
        for i in ${SHAPES:-a b c d}; do
            s="shape_$i"
            s="${!s}"
            precisions="${PRECISIONS:-bf16 fp32}"
            [ "$i" = c ] || [ "$i" = d ] && precisions=bf16
            for p in $precisions; do
                echo "== shape $i $p"
                # shellcheck disable=SC2086
                timeout -k 5 "${STEP_TIMEOUT:-150}" "$F" bench train $s --precision $p --backends cuda \
                    --warmup 2 --steps 5 --device-type "${DEVICE_TYPE:-h100-80gb}" --json "$out/ferrotron-$i-$p.json" \
                    > "$out/ferrotron-$i-$p.log" 2>&1
                echo "exit $? at $(date +%T)"
                tail -4 "$out/ferrotron-$i-$p.log"
                # shellcheck disable=SC2086
                timeout -k 5 150 python3 "$(dirname "$0")/bench_torch.py" $s --precision $p \
                    --device cuda --warmup 2 --steps 5 --json "$out/torch-$i-$p.json" 2>&1 | tail -1
            done
        done
        "$F" bench train --compare "$out"/ferrotron-*.json "$out"/torch-*.json --chart "$out/step.svg"
        ;;
    *) echo "unknown part $1" >&2; return 2 ;;
    esac
}

for part in "${parts[@]}"; do
    echo "######## $part $(date +%T)"
    run_part "$part" 2>&1 | tee "$out/$part.log"
done
