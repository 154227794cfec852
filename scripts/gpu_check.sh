#!/usr/bin/env bash
# The GPU battery: everything a lent NVIDIA GPU should run, scripted, for a
# machine without a Rust toolchain. Binaries built elsewhere come in a
# folder, results go to another.
#
#   scripts/gpu_check.sh [--dry-run] [--pack DIR] [--seed-cache TGZ] BIN_DIR OUT_DIR [GROUP ...]
#
# GROUPs, in this order by default (each fits one 10-minute command; the
# script keeps each within GROUP_BUDGET_S, default 540 s, skipping what no
# longer fits):
#   train    env: driver, GPU, NVRTC and libnccl found where, CUDA headers,
#            torch, the binaries' sizes; train-cold: `ferrotron train
#            --model gpt-mini --backend cuda --precision bf16 --steps 3` with
#            empty CubeCL caches; train-warm: the same again, caches filled;
#            curve-bf16, curve-fp32: gpt-mini for CURVE_STEPS (100) steps in
#            bf16, then fp32 (the summary compares their last ten losses and
#            final validation losses); kernel-tests: each BIN_DIR/kernels-* binary on CUDA device 0;
#            comm-device: `bench comm --backend cuda`, one rank's NCCL
#            all-reduce, all-gather and reduce-scatter (f32, and bf16 on
#            the wire) on device buffers against the host copy path: equal
#            bit for bit, and timed (libnccl.so.2 from the toolkit or
#            PyTorch's wheels, or FERROTRON_NCCL_LIBRARY).
#   step     `bench train` and `scripts/bench_torch.py --device cuda` on the
#            same shape, back to back, per precision and shape: bf16 first,
#            then fp32; GPT-2 small (12L d768, b8 x s1024) and a ~1B Llama
#            (16L d2048, GQA 32/8, b4 x s2048) first, then README's shapes
#            A and B (SHAPES="c d a b", PRECISIONS="bf16 fp32" and
#            STEP_TIMEOUT=240 seconds per ferrotron phase override); each
#            16-bit ferrotron run again with --attention-kernel
#            matrix-units (phase ferrotron-SHAPE-PRECISION-mu) and
#            registers (ferrotron-SHAPE-PRECISION-mma); last, one
#            step of the first shape and precision under Nsight Compute
#            (phase profile-SHAPE-PRECISION, PROFILE_TIMEOUT=180 seconds:
#            GPU time per kernel, the CSV rows in
#            step/profile-SHAPE-PRECISION.csv), in 16 bits also with
#            --attention-kernel matrix-units (profile-SHAPE-PRECISION-mu)
#            and registers (profile-SHAPE-PRECISION-mma), where ncu is on
#            the PATH.
#   kernels  `bench kernels` attention at head dim 128, seq 1024-8192: the
#            row and tiled kernels (attention, attention_tiled), then the
#            PyTorch's F.scaled_dot_product_attention on the same shapes
#            in bf16 with FlashAttention-2 (torch-attention:
#            scripts/bench_torch_attention.py, where TORCH_PYTHON imports
#            torch), then the fragment forward and backward on the matrix
#            units (attention_cmma_bf16, phase kernels-cmma), then the
#            register forward and backward on the mma instruction
#            (attention_mma_bf16, kernels-mma), both without the reference
#            (--no-reference: the first two phases measured it) and with
#            torch-attention's times beside them (--torch); the register
#            kernels at each of their tile pairs at seq 4096
#            (kernels-mma-tiles, bench kernels --mma-tiles); one
#            register forward + backward at seq 4096 under Nsight Compute
#            (profile-kernels-mma: per attention kernel launch its time,
#            occupancy and warp stalls; profile-kernels-mma-source: the
#            register forward, dK/dV and dQ kernels' SASS with each
#            instruction's executions and stall samples; where ncu is on
#            the PATH); then
#            compute-sanitizer memcheck and racecheck on the register
#            kernels and then the fragment kernels at seq 1024
#            and 2048 (sanitizer-TOOL-mma-SEQ, sanitizer-TOOL-cmma-SEQ),
#            where compute-sanitizer is on the PATH: only the attention
#            kernels where it has --kernel-name, racecheck's hazard table
#            RACECHECK_HAZARDS (default 1000000) entries.
# One lease: three commands, one per group, e.g. (BIN_DIR carried):
#   scripts/gpu_check.sh --pack "$OUT" target/gpu-bin /tmp/gpu-check train
#   scripts/gpu_check.sh --pack "$OUT" target/gpu-bin /tmp/gpu-check step
#   scripts/gpu_check.sh --pack "$OUT" target/gpu-bin /tmp/gpu-check kernels
# Each prints a summary table last (of every group in OUT_DIR so far) and,
# with --pack DIR, leaves two files in DIR: gpu-check-GROUP.tar.gz (logs,
# JSON, run metrics, the summary) and gpu-check-GROUP-cubecl.tar.gz (the
# CubeCL caches), each under 16 MiB or left out with a line saying so.
#
# BIN_DIR holds, built on a machine with Rust (about 5-8 min each on a
# fast one; strip: binutils):
#   t=${CARGO_TARGET_DIR:-target}; mkdir -p target/gpu-bin
#   FERROTRON_COMMIT=$(git rev-parse HEAD) cargo build --release -p ferrotron-cli \
#       --features cuda,kernels-bench
#   cp "$t/release/ferrotron" target/gpu-bin/
#   cargo test --release -p ferrotron-kernels --features test-cuda --no-run 2>&1 |
#       sed -n 's/.*Executable tests\/\([a-z_]*\)\/main\.rs (\(.*\))/\1 \2/p' |
#       while read -r name path; do cp "$path" "target/gpu-bin/kernels-$name"; done
#   strip target/gpu-bin/*; du -ch target/gpu-bin
# The working tree (about 7 MiB) and the carried binaries travel together
# under 64 MiB. The release cuda build with kernels-bench strips to 73 MiB
# (20.1 MiB gzipped) and the kernel tests to 7.2 MiB (2.5 MiB), measured
# 2026-11-25 (the two builds took 21 and 6 minutes on 2 cores), so
# `gzip -9 target/gpu-bin/*` (all of them): this script then runs
# BIN_DIR/*.gz unpacked. The env phase prints the sizes it got.
#
# --dry-run runs every group on this machine's CPU: `train` and `bench
# train` on flex with tiny shapes, `bench kernels --quick` on flex (and, when
# DRY_WGPU=1, SwiGLU on wgpu, so that a CubeCL runtime reads cubecl.toml),
# torch on the CPU (bench_torch.py fp32, bench_torch_attention.py bf16)
# when TORCH_PYTHON (default python3) imports torch, `bench comm --backend flex` on host memory when
# FERROTRON_NCCL_LIBRARY names the NCCL test double (built with the `mpi`
# feature), and a check that the watchdog reports a quiet phase. Its numbers
# are no benchmark. crates/cli/tests/cli/gpu_check.rs runs it.
#
# OUT_DIR/cubecl.toml turns on CubeCL's persistent compilation and autotune
# caches (OUT_DIR/cubecl-cache) and its compilation and autotune loggers on
# stderr; every binary runs in OUT_DIR so it reads that file, and every log
# line gets the wall time. Every phase runs under `timeout`; after
# WATCHDOG_S (default 60) seconds without a new log line, GPU use
# (nvidia-smi) and each thread's CPU state go into the phase's log.
# DEVICE_TYPE (default h100-80gb) names the GPU for bench train's MFU.
#
# KERNEL_TESTS (space-separated substrings of test names) runs only the
# kernel tests it names, e.g. 'matrix_units' for the ones that take
# another path on a GPU than on lavapipe (NVRTC takes about a minute per
# fragment kernel on the matrix units, and about 3 s per register kernel:
# on the H200 the register forward's test compiled for 102 s, and the
# backward's had not finished after 95 s; since then each matrix-unit
# test runs all its cases in one 16-bit type and two in the others, every
# tile pair in those two only, and the forward's no backward: the kernel
# tests' matrix_unit_runs), and KERNEL_TESTS_TIMEOUT (default 150) is each
# test binary's limit in seconds.
#
# --seed-cache TGZ unpacks the CubeCL caches a previous lease brought back
# (gpu-check-GROUP-cubecl.tar.gz) into OUT_DIR first: its autotune results
# and its compiled kernels (Burn's, and ours for the same binaries) spare
# the first step of each shape most of its minutes. The autotune results
# alone, which hold for any binary, are kept in the repository
# (docs/benchmarks/cubecl-autotune-*.tar.gz). train-cold still starts
# cold when it runs.
#
# A short lease (15 minutes of device time, start-up included) runs the
# phases that matter most in one command: PHASES, an extended regular
# expression, names the phases to run (matched whole; the others are
# recorded as skipped), and LEASE_S caps all the groups of this call
# together (default: no cap beyond GROUP_BUDGET_S each), e.g.
#   PHASES='env|kernels-kernels|comm-device|kernels-cmma|ferrotron-[cd]-bf16|torch-[cd]-bf16' \
#   LEASE_S=540 SHAPES='c d' PRECISIONS=bf16 DEVICE_TYPE=h200 \
#   scripts/gpu_check.sh --pack "$OUT" target/gpu-bin /tmp/gpu-check train kernels step
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib/gpu_phase.sh
source "$here/lib/gpu_phase.sh"

