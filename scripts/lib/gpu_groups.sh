# shellcheck shell=bash
# The groups of scripts/gpu_check.sh (see its header): the phases of each,
# in order, and the packing of a group's results. Sourced after the phase
# runner (gpu_phase.sh); uses gpu_check.sh's variables: DRY, F, bin,
# bin_given, out, here, backend, device, shape_a..shape_d, steps,
# TORCH_PYTHON, GROUP_DIR.
# shellcheck disable=SC2154 # set by gpu_check.sh

# env, train-cold, train-warm, the bf16 and fp32 loss curves, kernel
# tests, NCCL on device buffers.
group_train() {
    run_phase env 60 bash "$here/lib/gpu_env.sh" "$bin" "$bin_given"
    if [ "$DRY" = 1 ]; then
        # A check of the watchdog itself: quiet for twice its period.
        run_phase watchdog-check 30 sh -c "echo quiet from now; sleep $((2 * WATCHDOG_S + 1)); echo done"
    fi
    local train=(train --model gpt-mini --backend "$backend" --precision bf16 --steps 3 --seed 1
        --sample-tokens 0)
    [ "$DRY" = 1 ] && train+=(--micro-batch 2 --seq-len 32 --eval-batches 1)
    rm -rf "$GROUP_DIR/train-cold" "$GROUP_DIR/train-warm"
    if selected train-cold; then
        rm -rf "$out/cubecl-cache"
        echo "(CubeCL caches emptied: train-cold starts cold)"
    fi
    run_phase train-cold 240 "$F" "${train[@]}" --out "$GROUP_DIR/train-cold"
    run_phase train-warm 150 "$F" "${train[@]}" --out "$GROUP_DIR/train-warm"
    # The loss curve: gpt-mini for CURVE_STEPS (100) steps in bf16, then in
    # fp32, same seed and data (issue 31: bf16 within 2% of fp32).
    local curve=(train --model gpt-mini --backend "$backend" --steps "${CURVE_STEPS:-100}" --seed 1
        --sample-tokens 0)
    [ "$DRY" = 1 ] && curve=(train --model gpt-mini --backend "$backend" --steps 4 --seed 1
        --sample-tokens 0 --micro-batch 2 --seq-len 32 --eval-batches 1)
    local p
    for p in bf16 fp32; do
        rm -rf "$GROUP_DIR/curve-$p"
        run_phase "curve-$p" 180 "$F" "${curve[@]}" --precision "$p" --out "$GROUP_DIR/curve-$p"
    done
    local t any=0
    for t in "$bin"/kernels-*; do
        [ -x "$t" ] || continue
        any=1
        # shellcheck disable=SC2086 # KERNEL_TESTS: test name filters
        run_phase "$(basename "$t")" "${KERNEL_TESTS_TIMEOUT:-150}" "$t" --test-threads 1 \
            ${KERNEL_TESTS:-}
    done
    [ "$any" = 1 ] || skip_phase kernel-tests "no kernels-* test binaries in $bin_given"
    # One rank's NCCL collectives on device buffers against the host copy
    # path (equal bit for bit, and timed); the dry run on flex needs a
    # library on host memory (the test double) in FERROTRON_NCCL_LIBRARY.
    if [ "$DRY" = 1 ] && [ -z "${FERROTRON_NCCL_LIBRARY:-}" ]; then
        skip_phase comm-device "FERROTRON_NCCL_LIBRARY is unset: the dry run has no NCCL on host memory"
    else
        local comm=(bench comm --backend "$backend" --json "$GROUP_DIR/comm-device.json")
        [ "$DRY" = 1 ] && comm+=(--elems 4096 --reps 2)
        run_phase comm-device 120 "$F" "${comm[@]}"
    fi
}

