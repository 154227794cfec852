#!/usr/bin/env bash
# Context parallelism at a long sequence: activation memory per rank, and
# the step time of cp2 against cp1.
#
# memory: llama-mini (4 layers, hidden 192, 6 heads / 2 KV heads) at
#   sequence SEQ, one sequence per step, trained 2 steps under --cp 1, 2
#   and 4 (or the CPS given); for each, rank 0's largest
#   `peak_activation_bytes` of the steps in metrics.jsonl (its heap above
#   the step's start: what the forward keeps for backward plus the
#   backward's working set), beside `ferrotron plan --explain`'s
#   activations per rank for the same layout under `--activations
#   ferrotron-cpu` (what Burn's autodiff keeps on the CPU path) and
#   `korthikanti` (fused kernels, 16-bit). Every rank of a ring holds the
#   same number of tokens and does the same causal work, so rank 0 stands
#   for each.
# time: PAIRS pairs of runs back to back, cp1 (one rank) then cp2 (two
#   ranks), each STEPS steps at SEQ; per run the median wall time of its
#   steps after the first (`step_time_s` in metrics.jsonl), per pair the ratio
#   cp2 / cp1, and the median ratio. Alternating pairs spread a drifting
#   load over both layouts; run it on an otherwise idle machine.
#
# Prints one JSON object on stdout.
#
# Usage: scripts/cp_activations.sh memory FERROTRON [SEQ [CP...]]
#        scripts/cp_activations.sh time FERROTRON [PAIRS [SEQ [STEPS]]]
#   FERROTRON  the binary, built with the `mpi` feature
#   SEQ        tokens per sequence (default 8192 for memory, 4096 for time)
#   CP         ring sizes (default 1 2 4)
#   PAIRS      cp1/cp2 pairs (default 3, at least 3)
#   STEPS      steps per timed run (default 6)
# Needs Open MPI's mpirun and python3.
set -euo pipefail

mode=${1:?usage: cp_activations.sh memory|time FERROTRON ...}
bin=${2:?the ferrotron binary}
shift 2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=llama-mini vocab=300

# A corpus long enough for sequences of tens of thousands of tokens.
corpus="$out/corpus.txt"
for i in $(seq 0 19999); do
    echo "Line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13))."
done >"$corpus"
"$bin" data prepare --input "$corpus" --vocab-size "$vocab" --out "$out/shards" >/dev/null

# train RUN RANKS SEQ STEPS [FLAGS...]: a run of llama-mini into $out/RUN.
train() {
    local run=$1 ranks=$2 seq=$3 steps=$4
    shift 4
    mpirun --allow-run-as-root --oversubscribe -np "$ranks" \
        "$bin" train --model "$model" --data "$out/shards" --vocab-size "$vocab" \
        --max-seq-len "$seq" --seq-len "$seq" --micro-batch 1 --steps "$steps" \
        --eval-every "$steps" --eval-batches 1 --save-every 0 --sample-tokens 0 \
        --out "$out/$run" "$@" >/dev/null
}

case $mode in
memory)
    seq=${1:-8192}
    shift || true
    cps=("$@")
    [ ${#cps[@]} -gt 0 ] || cps=(1 2 4)
    for cp in "${cps[@]}"; do
        train "cp$cp" "$cp" "$seq" 2 --cp "$cp"
        # The planner's label names cp only above 1.
        label=dp1-tp1-cp$cp-pp1-z0-mb1-none
        [ "$cp" -gt 1 ] || label=dp1-tp1-pp1-z0-mb1-none
        for acts in ferrotron-cpu korthikanti; do
            "$bin" plan --model "$model" --vocab "$vocab" --gpus "$cp" --gpu cpu \
                --gpu-mem-gib 16 --peak-tflops 0.1 --intra-gbps 10 --intra-us 1 \
                --inter-gbps 1 --inter-us 10 --global-batch 1 --seq-len "$seq" \
                --precision fp32 --activations "$acts" --json \
                --explain "$label" >"$out/cp$cp/plan-$acts.json"
        done
    done
    python3 - "$out" "$seq" "${cps[@]}" <<'PY'
import json, sys
out, seq, cps = sys.argv[1], int(sys.argv[2]), [int(c) for c in sys.argv[3:]]
runs = []
for cp in cps:
    steps = [r for r in map(json.loads, open(f"{out}/cp{cp}/metrics.jsonl"))
             if r.get("peak_activation_bytes") is not None]
    planned = {}
    for acts in ("ferrotron-cpu", "korthikanti"):
        a = json.load(open(f"{out}/cp{cp}/plan-{acts}.json"))["memory"]["activations"]
        planned[acts] = sum(a[k] for k in ("layers", "embedding", "output", "recompute_working"))
    runs.append({"cp": cp, "ranks": cp,
                 "peak_activation_bytes": max(r["peak_activation_bytes"] for r in steps),
                 "planned_activation_bytes": planned})
print(json.dumps({"model": "llama-mini", "vocab": 300, "seq_len": seq, "micro_batch": 1,
                  "precision": "fp32", "unit": "bytes", "rank": 0, "runs": runs}, indent=1))
PY
    ;;
time)
    pairs=${1:-3} seq=${2:-4096} steps=${3:-6}
    [ "$pairs" -ge 3 ] || { echo "PAIRS must be at least 3" >&2; exit 2; }
    for p in $(seq 1 "$pairs"); do
        train "p$p-cp1" 1 "$seq" "$steps"
        train "p$p-cp2" 2 "$seq" "$steps" --cp 2
    done
    python3 - "$out" "$pairs" "$seq" "$steps" <<'PY'
import json, statistics, sys
out, pairs, seq, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def step_s(run):
    s = [r["step_time_s"] for r in map(json.loads, open(f"{out}/{run}/metrics.jsonl"))
         if r.get("step_time_s") is not None]
    return statistics.median(s[1:])
rows = []
for p in range(1, pairs + 1):
    cp1, cp2 = step_s(f"p{p}-cp1"), step_s(f"p{p}-cp2")
    rows.append({"pair": p, "cp1_step_s": cp1, "cp2_step_s": cp2, "ratio": cp2 / cp1})
print(json.dumps({"model": "llama-mini", "vocab": 300, "seq_len": seq, "micro_batch": 1,
                  "steps": steps, "precision": "fp32", "pairs": rows,
                  "median_ratio_cp2_over_cp1": statistics.median(r["ratio"] for r in rows)},
                 indent=1))
PY
    ;;
*)
    echo "unknown mode $mode (memory, time)" >&2
    exit 2
    ;;
esac