DRY=0
pack=""
seed=""
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY=1 ;;
    --pack)
        [ $# -ge 2 ] || { echo "gpu_check.sh: --pack needs a folder" >&2; exit 2; }
        pack=$2
        shift
        ;;
    --seed-cache)
        [ $# -ge 2 ] && [ -f "$2" ] || { echo "gpu_check.sh: --seed-cache needs a file: gpu-check-*-cubecl.tar.gz or docs/benchmarks/cubecl-autotune-*.tar.gz" >&2; exit 2; }
        seed=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
        shift
        ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) break ;;
    esac
    shift
done
if [ $# -lt 2 ]; then
    echo "gpu_check.sh: BIN_DIR and OUT_DIR are required (see --help)" >&2
    exit 2
fi
bin=$(cd "$1" 2>/dev/null && pwd) || { echo "gpu_check.sh: BIN_DIR $1: no such folder" >&2; exit 2; }
out_arg=$2
shift 2
groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(train step kernels)
for g in "${groups[@]}"; do
    case "$g" in train | step | kernels) ;; *)
        echo "gpu_check.sh: unknown group '$g' (train, step or kernels)" >&2
        exit 2
        ;;
    esac
done
if [ ! -x "$bin/ferrotron" ] && [ ! -f "$bin/ferrotron.gz" ]; then
    echo "gpu_check.sh: BIN_DIR $bin: no ferrotron (or ferrotron.gz) in it" >&2
    exit 2
