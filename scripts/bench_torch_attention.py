#!/usr/bin/env python3
"""PyTorch's attention beside `ferrotron bench kernels`.

Times F.scaled_dot_product_attention(q, k, v, is_causal=True), forward and
forward + backward, on the attention shapes of `ferrotron bench kernels`:
[batch, heads, seq, head_dim] with as many key/value heads as query heads,
the default scale, the upstream gradient all ones. Inputs are uniform in
[-1, 1), made on the device once per shape. --warmup untimed runs, then
--reps timed ones, back to back; the medians are reported. A timed run is
a device sync, the forward, a sync (forward ms), the backward, a sync
(forward + backward ms), as `bench kernels` times its fused kernels.

--backend picks PyTorch's implementation through
torch.nn.attention.sdpa_kernel: flash (FlashAttention-2, the default on
cuda; 16-bit types only), efficient (memory-efficient), cudnn, math, or
default (what PyTorch picks; the default on the CPU).

The JSON (--json, written atomically) is what `ferrotron bench kernels
--torch FILE` reads: its rows of the same shape and storage type (bf16 for
attention_cmma_bf16 and attention_mma_bf16, f32 for the others) gain
PyTorch's times and the ratio.

    python3 scripts/bench_torch_attention.py --device cuda --head-dim 128 \\
        --min-seq 1024 --max-seq 8192 --json torch-attention.json
    ferrotron bench kernels --only attention_mma_bf16 --head-dim 128 \\
        --min-seq 1024 --max-seq 8192 --no-reference --torch torch-attention.json
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SCHEMA = "ferrotron-torch-attention/1"
# The sequence lengths of `bench kernels` (ATTENTION_SEQS) and its --quick shapes.
SEQS = [256, 512, 1024, 2048, 4096, 8192]
QUICK_SEQS = [64, 128]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def fail(message):
    print(f"bench_torch_attention: {message}", file=sys.stderr)
    sys.exit(2)


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--backend", choices=["flash", "efficient", "cudnn", "math", "default"],
                   help="default: flash on cuda, default on the CPU")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--min-seq", type=int, default=256)
    p.add_argument("--max-seq", type=int, default=1024)
    p.add_argument("--quick", action="store_true",
                   help="bench kernels --quick's shapes: batch 1, 2 heads, seq 64 and 128")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", help="write the results to this file")
    c = p.parse_args()
    c.backend = c.backend or ("flash" if c.device == "cuda" else "default")
    if c.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch sees no CUDA device")
    if c.backend == "flash" and c.dtype == "f32":
        fail("--backend flash: FlashAttention runs 16-bit types only (--dtype bf16 or f16)")
    if c.head_dim < 1:
        fail("--head-dim must be at least 1")
    if c.reps < 1:
        fail("--reps must be at least 1")
    if c.warmup < 0:
        fail("--warmup must not be negative")
    if c.json and not os.path.isdir(os.path.dirname(os.path.abspath(c.json))):
        fail(f"--json {c.json}: directory does not exist")
    c.batch, c.heads = (1, 2) if c.quick else (4, 8)
    c.seqs = QUICK_SEQS if c.quick else [s for s in SEQS if c.min_seq <= s <= c.max_seq]
    if not c.seqs:
        fail(f"--min-seq {c.min_seq} --max-seq {c.max_seq}: none of {SEQS} is left")
    return c


def backend_context(name):
    """torch.nn.attention.sdpa_kernel restricted to `name`, or no restriction."""
    from contextlib import nullcontext
    if name == "default":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[name])


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def forward_flops(batch, heads, seq, head_dim):
    """bench kernels' count: the FlashAttention-2 paper's, halved by the causal mask."""
    return 4.0 * batch * heads * seq * seq * head_dim / 2.0


def time_shape(c, seq):
    """Median forward and forward + backward seconds at one shape."""
    gen = torch.Generator(device=c.device).manual_seed(seq)
    shape = (c.batch, c.heads, seq, c.head_dim)
    dtype = DTYPES[c.dtype]

    def tensor():
        x = torch.rand(shape, generator=gen, device=c.device, dtype=torch.float32) * 2 - 1
        return x.to(dtype).requires_grad_()

    q, k, v = tensor(), tensor(), tensor()
    d_out = torch.ones(shape, device=c.device, dtype=dtype)
    forward, total = [], []
    for i in range(c.warmup + c.reps):
        for x in (q, k, v):
            x.grad = None
        sync(c.device)
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        sync(c.device)
        t1 = time.perf_counter()
        out.backward(d_out)
        sync(c.device)
        t2 = time.perf_counter()
        if i >= c.warmup:
            forward.append(t1 - t0)
            total.append(t2 - t0)
    return statistics.median(forward), statistics.median(total)


def row(c, seq, forward_s, total_s):
    flops = forward_flops(c.batch, c.heads, seq, c.head_dim)
    backward_s = total_s - forward_s
    return {
        "shape": f"[{c.batch}, {c.heads}, {seq}, {c.head_dim}]",
        "forward_ms": forward_s * 1e3,
        "backward_ms": backward_s * 1e3,
        "ms": total_s * 1e3,
        "forward_tflops": flops / forward_s / 1e12,
        "backward_tflops": 2.5 * flops / backward_s / 1e12 if backward_s > 0 else None,
        "tflops": 3.5 * flops / total_s / 1e12,
    }


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    return "cpu"


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def main():
    c = parse()
    rows = []
    with backend_context(c.backend):
        for seq in c.seqs:
            print(f"bench_torch_attention: [{c.batch}, {c.heads}, {seq}, {c.head_dim}] {c.dtype} "
                  f"({c.backend}) on {c.device}", file=sys.stderr)
            try:
                forward_s, total_s = time_shape(c, seq)
            except RuntimeError as e:
                fail(f"[{c.batch}, {c.heads}, {seq}, {c.head_dim}] with --backend {c.backend}: {e}")
            rows.append(row(c, seq, forward_s, total_s))
    print(f"{'shape':<22} {'fwd ms':>9} {'bwd ms':>9} {'ms':>9} {'TFLOP/s':>9}")
    for r in rows:
        print(f"{r['shape']:<22} {r['forward_ms']:9.3f} {r['backward_ms']:9.3f} {r['ms']:9.3f} "
              f"{r['tflops']:9.2f}")
    if c.json:
        write_json(c.json, {
            "schema": SCHEMA,
            "device": device_name(c.device),
            "torch": torch.__version__,
            "dtype": c.dtype,
            "backend": c.backend,
            "causal": True,
            "warmup": c.warmup,
            "reps": c.reps,
            "rows": rows,
        })


if __name__ == "__main__":
    main()