# bench train beside bench_torch.py, per precision (bf16 first: the GPU's
# default) and shape. A shape's first run compiles and autotunes its kernels
# (on the H100, 2026-11-25: over 120 s for GPT-2 small in bf16, 12 s once
# the caches held them), hence STEP_TIMEOUT's 240 s.
group_step() {
    local torch_note="" i p s
    if ! "$TORCH_PYTHON" -c 'import torch' 2>/dev/null; then
        torch_note="$TORCH_PYTHON cannot import torch"
    fi
    local peak=(--device-type "${DEVICE_TYPE:-h100-80gb}")
    # On a CPU the default peak is a GEMM measurement: not worth its time here.
    [ "$DRY" = 1 ] && peak=(--peak-tflops 1)
    for p in ${PRECISIONS:-bf16 fp32}; do
        for i in ${SHAPES:-c d a b}; do
            s="shape_$i"
            s="${!s}"
            # shellcheck disable=SC2086 # $s and $steps are lists of flags
            run_phase "ferrotron-$i-$p" "${STEP_TIMEOUT:-240}" "$F" bench train $s --precision "$p" \
                --backends "$backend" $steps "${peak[@]}" --json "$GROUP_DIR/ferrotron-$i-$p.json"
            # 16 bits again with the attention on the matrix units: the
            # fragment kernels (-mu), then the register kernels (-mma).
            local suffix kernel
            for suffix in mu mma; do
                kernel=matrix-units
                [ "$suffix" = mma ] && kernel=registers
                if [ "$p" != fp32 ] && [ "$device" = cpu ]; then
                    skip_phase "ferrotron-$i-$p-$suffix" "--attention-kernel $kernel needs fused kernels on a GPU"
                elif [ "$p" != fp32 ]; then
                    # shellcheck disable=SC2086
                    run_phase "ferrotron-$i-$p-$suffix" "${STEP_TIMEOUT:-240}" "$F" bench train $s \
                        --precision "$p" --attention-kernel "$kernel" --backends "$backend" $steps \
                        "${peak[@]}" --json "$GROUP_DIR/ferrotron-$i-$p-$suffix.json"
                fi
            done
            if [ -n "$torch_note" ]; then
                skip_phase "torch-$i-$p" "$torch_note"
            elif [ "$device" = cpu ] && [ "$p" = bf16 ]; then
                skip_phase "torch-$i-$p" "bench_torch.py runs bf16 on cuda only"
            else
                # shellcheck disable=SC2086
                run_phase "torch-$i-$p" 120 "$TORCH_PYTHON" "$here/bench_torch.py" $s --precision "$p" \
                    --device "$device" $steps --json "$GROUP_DIR/torch-$i-$p.json"
            fi
        done
    done
    # One step of the first shape in the first precision under Nsight
    # Compute (after its runs filled the caches): GPU time per kernel, the
    # CSV rows in GROUP_DIR/profile-SHAPE-PRECISION.csv; in 16 bits the
    # same again with the attention's fragment kernels on the matrix units
    # (profile-SHAPE-PRECISION-mu) and with its register kernels
    # (profile-SHAPE-PRECISION-mma).
    read -r i _ <<<"${SHAPES:-c d a b}"
    read -r p _ <<<"${PRECISIONS:-bf16 fp32}"
    s="shape_$i"
    s="${!s}"
    # shellcheck disable=SC2086 # $s is a list of flags
    local one_step=(--backends "$backend" --warmup 0 --steps 1 "${peak[@]}")
    profile_phase "profile-$i-$p" time bench train $s --precision "$p" "${one_step[@]}"
    if [ "$p" != fp32 ]; then
        # shellcheck disable=SC2086
        profile_phase "profile-$i-$p-mu" time bench train $s --precision "$p" \
            --attention-kernel matrix-units "${one_step[@]}"
        # shellcheck disable=SC2086
        profile_phase "profile-$i-$p-mma" time bench train $s --precision "$p" \
            --attention-kernel registers "${one_step[@]}"
    fi
}

