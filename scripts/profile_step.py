#!/usr/bin/env python3
"""Where one training step's CPU time goes: classifies the samples of a
`perf record --call-graph dwarf` run of `ferrotron bench train`.

    perf record -F 250 --call-graph dwarf,32768 -o step.data -- \\
        target/release/ferrotron bench train --family gpt ... --warmup 1 --steps 2
    python3 scripts/profile_step.py step.data --last 2*STEP_SECONDS

Only the samples of the last --last seconds of the recording are counted
(the timed steps: model initialisation, the GEMM peak measurement and the
warm-up come before them; the table printed after them takes milliseconds).

Two views, each as shares of the counted samples (cpu-clock: time a thread
was on a CPU, so waiting is not counted):

1. By kind of work, every thread: the leaf function of each sample (GEMM
   micro-kernels, libm exp/log/tanh, Burn-flex element-wise and reduction
   loops, memory: page faults and zeroing of fresh pages in the kernel,
   memcpy/memset, malloc/free).
2. By part of the step, samples whose stack reaches the step (rayon's
   worker threads lose their caller, so this view counts the main thread's
   samples and the workers' only where their stack names the part): the
   forward by model part (from Ferrotron's frames), the backward by Burn
   autodiff node, the optimizer and gradient handling.
"""

import argparse
import collections
import re
import subprocess
import sys

# (label, pattern on the leaf symbol), first match wins.
LEAF_RULES = [
    ("matmul: GEMM micro-kernels and packing", r"gemm|nano_gemm"),
    ("memory: memcpy / memset / to_contiguous", r"memmove|memcpy|memset|to_contiguous|StridedIter|copy"),
    ("memory: malloc / free", r"malloc|_int_free|free@|cfree|realloc|calloc|__libc_free|tcache|unlink_chunk"),
    ("libm exp / log / tanh", r"^__(exp|log|tanh|erf|ieee754)|^(exp|log|tanh)f?(@|$)"),
    ("flex element-wise and reductions", r"burn_flex|macerator|binary_op|unary_op|scalar_op|reduce|sum|max"),
    ("element-wise in generic Rust loops (Vec::from_iter, closures)", r"from_iter|call_once|call_mut|LocalKey"),
    ("rayon scheduling and locks", r"rayon|crossbeam|futex|spin"),
    ("random numbers (initialisation, token ids)", r"rand|distribution|cos_fma"),
]

# Kernel leaves (dso [kernel.kallsyms]) by their stack.
KERNEL_RULES = [
    ("memory: page faults, zeroing fresh pages (kernel)", r"page_fault|clear_page|handle_mm_fault"),
    ("memory: mmap / munmap / freeing pages (kernel)", r"munmap|mmap|madvise|brk|unmap|free_pages|release_pages"),
    ("kernel: other (scheduling, syscalls)", r"."),
]

# The phase of a stack (first match wins); Burn's backward nodes are
# inlined away in a release build, so the backward is one phase.
PHASE_RULES = [
    ("optimizer + gradient handling", r"ferrotron_engine::optim|ferrotron_parallel::(data|zero|flat|train::norm|train::sync)"),
    ("backward", r"burn_autodiff::runtime|AutodiffTensor<B>::backward|burn_autodiff::ops::backward"),
    ("forward", r"ferrotron_models::"),
]

# The forward's model part (first match wins).
PART_RULES = [
    ("logits + cross-entropy", r"cross_entropy|head_logits|head_loss"),
    ("attention core (scores, mask, softmax, values)", r"ops::attention|rope"),
    ("norms", r"ops::norm|layers::norm"),
    ("GELU / SwiGLU", r"gelu|swiglu|silu"),
    ("linear layers", r"layers::linear"),
    ("embedding, residual adds, block glue", r"ferrotron_models::decoder"),
]

