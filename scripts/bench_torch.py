#!/usr/bin/env python3
"""PyTorch eager baseline of `ferrotron bench train`.

Times the same training step on the same shapes: forward, backward,
global-norm clipping at 1.0 and torch.optim.AdamW (betas 0.9/0.95, eps 1e-8,
weight decay 0.1 on matrices and embeddings only, as Ferrotron's), on
random token ids of --batch x --seq; --warmup untimed steps, then --steps
timed ones, the median reported.

--device cpu (default) or cuda. --precision fp32 (default on the CPU) or
bf16 (default on cuda): bf16 is torch.autocast over the forward pass and the
loss, with f32 weights, gradients and AdamW state, as Ferrotron's mixed
precision. fp32 matmuls stay IEEE fp32 (PyTorch's default: no TF32). Writes the JSON schema of `ferrotron bench
train --json` ("ferrotron-bench-train/1"), so `ferrotron bench train
--compare` merges the two.

Models (plain nn.Module, pre-norm, initialised N(0, 0.02), biases zero):
  --family gpt    GPT-2: learned positions (seq rows), LayerNorm (eps 1e-5),
                  GELU-tanh MLP, biases, tied head.
  --family llama  Llama: RMSNorm (eps 1e-5), RoPE (theta 10000, rotate-half),
                  SwiGLU, grouped-query attention, no biases, untied head.
Attention is F.scaled_dot_product_attention(is_causal=True), what eager
PyTorch models (Hugging Face's default "sdpa") run.

FLOPs per token are Ferrotron's (DecoderConfig::train_flops_per_token,
Megatron's count): 6 x the matmul weights (blocks and head) plus
12 x layers x seq x hidden. MFU is against --peak-tflops, else on the CPU
this process's measured f32 torch.mm rate (1024^3, best of 3) and on cuda
the measured torch.mm rate in the compute precision (8192^3, best of 3).
Peak memory is VmHWM on the CPU (reset through /proc/self/clear_refs before
the model is built), the same as Ferrotron's on CPUs; on cuda it is
torch.cuda.max_memory_allocated over the same span.

Shapes A and B of the README:
  python3 scripts/bench_torch.py --family gpt --layers 6 --hidden 384 \
      --heads 6 --ffn 1536 --vocab 50304 --json torch-a.json
  python3 scripts/bench_torch.py --family llama --layers 6 --hidden 384 \
      --heads 6 --kv-heads 2 --ffn 1024 --vocab 32000 --json torch-b.json
"""

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SCHEMA = "ferrotron-bench-train/1"


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads = c.heads, c.kv_heads
        self.head_dim = c.hidden // c.heads
        bias = c.family == "gpt"
        kv = c.kv_heads * self.head_dim
        self.q = nn.Linear(c.hidden, c.hidden, bias=bias)
        self.k = nn.Linear(c.hidden, kv, bias=bias)
        self.v = nn.Linear(c.hidden, kv, bias=bias)
        self.o = nn.Linear(c.hidden, c.hidden, bias=bias)

    def forward(self, x, rope):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


