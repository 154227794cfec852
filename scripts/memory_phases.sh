#!/usr/bin/env bash
# Measures each rank's peak resident memory while building the model,
# saving a checkpoint and loading it (the `memory_phase` records of
# metrics.jsonl) for the gpt2 preset (124M parameters, 50,257-token
# vocabulary) in the layouts of docs/parallelism.md's memory table, with
# the flags of the test `cli::memory`: 1 step of 32 tokens and a
# checkpoint after it, then the run resumed from that checkpoint with no
# step left (it builds, loads and stops). Prints the records as JSON.
#
# Usage: scripts/memory_phases.sh FERROTRON [LAYOUT...]
#   FERROTRON  the binary, built with the `mpi` feature
#   LAYOUT     one, tp2, zero3, tp2xpp2 (default: all four)
# Needs Open MPI's mpirun and python3.
set -euo pipefail

bin=$1
shift
layouts=("$@")
[ ${#layouts[@]} -gt 0 ] || layouts=(one tp2 zero3 tp2xpp2)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# The tests' 400-line corpus (crates/cli/tests/cli/common/mod.rs).
corpus="$out/small.txt"
for i in $(seq 0 399); do
    echo "Line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13))."
done >"$corpus"
"$bin" data prepare --input "$corpus" --vocab-size 300 --out "$out/shards" >/dev/null

for layout in "${layouts[@]}"; do
    case $layout in
        one) ranks=1 flags=() ;;
        tp2) ranks=2 flags=(--tp 2) ;;
        zero3) ranks=2 flags=(--zero 3) ;;
        tp2xpp2) ranks=4 flags=(--tp 2 --pp 2) ;;
        *) echo "unknown layout $layout (one, tp2, zero3, tp2xpp2)" >&2; exit 2 ;;
    esac
    run="$out/$layout"
    mpirun --allow-run-as-root --oversubscribe -np "$ranks" \
        "$bin" train --model gpt2 --data "$out/shards" --vocab-size 50257 \
        --seq-len 32 --micro-batch 1 --steps 1 --eval-every 1 --eval-batches 1 \
        --save-every 1 --sample-tokens 0 --peak-tflops 1 --out "$run" \
        "${flags[@]}" >/dev/null
    mpirun --allow-run-as-root --oversubscribe -np "$ranks" \
        "$bin" train --resume "$run" >/dev/null
    printf '%s\n' "$ranks" "${flags[*]-}" >"$run/layout.txt"
done

python3 - "$out" "${layouts[@]}" <<'PY'
import json, sys
out, layouts = sys.argv[1], sys.argv[2:]
runs = []
for layout in layouts:
    ranks, flags = open(f"{out}/{layout}/layout.txt").read().split("\n")[:2]
    records = [r for r in map(json.loads, open(f"{out}/{layout}/metrics.jsonl"))
               if "memory_phase" in r]
    runs.append({"layout": layout, "ranks": int(ranks), "flags": flags.split(),
                 "records": records})
print(json.dumps({"unit": "bytes", "runs": runs}, indent=1))
PY