def samples(data):
    """Yields (thread id, time s, [(symbol, dso)] leaf first, whether the
    thread is the process's main thread) from `perf script`."""
    text = subprocess.run(
        ["perf", "script", "--no-inline", "-i", data, "-F", "pid,tid,time,ip,sym,dso"],
        check=True, capture_output=True, text=True,
    ).stdout
    head = re.compile(r"^\s*(\d+)/(\d+)\s+([\d.]+):")
    tid, t, frames, main = None, None, [], False
    for line in text.splitlines():
        m = head.match(line)
        if m:
            if tid is not None:
                yield tid, t, frames, main
            pid, tid, t, frames = int(m.group(1)), int(m.group(2)), float(m.group(3)), []
            main = pid == tid
        elif line.strip():
            parts = line.strip().split(None, 1)
            if len(parts) == 2:
                m = re.match(r"^(.*?)(?:\+0x[0-9a-f]+)? \(([^()]*)\)$", parts[1])
                sym, dso = (m.group(1), m.group(2)) if m else (parts[1], "")
                frames.append((sym, dso))
    if tid is not None:
        yield tid, t, frames, main


def classify(rules, text, default):
    for label, pattern in rules:
        if re.search(pattern, text):
            return label
    return default


def table(title, counts, total):
    print(f"\n{title} ({total} samples)")
    for label, n in counts.most_common():
        print(f"  {100.0 * n / total:5.1f} %  {label}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="perf.data of a `ferrotron bench train` run")
    p.add_argument("--last", type=float, required=True,
                   help="seconds at the end of the recording to count (the timed steps)")
    a = p.parse_args()
    all_samples = list(samples(a.data))
    if not all_samples:
        sys.exit(f"error: {a.data}: no samples")
    end = max(t for _, t, _, _ in all_samples)
    window = sorted(
        [(t, tid, frames) for tid, t, frames, _ in all_samples if t >= end - a.last],
        key=lambda x: x[0],
    )
    # The main thread (thread id = process id; the busiest one where the
    # run started other processes) runs the step; rayon's workers (GEMM,
    # element-wise loops) may have more samples than it.
    mains = collections.Counter(tid for tid, t, _, main in all_samples if main and t >= end - a.last)
    main_tid = mains.most_common(1)[0][0] if mains else None
    kinds = []
    for _, _, frames in window:
        stack = "\n".join(sym for sym, _ in frames)
        if frames and "kernel" in frames[0][1]:
            kinds.append(classify(KERNEL_RULES, stack, "kernel"))
        else:
            kinds.append(classify(LEAF_RULES, frames[0][0] if frames else "", "other"))
    # Phase and part: from the sample's own stack where it reaches the
    # step, else (rayon workers) from the main thread's last sample before.
    phases, parts = [], []
    # Workers sampled while the main thread waits on them take its last
    # phase, from before the window where the wait began there.
    last_phase, last_part = "outside the step", None
    before = [(t, f) for tid, t, f, _ in all_samples if tid == main_tid and t < end - a.last]
    if before:
        stack = "\n".join(sym for sym, _ in max(before, key=lambda x: x[0])[1])
        phase = classify(PHASE_RULES, stack, None)
        if phase is not None:
            last_phase = phase
            last_part = classify(PART_RULES, stack, None) if phase == "forward" else None
    for (_, tid, frames) in window:
        stack = "\n".join(sym for sym, _ in frames)
        phase = classify(PHASE_RULES, stack, None)
        part = classify(PART_RULES, stack, None) if phase == "forward" else None
        if tid == main_tid:
            last_phase, last_part = phase or "outside the step", part
        if phase is None:
            phase, part = last_phase, last_part
        phases.append(phase)
        parts.append(part)
    n = len(window)
    table("By kind of work (leaf function), all threads", collections.Counter(kinds), n)
    table("By phase", collections.Counter(phases), n)
    fwd = collections.Counter(p or "forward, part unknown" for p, ph in zip(parts, phases) if ph == "forward")
    table("The forward by model part", fwd, sum(fwd.values()))
    names = ["forward", "backward", "optimizer + gradient handling"]
    print("\nKind of work by phase, % of all samples")
    print("  " + " ".join(f"{x[:9]:>9}" for x in names) + "  kind")
    cross = collections.Counter(zip(kinds, phases))
    for kind, total in collections.Counter(kinds).most_common():
        cells = " ".join(f"{100.0 * cross[(kind, ph)] / n:9.1f}" for ph in names)
        print(f"  {cells}  {kind}")


if __name__ == "__main__":
    main()
