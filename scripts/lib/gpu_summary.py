#!/usr/bin/env python3
"""The summary table of scripts/gpu_check.sh, from what its groups left in
OUT_DIR: each phase's status (GROUP/phases.tsv), the gpt-mini runs'
metrics.jsonl (and bf16's loss curve against fp32's), `bench train` and bench_torch.py JSON (tokens/s, and
Ferrotron over PyTorch on the same shape and precision), the attention rows
of `bench kernels` JSON (ms, TFLOP/s) and compute-sanitizer's error
summaries. Prints plain-text tables; reads nothing else.

    python3 scripts/lib/gpu_summary.py OUT_DIR
"""

import glob
import json
import os
import re
import sys

GROUPS = ["train", "step", "kernels"]


def table(title, header, rows):
    """Prints `rows` under `header`, columns padded to their widest cell."""
    print(f"\n{title}")
    if not rows:
        print("  (none)")
        return
    cells = [header] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def fmt(v, digits=1):
    return None if v is None else f"{v:,.{digits}f}"


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def phases(out):
    rows = []
    for g in GROUPS:
        try:
            with open(os.path.join(out, g, "phases.tsv")) as f:
                rows += [line.rstrip("\n").split("\t") for line in f if line.strip()]
        except OSError:
            continue
    table("phases", ["group", "phase", "status", "exit", "s", "note"], rows)


def records(path):
    """The records of a metrics.jsonl, or None where it is missing or bad."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return None


def train_runs(out):
    rows = []
    for name in ["train-cold", "train-warm"]:
        rs = records(os.path.join(out, "train", name, "metrics.jsonl"))
        if rs is None:
            rows.append([name, 0, None, None])
            continue
        steps = [r for r in rs if "loss" in r]
        losses = " ".join(f"{r['loss']:.4f}" for r in steps)
        rows.append([name, len(steps), losses, fmt(steps[-1].get("tokens_per_s") if steps else None, 0)])
    table("gpt-mini bf16 (metrics.jsonl)", ["run", "steps", "losses", "last tokens/s"], rows)


def curves(out):
    """gpt-mini's bf16 run against its fp32 run: the mean of the last ten
    training losses and the last validation loss of each, and bf16's
    relative difference from fp32 for both."""
    rows, ends = [], {}
    for p in ["bf16", "fp32"]:
        rs = records(os.path.join(out, "train", f"curve-{p}", "metrics.jsonl"))
        if rs is None:
            rows.append([p, 0, None, None])
            continue
        losses = [r["loss"] for r in rs if "loss" in r]
        vals = [r["val_loss"] for r in rs if "val_loss" in r]
        last = losses[-10:]
        mean = sum(last) / len(last) if last else None
        val = vals[-1] if vals else None
        ends[p] = (mean, val)
        rows.append([p, len(losses), fmt(mean, 4), fmt(val, 4)])
    diff = [None, None]
    for i in range(2):
        pair = [ends.get(p, (None, None))[i] for p in ["bf16", "fp32"]]
        if None not in pair:
            diff[i] = fmt(100 * (pair[0] / pair[1] - 1), 2) + " %"
    if diff != [None, None]:
        rows.append(["bf16 against fp32", None] + diff)
    table("gpt-mini loss curve (metrics.jsonl)", ["run", "steps", "last-10 mean loss", "last val_loss"], rows)


def bench_train(out):
    results = {}
    for path in sorted(glob.glob(os.path.join(out, "step", "*.json"))):
        doc = load(path)
        for r in (doc or {}).get("results", []):
            who = "torch" if os.path.basename(path).startswith("torch") else "ferrotron"
            key = (os.path.basename(path).split("-", 1)[1].rsplit(".", 1)[0], who)
            results[key] = r
    rows = []
    for tag in sorted({k[0] for k in results}):
        # A matrix-units run (tag ending -mu) is compared with the same shape's PyTorch run.
        base = tag[:-3] if tag.endswith("-mu") else tag
        f, t = results.get((tag, "ferrotron")), results.get((base, "torch"))
        ratio = None
        if f and t and t.get("tokens_per_s"):
            ratio = f"{f['tokens_per_s'] / t['tokens_per_s']:.2f}"
        any_ = f or t
        shape = any_["shape"]
        rows.append([
            tag,
            f"{shape['family']} {shape['layers']}L d{shape['hidden']} b{any_['batch']}xs{any_['seq']}",
            fmt(f and f["tokens_per_s"], 0),
            fmt(f and f.get("mfu") and 100 * f["mfu"]),
            fmt(t and t["tokens_per_s"], 0),
            ratio,
        ])
    table("bench train (tokens/s; ratio = ferrotron / torch)",
          ["run", "shape", "ferrotron", "MFU %", "torch", "ratio"], rows)


def bench_kernels(out):
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "kernels", "kernels-*.json"))):
        for r in (load(path) or {}).get("rows", []):
            if not r["kernel"].startswith("attention"):
                continue
            rows.append([r["kernel"], r["shape"], r["backend"], fmt(r["fused_ms"], 2),
                         fmt(r["reference_ms"], 2), fmt(r["fused_forward_tflops"], 2),
                         fmt(r["fused_tflops"], 2), r.get("note")])
    table("bench kernels, attention (fwd+bwd ms; TFLOP/s by the FlashAttention-2 count)",
          ["kernel", "shape", "backend", "fused ms", "ref ms", "fwd TFLOP/s", "TFLOP/s", "note"],
          rows)


def sanitizer(out):
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "kernels", "sanitizer-*.log"))):
        with open(path, errors="replace") as f:
            # memcheck ends with an ERROR SUMMARY, racecheck with a RACECHECK SUMMARY.
            found = re.findall(r"(?:ERROR|RACECHECK) SUMMARY: .*", f.read())
        rows.append([os.path.basename(path)[:-4], found[-1] if found else "no SUMMARY line"])
    table("compute-sanitizer", ["run", "result"], rows)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_summary.py OUT_DIR")
    out = sys.argv[1]
    print(f"######## summary of {out}")
    phases(out)
    train_runs(out)
    curves(out)
    bench_train(out)
    bench_kernels(out)
    sanitizer(out)


if __name__ == "__main__":
    main()
