#!/usr/bin/env bash
# Measures the activation bytes per rank of gpt-mini at seq 512 for tp1,
# tp2 and tp2 + sp (the largest `peak_activation_bytes` of the steps in
# metrics.jsonl: rank 0's heap above its start during a step) and prints a
# Markdown table beside Korthikanti et al. 2022's per-layer formulas times
# the layers: sbh(10 + 24/t + 5as/(ht)) with TP (t = 1: no TP) and
# sbh(34/t + 5as/(ht)) with TP + SP, in the paper's bytes (16-bit
# activations, 1-byte dropout masks).
#
# Usage: scripts/tp_activations.sh [FERROTRON] [MICRO_BATCH] [STEPS]
#   FERROTRON    the binary, built with the `mpi` feature
#                (default target/release/ferrotron)
#   MICRO_BATCH  sequences per micro-batch, the formulas' b (default 4)
#   STEPS        optimizer steps per run (default 3)
# Needs Open MPI's mpirun and python3.
set -euo pipefail

bin=${1:-target/release/ferrotron}
b=${2:-4}
steps=${3:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# gpt-mini (crates/models/src/presets.rs): 4 layers, hidden 192, 6 heads.
layers=4 hidden=192 heads=6 seq=512

echo "| layout | measured bytes per rank | Korthikanti, ${layers} layers | measured / formula | measured / tp1 | formula / tp1 |"
echo "|---|---|---|---|---|---|"
for layout in tp1 tp2 tp2+sp; do
    case $layout in
        tp1) ranks=1 flags=() ;;
        tp2) ranks=2 flags=(--tp 2) ;;
        tp2+sp) ranks=2 flags=(--tp 2 --sp) ;;
    esac
    run="$out/$layout"
    mpirun --allow-run-as-root --oversubscribe -np "$ranks" \
        "$bin" train --model gpt-mini --out "$run" "${flags[@]}" \
        --max-seq-len "$seq" --seq-len "$seq" --micro-batch "$b" \
        --steps "$steps" --eval-every "$steps" --eval-batches 1 \
        --save-every 0 --sample-tokens 0 >/dev/null
    python3 - "$run/metrics.jsonl" "$layout" "$layers" "$hidden" "$heads" "$seq" "$b" "$out/tp1.bytes" <<'PY'
import json, sys
path, layout, l, h, a, s, b, base = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8]), sys.argv[8]
measured = max(r["peak_activation_bytes"] for r in map(json.loads, open(path))
               if r.get("peak_activation_bytes") is not None)
t = 1 if layout == "tp1" else 2
per_layer = s * b * h * ((34 / t if layout.endswith("sp") else 10 + 24 / t) + 5 * a * s / (h * t))
formula = l * per_layer
if layout == "tp1":
    open(base, "w").write(f"{measured} {formula}")
m1, f1 = map(float, open(base).read().split())
print(f"| {layout} | {measured:,} | {formula:,.0f} | {measured / formula:.2f} | {measured / m1:.3f} | {formula / f1:.3f} |")
PY
done