# Phase $1: the ferrotron command after $2 (one step of `bench train`, or
# one `bench kernels` run) under Nsight Compute, after the phases that
# filled the caches; the CSV rows in GROUP_DIR/$1.csv. $2 says what it
# records: `time`, the GPU time of every kernel (one pass each), or
# `stalls`, for each launch of an attention kernel Nsight's speed of
# light, occupancy, warp states (what the warps waited on) and launch
# sections (several passes each); or `source`, for the second launch of
# the register forward and the launches of the register dK/dV and dQ
# kernels after it, each SASS instruction with its executions and warp
# stall samples (the source page: where in the kernel the warps wait).
profile_phase() {
    local name=$1 what=$2
    shift 2
    local ncu_args=(--metrics gpu__time_duration.sum --print-summary per-kernel)
    if [ "$what" = stalls ]; then
        ncu_args=(--kernel-name regex:attention --section SpeedOfLight --section Occupancy
            --section WarpStateStats --section LaunchStats)
    elif [ "$what" = source ]; then
        ncu_args=(--kernel-name 'regex:attention_(forward|backward_kv|backward_q)_mma'
            --launch-skip 1 --launch-count 3 --section SourceCounters
            --page source --print-source sass)
    fi
    if [ "$device" = cpu ]; then
        skip_phase "$name" "the dry run has no GPU to profile"
    elif ! command -v ncu >/dev/null; then
        skip_phase "$name" "ncu (Nsight Compute) is not on the PATH"
    else
        run_phase "$name" "${PROFILE_TIMEOUT:-180}" ncu "${ncu_args[@]}" --clock-control none \
            --csv "$F" "$@"
        [ -f "$GROUP_DIR/$name.log" ] &&
            sed -n 's/^[0-9:]* \("\)/\1/p' "$GROUP_DIR/$name.log" >"$GROUP_DIR/$name.csv"
    fi
}