def rope_tables(seq, head_dim, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, rope):
    cos, sin = rope
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class RmsNorm(nn.Module):
    def __init__(self, hidden, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gated = c.family == "llama"
        bias = not self.gated
        self.up = nn.Linear(c.hidden, c.ffn, bias=bias)
        if self.gated:
            self.gate = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=bias)

    def forward(self, x):
        if self.gated:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def norm(c):
    return nn.LayerNorm(c.hidden, eps=1e-5) if c.family == "gpt" else RmsNorm(c.hidden)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm, self.attn = norm(c), Attention(c)
        self.mlp_norm, self.mlp = norm(c), Mlp(c)

    def forward(self, x, rope):
        x = x + self.attn(self.attn_norm(x), rope)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.pos = nn.Embedding(c.seq, c.hidden) if c.family == "gpt" else None
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.final_norm = norm(c)
        self.head = None if c.family == "gpt" else nn.Linear(c.hidden, c.vocab, bias=False)
        self.rope = None
        if c.family == "llama":
            cos, sin = rope_tables(c.seq, c.hidden // c.heads)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids, targets):
        x = self.embed(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
        rope = (self.rope_cos, self.rope_sin) if self.c.family == "llama" else None
        for block in self.blocks:
            x = block(x, rope)
        x = self.final_norm(x)
        weight = self.embed.weight if self.head is None else self.head.weight
        logits = x @ weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def flops_per_token(c):
    """Ferrotron's DecoderConfig::train_flops_per_token (Megatron's count)."""
    h, kv, f = c.hidden, c.kv_heads * (c.hidden // c.heads), c.ffn
    mats = 3 if c.family == "llama" else 2
    per_layer = 2 * h * h + 2 * h * kv + mats * h * f
    return 6.0 * (c.layers * per_layer + h * c.vocab) + 12.0 * c.layers * c.seq * h


def params(model):
    return sum(p.numel() for p in model.parameters())


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{platform.machine()} CPU"


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    n, unit = line.split()[1:3]
                    return int(n) * 1024 if unit == "kB" else None
    except OSError:
        pass
    return None


def gemm_flops(device, dtype, n, repeats=3):
    """Best-of-`repeats` rate of an n^3 torch.mm on random data, FLOP/s."""
    a = torch.rand(n, n, device=device, dtype=dtype)
    b = torch.rand(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2.0 * n**3 / best


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=["gpt", "llama"], required=True)
    for flag in ["layers", "hidden", "heads", "ffn", "vocab"]:
        p.add_argument(f"--{flag}", type=int, required=True)
    p.add_argument("--kv-heads", type=int, help="default: --heads")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"],
                   help="compute precision (default: fp32 on cpu, bf16 on cuda)")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU, TFLOP/s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results to this file")
    c = p.parse_args()
    c.kv_heads = c.kv_heads or c.heads
    c.precision = c.precision or ("fp32" if c.device == "cpu" else "bf16")
    if c.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch sees no CUDA device")
    if c.device == "cpu" and c.precision != "fp32":
        fail("--precision bf16: only with --device cuda (the CPU baseline is fp32)")
    if c.peak_tflops is not None and not c.peak_tflops > 0:
        fail(f"--peak-tflops {c.peak_tflops}: must be positive")
    for flag in ["layers", "hidden", "heads", "ffn", "vocab", "batch", "seq", "steps", "threads"]:
        if getattr(c, flag) < 1:
            fail(f"--{flag.replace('_', '-')} must be at least 1")
    if c.warmup < 0:
        fail("--warmup must not be negative")
    if c.hidden % c.heads:
        fail(f"--hidden {c.hidden} must be divisible by --heads {c.heads}")
    if c.heads % c.kv_heads:
        fail(f"--kv-heads {c.kv_heads} must divide --heads {c.heads}")
    if c.family == "gpt" and c.kv_heads != c.heads:
        fail("--kv-heads: the gpt family is multi-head (--kv-heads = --heads)")
    if c.json and not os.path.isdir(os.path.dirname(os.path.abspath(c.json))):
        fail(f"--json {c.json}: directory does not exist")
    return c


def main():
    c = parse()
    dev = c.device
    torch.set_num_threads(c.threads)
    torch.manual_seed(c.seed)
    dtype = torch.float32 if c.precision == "fp32" else torch.bfloat16
    if c.peak_tflops is not None:
        peak, peak_source = c.peak_tflops * 1e12, "--peak-tflops"
    elif dev == "cpu":
        peak = gemm_flops(dev, torch.float32, 1024)
        peak_source = "the measured f32 torch.mm rate (1024^3, best of 3)"
    else:
        peak = gemm_flops(dev, dtype, 8192)
        peak_source = f"the measured {c.precision} torch.mm rate (8192^3, best of 3)"
    if dev == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        rss_reset = True
    else:
        rss_reset = reset_peak_rss()
    model = Decoder(c).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
    )
    gen = torch.Generator().manual_seed(c.seed)
    times, loss = [], float("nan")
    total = c.warmup + c.steps
    for i in range(total):
        row = torch.randint(c.vocab, (c.batch, c.seq + 1), generator=gen).to(dev)
        ids, targets = row[:, :-1], row[:, 1:]
        sync(dev)
        t = time.perf_counter()
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=c.precision == "bf16"):
            out = model(ids, targets)
        opt.zero_grad(set_to_none=True)
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = out.item()
        sync(dev)
        s = time.perf_counter() - t
        phase = "warm-up" if i < c.warmup else "timed"
        print(f"bench_torch: step {i + 1}/{total} ({phase}): {s:.3f} s, loss {loss:.4f}", file=sys.stderr)
        if i >= c.warmup:
            times.append(s)
    step_s = statistics.median_high(times)
    tokens_per_s = c.batch * c.seq / step_s
    fpt = flops_per_token(c)
    tflops = fpt * tokens_per_s / 1e12
    if dev == "cuda":
        device_name = f"{torch.cuda.get_device_name(0)} (cuda GPU 0)"
        peak_memory = torch.cuda.max_memory_allocated()
        memory_source = "torch.cuda.max_memory_allocated from building the model to the last step"
    else:
        device_name = cpu_name()
        peak_memory = peak_rss_bytes()
        memory_source = ("VmHWM, the process's peak resident memory from building the model to the last step"
                         if rss_reset else
                         "VmHWM, the process's peak resident memory since it started (clear_refs not writable)")
    record = {
        "framework": f"pytorch {torch.__version__} eager",
        "commit": None,
        "backend": dev,
        "device": device_name,
        "threads": torch.get_num_threads() if dev == "cpu" else None,
        "precision": c.precision,
        "shape": {
            "family": c.family, "layers": c.layers, "hidden": c.hidden, "heads": c.heads,
            "kv_heads": c.kv_heads, "ffn": c.ffn, "vocab": c.vocab,
            "tied_head": c.family == "gpt", "params": params(model),
        },
        "batch": c.batch, "seq": c.seq, "warmup": c.warmup, "steps": c.steps,
        "step_s_median": step_s,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": fpt,
        "tflops": tflops,
        "peak_tflops": peak / 1e12,
        "peak_source": peak_source,
        "mfu": tflops / (peak / 1e12),
        "peak_memory_bytes": peak_memory,
        "memory_source": memory_source,
        "last_loss": loss,
    }
    where = f"{record['threads']} threads" if dev == "cpu" else c.precision
    print(f"pytorch {torch.__version__} eager on {record['device']} ({where}): "
          f"{tokens_per_s:.0f} tokens/s, {tflops:.4f} TFLOP/s, MFU {100 * record['mfu']:.1f}%")
    if c.json:
        tmp = c.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"schema": SCHEMA, "results": [record], "skipped": []}, f, indent=2)
        os.replace(tmp, c.json)


if __name__ == "__main__":
    main()
