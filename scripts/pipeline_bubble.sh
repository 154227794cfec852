#!/usr/bin/env bash
# Measures the pipeline bubble of gpt-mini under 1F1B and interleaved 1F1B
# (v = 2) for `--pp P` and `--grad-accum` 4 and 8, and prints a Markdown
# table of the measured bubble (median over the timed steps of
# `metrics.jsonl`'s `pipeline.bubble`) next to the formula's.
#
# Usage: scripts/pipeline_bubble.sh [FERROTRON] [P] [STEPS]
#   FERROTRON  the binary, built with the `mpi` feature
#              (default target/release/ferrotron)
#   P          stages (default 2); one rank per stage, one thread each
#   STEPS      optimizer steps per run (default 6; the first is not timed)
# Needs Open MPI's mpirun and python3. Give each rank its own core: with
# fewer cores than ranks the stages share cores and the figures measure
# the sharing, not the schedule.
set -euo pipefail

bin=${1:-target/release/ferrotron}
p=${2:-2}
steps=${3:-6}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "| schedule | p | m | measured bubble | formula |"
echo "|---|---|---|---|---|"
for schedule in 1f1b interleaved; do
    extra=()
    if [ "$schedule" = interleaved ]; then
        extra=(--pp-virtual 2)
    fi
    for m in 4 8; do
        run="$out/$schedule-$p-$m"
        RAYON_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1 \
            mpirun --allow-run-as-root --oversubscribe -np "$p" \
            -x RAYON_NUM_THREADS -x OMPI_MCA_mpi_yield_when_idle \
            "$bin" train --model gpt-mini --out "$run" --pp "$p" \
            --pp-schedule "$schedule" "${extra[@]}" --grad-accum "$m" \
            --micro-batch 2 --steps "$steps" --eval-every "$steps" \
            --eval-batches 1 --save-every 0 --sample-tokens 0 >/dev/null
        python3 - "$run/metrics.jsonl" "$schedule" "$p" "$m" <<'EOF'
import json, statistics, sys
path, schedule, p, m = sys.argv[1:]
steps = [json.loads(l) for l in open(path)]
pipe = [s["pipeline"] for s in steps if "pipeline" in s][1:]
bubble = statistics.median(x["bubble"] for x in pipe)
print(f"| {schedule} | {p} | {m} | {bubble:.3f} | {pipe[0]['bubble_formula']:.3f} |")
EOF
    done
done