# bench kernels attention at head dim 128 (seq 8192 apart: a failure there
# keeps the shorter ones), then compute-sanitizer on the matrix-unit kernels.
group_kernels() {
    # A refused --head-dim ends at once, compiled in or not; only a build
    # without the feature says "not compiled in".
    if "$F" bench kernels --head-dim 3 2>&1 </dev/null | grep -q 'not compiled in'; then
        skip_phase kernels "ferrotron was built without the kernels-bench feature"
        skip_phase sanitizer "no bench kernels to check"
        return 0
    fi
    local k=(bench kernels --backends "$backend" --head-dim 128)
    local long=(--min-seq 1024 --max-seq 4096) longest=(--min-seq 8192 --max-seq 8192)
    local all=(--min-seq 1024 --max-seq 8192)
    if [ "$DRY" = 1 ]; then
        long=(--quick) longest=(--quick --reps 1) all=(--quick)
    fi
    run_phase kernels-attention 240 "$F" "${k[@]}" "${long[@]}" --only attention \
        --json "$GROUP_DIR/kernels-attention.json"
    run_phase kernels-attention-8192 150 "$F" "${k[@]}" "${longest[@]}" --only attention \
        --json "$GROUP_DIR/kernels-attention-8192.json"
    # The matrix-unit kernels alone: kernels-attention has measured the
    # reference, whose first run at each shape autotunes Burn's matmuls
    # (about 40 s per shape on the H200, 2026-11-28).
    # PyTorch's F.scaled_dot_product_attention on the same shapes (bf16;
    # FlashAttention-2 on a GPU, PyTorch's pick in the dry run), set
    # beside the matrix-unit kernels' rows.
    local torch=() torch_args=(--device "$device" --head-dim 128 "${all[@]}")
    [ "$DRY" = 1 ] && torch_args=(--device "$device" --backend default --head-dim 128 --quick)
    if ! "$TORCH_PYTHON" -c 'import torch' 2>/dev/null; then
        skip_phase torch-attention "$TORCH_PYTHON cannot import torch"
    else
        run_phase torch-attention 120 "$TORCH_PYTHON" "$here/bench_torch_attention.py" \
            "${torch_args[@]}" --json "$GROUP_DIR/torch-attention.json"
        [ -f "$GROUP_DIR/torch-attention.json" ] && torch=(--torch "$GROUP_DIR/torch-attention.json")
    fi
    run_phase kernels-cmma 150 "$F" "${k[@]}" "${all[@]}" --only attention_cmma_bf16 \
        --no-reference "${torch[@]}" --json "$GROUP_DIR/kernels-cmma.json"
    run_phase kernels-mma 150 "$F" "${k[@]}" "${all[@]}" --only attention_mma_bf16 \
        --no-reference "${torch[@]}" --json "$GROUP_DIR/kernels-mma.json"
    # Every tile pair of the register forward and backward at seq 4096: the
    # launcher takes the largest that fit, which need not be the fastest.
    local one=(--min-seq 4096 --max-seq 4096)
    [ "$DRY" = 1 ] && one=(--quick)
    run_phase kernels-mma-tiles 120 "$F" "${k[@]}" "${one[@]}" --only attention_mma_bf16 \
        --mma-tiles --no-reference --json "$GROUP_DIR/kernels-mma-tiles.json"
    # One register forward + backward at seq 4096, kernel by kernel: GPU
    # time (bench kernels' fwd ms is a wall time), occupancy and stalls.
    profile_phase profile-kernels-mma stalls bench kernels --backends "$backend" --head-dim 128 \
        --only attention_mma_bf16 --min-seq 4096 --max-seq 4096 --no-reference --warmup 0 --reps 1
    # The same run, instruction by instruction (the untimed forward skipped).
    PROFILE_TIMEOUT=${PROFILE_TIMEOUT:-120} profile_phase profile-kernels-mma-source source bench kernels \
        --backends "$backend" --head-dim 128 --only attention_mma_bf16 --min-seq 4096 \
        --max-seq 4096 --no-reference --warmup 0 --reps 1
    if [ "$DRY" = 1 ]; then
        # A CubeCL runtime reads cubecl.toml: its compilation log shows it.
        if [ "${DRY_WGPU:-0}" = 1 ]; then
            run_phase kernels-wgpu 120 "$F" bench kernels --backends wgpu --quick --only swiglu \
                --json "$GROUP_DIR/kernels-wgpu.json"
        else
            skip_phase kernels-wgpu "DRY_WGPU is not 1: the dry run stays on flex"
        fi
    fi
    if ! command -v compute-sanitizer >/dev/null; then
        skip_phase sanitizer "compute-sanitizer is not on the PATH"
        return 0
    fi
    # The register kernels (mma), then the fragment kernels (cmma), without
    # the reference. Only the attention kernels are checked where the tool
    # can filter by name: on the H100 (2026-11-28) racecheck's hazard table
    # filled up without saying in which kernels. RACECHECK_HAZARDS raises
    # the table's size.
    local filter=() seq tool kind
    if compute-sanitizer --help 2>&1 | grep -q -- '--kernel-name '; then
        filter=(--kernel-name kns=attention)
    fi
    for kind in mma cmma; do
        for seq in 1024 2048; do
            for tool in memcheck racecheck; do
                run_phase "sanitizer-$tool-$kind-$seq" 150 env \
                    NV_COMPUTE_SANITIZER_MAX_RACECHECK_HAZARDS="${RACECHECK_HAZARDS:-1000000}" \
                    compute-sanitizer --tool "$tool" "${filter[@]}" --error-exitcode 3 \
                    --print-limit 20 "$F" bench kernels --backends "$backend" --head-dim 128 \
                    --only "attention_${kind}_bf16" --min-seq "$seq" --max-seq "$seq" \
                    --no-reference --warmup 0 --reps 1
            done
        done
    done
}

# Packs GROUP's results into DIR/gpu-check-GROUP.tar.gz and the CubeCL
# caches into DIR/gpu-check-GROUP-cubecl.tar.gz; a file over 16 MiB (the
# most a lease brings back) is removed with a line saying so.
pack_group() { # GROUP DIR
    local g=$1 dir=$2 f
    tar czf "$dir/gpu-check-$g.tar.gz" -C "$out" --exclude=checkpoints --exclude='*.safetensors' \
        "$g" cubecl.toml
    [ -d "$out/cubecl-cache" ] && tar czf "$dir/gpu-check-$g-cubecl.tar.gz" -C "$out" cubecl-cache
    for f in "$dir/gpu-check-$g.tar.gz" "$dir/gpu-check-$g-cubecl.tar.gz"; do
        [ -f "$f" ] || continue
        if [ "$(stat -c %s "$f")" -gt $((16 << 20)) ]; then
            echo "pack: $(basename "$f") is $(($(stat -c %s "$f") >> 20)) MiB, over 16 MiB: left out" |
                tee -a "$GROUP_DIR/summary.txt"
            rm -f "$f"
        fi
    done
}