fi
out=$(mkdir -p "$out_arg" && cd "$out_arg" && pwd) || { echo "gpu_check.sh: OUT_DIR $out_arg: cannot create it" >&2; exit 2; }
if [ -n "$pack" ]; then
    pack=$(mkdir -p "$pack" && cd "$pack" && pwd) || { echo "gpu_check.sh: --pack $pack: cannot create it" >&2; exit 2; }
fi

# Binaries: gzip-compressed ones are unpacked beside the results.
bin_given=$bin
for f in "$bin"/*.gz; do
    [ -e "$f" ] || continue
    mkdir -p "$out/bin"
    gunzip -c "$f" >"$out/bin/$(basename "${f%.gz}")" && chmod +x "$out/bin/$(basename "${f%.gz}")"
done
[ -d "$out/bin" ] && bin="$out/bin"
F="$bin/ferrotron"

WATCHDOG_S=${WATCHDOG_S:-$([ "$DRY" = 1 ] && echo 2 || echo 60)}
MIN_PHASE_S=${MIN_PHASE_S:-20}
GROUP_BUDGET_S=${GROUP_BUDGET_S:-540}
LEASE_END=$((EPOCHSECONDS + ${LEASE_S:-86400}))
PHASES=${PHASES:-}
TORCH_PYTHON=${TORCH_PYTHON:-python3}
if [ "$DRY" = 1 ]; then
    backend=flex device=cpu
else
    backend=cuda device=cuda
fi

# NVRTC, the CUDA runtime and NCCL from the toolkit and PyTorch's wheels.
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in os.listdir(p)))' 2>/dev/null); do
    [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH RUST_BACKTRACE=1

# CubeCL reads cubecl.toml from the working directory (cubecl-runtime 0.10,
# config/{compilation,autotune,cache}.rs and cubecl-common's LoggerConfig).
cat >"$out/cubecl.toml" <<EOF
[compilation]
cache = { file = "$out/cubecl-cache" }

[compilation.logger]
level = "basic"
stderr = true

[autotune]
cache = { file = "$out/cubecl-cache" }

[autotune.logger]
level = "full"
stderr = true
EOF
cd "$out" || exit 2
if [ -n "$seed" ]; then
    tar xzf "$seed" -C "$out" cubecl-cache || { echo "gpu_check.sh: --seed-cache $seed: no cubecl-cache in it" >&2; exit 2; }
    echo "(CubeCL caches seeded from $seed: $(find "$out/cubecl-cache" -type f | wc -l) files)"
fi

# The shapes: bench train flags of each. c, d: GPT-2 small and a ~1B Llama;
# a, b: README's CPU shapes A and B. The dry run keeps each family, tiny.
# (Read through ${!name} in gpu_groups.sh.)
# shellcheck disable=SC2034
if [ "$DRY" = 1 ]; then
    tiny="--layers 1 --hidden 32 --heads 2 --vocab 64 --batch 2 --seq 16"
    shape_a="--family gpt $tiny --ffn 128"
    shape_b="--family llama $tiny --kv-heads 1 --ffn 64"
    shape_c="$shape_a"
    shape_d="$shape_b"
    steps="--warmup 1 --steps 1"
else
    shape_a="--family gpt --layers 6 --hidden 384 --heads 6 --ffn 1536 --vocab 50304 --batch 8 --seq 256"
    shape_b="--family llama --layers 6 --hidden 384 --heads 6 --kv-heads 2 --ffn 1024 --vocab 32000 --batch 8 --seq 256"
    shape_c="--family gpt --layers 12 --hidden 768 --heads 12 --ffn 3072 --vocab 50304 --batch 8 --seq 1024"
    shape_d="--family llama --layers 16 --hidden 2048 --heads 32 --kv-heads 8 --ffn 8192 --vocab 32000 --batch 4 --seq 2048"
    steps="--warmup 2 --steps 5"
fi

# shellcheck source=scripts/lib/gpu_groups.sh
source "$here/lib/gpu_groups.sh"

for GROUP in "${groups[@]}"; do
    GROUP_DIR="$out/$GROUP"
    mkdir -p "$GROUP_DIR"
    : >"$GROUP_DIR/phases.tsv"
    BUDGET_END=$((EPOCHSECONDS + GROUP_BUDGET_S))
    [ "$BUDGET_END" -gt "$LEASE_END" ] && BUDGET_END=$LEASE_END
    echo "######## group $GROUP $(date +%T), budget ${GROUP_BUDGET_S}s, results in $GROUP_DIR"
    "group_$GROUP"
    python3 "$here/lib/gpu_summary.py" "$out" >"$GROUP_DIR/summary.txt" 2>&1 ||
        column -t -s $'\t' "$out"/*/phases.tsv >"$GROUP_DIR/summary.txt"
    [ -n "$pack" ] && pack_group "$GROUP" "$pack"
    cat "$GROUP_DIR/summary.txt"
done
