#!/usr/bin/env python3
"""Hugging Face parity fixtures for Ferrotron, and the export check.

Needs `pip install torch transformers safetensors` (CPU is enough).

    python3 scripts/make_hf_fixtures.py generate [OUT]
        Writes tiny random-initialised models of every family (fp32, eager
        attention, fixed seeds) and what `transformers` computes with them to
        OUT (default crates/models/tests/fixtures/hf/). Each fixture is a
        folder NAME/ holding
          model/            a valid Hugging Face model directory (config.json,
                            model.safetensors, tokenizer.json for gpt2)
          input_ids.json    {"input_ids": [[...], ...]}: the batch
          expected.json     loss, AdamW settings, greedy prompt and tokens
          expected.safetensors
                            logits [batch, seq, vocab]; grad.<HF name> for every
                            parameter (of the loss over `input_ids`);
                            adamw.<HF name>: parameters after 3 AdamW steps

    python3 scripts/make_hf_fixtures.py check-export --ferrotron BIN [FIXTURES]
        For every fixture, two exports: f32 (`BIN export --hf-dir model --out
        TMP`) and bf16 in 4 KB shards (`--dtype bf16 --max-shard-size 4KB`).
        Each is loaded by transformers' from_pretrained and re-imported by
        `BIN eval --hf-dir TMP`: their logits must agree within 1e-5, and the
        loss must be the fixture's (1e-5 for f32, 2e-2 for bf16). Then a run
        trained 2 steps from the gpt2 fixture is exported as bf16 shards and
        transformers must give the run's loss (`BIN eval --run`) within 2e-2.
        Exits non-zero on any mismatch.

Every parameter (norm gains and biases included) is drawn at random, so a
mapping that confused two tensors cannot pass by accident.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    BloomConfig,
    GPT2Config,
    LlamaConfig,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "crates", "models", "tests", "fixtures", "hf")

# AdamW as Ferrotron's: decoupled decay on parameters of rank >= 2 only
# (matrices and embeddings), none on biases and norm gains; constant lr.
ADAMW = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "steps": 3}
BATCH, SEQ = 2, 8
PROMPT_LEN, NEW_TOKENS = 4, 16


def configs():
    """(name, config) of every fixture. Sizes are kept tiny so that the
    committed fixtures stay small."""
    common = dict(bos_token_id=0, eos_token_id=None, pad_token_id=None)
    return [
        # GPT-2: learned positions, fused c_attn, Conv1D, tied head.
        ("gpt2", GPT2Config(vocab_size=96, n_embd=16, n_layer=2, n_head=4, n_inner=64,
                            n_positions=32, activation_function="gelu_new",
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            tie_word_embeddings=True, **common)),
        # Llama 3 style: GQA (2 kv heads for 4 query heads), RoPE theta 500000,
        # untied head.
        ("llama", LlamaConfig(vocab_size=96, hidden_size=16, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2,
                              intermediate_size=32, max_position_embeddings=64,
                              rms_norm_eps=1e-5, rope_theta=500000.0,
                              tie_word_embeddings=False, **common)),
        # Llama with a tied head and MHA, theta 10000.
        ("llama_tied", LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2,
                                   intermediate_size=24, max_position_embeddings=64,
                                   rms_norm_eps=1e-6, rope_theta=10000.0,
                                   tie_word_embeddings=True, **common)),
        # BLOOM: ALiBi with 6 heads (not a power of two), fused per-head
        # interleaved query_key_value, embedding LayerNorm, tied head.
        ("bloom", BloomConfig(vocab_size=96, hidden_size=12, n_layer=2, n_head=6,
                              layer_norm_epsilon=1e-5, hidden_dropout=0.0,
                              attention_dropout=0.0, tie_word_embeddings=True, **common)),
        # Llama 3.1 RoPE scaling over a small original context (64 tokens):
        # head_dim 8 at theta 10000 has wavelengths 2 pi x (1, 10, 100, 1000),
        # one in each band (kept < 8, interpolated, divided by 4 > 64).
        ("llama3_scaled", LlamaConfig(vocab_size=96, hidden_size=16, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1,
                                      intermediate_size=32, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, tie_word_embeddings=False,
                                      rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0,
                                                       "factor": 4.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 8.0,
                                                       "original_max_position_embeddings": 64},
                                      **common)),
        # Linear (position interpolation) scaling by 2.5.
        ("llama_linear", LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2,
                                     intermediate_size=24, max_position_embeddings=64,
                                     rms_norm_eps=1e-6, tie_word_embeddings=True,
                                     rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                      "factor": 2.5},
                                     **common)),
    ]


def build(config, seed):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                             dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn_like(p) * 0.3)
            elif name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
            else:  # norm gains
                p.copy_(1.0 + torch.randn_like(p) * 0.1)
    return model


def assert_scaling_matters(name, config, model):
    """For a fixture with RoPE scaling: the same weights without it must give
    other logits inside the test's window, or the fixture tests nothing."""
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") == "default":
        return
    plain_config = config.__class__(**{**config.to_dict(), "rope_parameters": {
        "rope_type": "default", "rope_theta": rope["rope_theta"]}})
    plain = AutoModelForCausalLM.from_config(plain_config, attn_implementation="eager",
                                             dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.eval()
    ids = torch.arange(SEQ).unsqueeze(0) % config.vocab_size
    with torch.no_grad():
        diff = float((model(ids).logits - plain(ids).logits).abs().max())
    assert diff > 1e-2, f"{name}: RoPE scaling changes the logits by only {diff}"
    print(f"{name}: {rope['rope_type']} scaling changes the logits by up to {diff:.3f}")


def loss_of(model, ids):
    logits = model(ids).logits
    v = logits.shape[-1]
    return logits, F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))


def greedy(model, prompt, n):
    """Greedy tokens by full re-computation, and the smallest top-1/top-2 gap."""
    seq = list(prompt)
    gap = float("inf")
    with torch.no_grad():
        for _ in range(n):
            last = model(torch.tensor([seq])).logits[0, -1]
            top = torch.topk(last, 2).values
            gap = min(gap, float(top[0] - top[1]))
            seq.append(int(last.argmax()))
    return seq[len(prompt):], gap


def tiny_tokenizer(vocab_size, path):
    """A word-level tokenizer with fewer ids than the model's vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = ["[UNK]", "the", "king", "queen", "of", "and", "to", "a", "my", "lord",
             "is", "in", "that", "with", "ROMEO", ":", ",", ".", "!", "love"]
    assert len(words) <= vocab_size
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.save(path)


def generate(out):
    for index, (name, config) in enumerate(configs()):
        d = os.path.join(out, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        model = build(config, seed=1000 + index)
        assert_scaling_matters(name, config, model)
        model.save_pretrained(os.path.join(d, "model"), safe_serialization=True)
        if name == "gpt2":
            tiny_tokenizer(config.vocab_size, os.path.join(d, "model", "tokenizer.json"))
        g = torch.Generator().manual_seed(2000 + index)
        ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=g)

        model.zero_grad()
        logits, loss = loss_of(model, ids)
        loss.backward()
        tensors = {"logits": logits.detach().contiguous()}
        for pname, p in model.named_parameters():
            tensors[f"grad.{pname}"] = p.grad.detach().clone().contiguous()

        # Greedy generation, uncached and through transformers' cached generate.
        prompt = ids[0, :PROMPT_LEN].tolist()
        new, gap = greedy(model, prompt, NEW_TOKENS)
        with torch.no_grad():
            cached = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                                    min_new_tokens=NEW_TOKENS, do_sample=False,
                                    use_cache=True)[0, PROMPT_LEN:].tolist()
        assert cached == new, (name, cached, new)
        assert gap > 1e-3, f"{name}: greedy decoding has a near tie ({gap}); change the seed"

        # AdamW: decay on rank >= 2, none on rank 1, constant lr, no clipping.
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": ADAMW["weight_decay"]},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"])
        x, y = ids[:, :-1], ids[:, 1:]
        for _ in range(ADAMW["steps"]):
            opt.zero_grad()
            lg = model(x).logits
            F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)).backward()
            opt.step()
        for pname, p in model.named_parameters():
            tensors[f"adamw.{pname}"] = p.detach().clone().contiguous()
        save_file(tensors, os.path.join(d, "expected.safetensors"))

        with open(os.path.join(d, "input_ids.json"), "w") as f:
            json.dump({"input_ids": ids.tolist()}, f)
        expected = {
            "loss": float(loss),
            "tokens": BATCH * (SEQ - 1),
            "adamw": {k: (list(v) if isinstance(v, tuple) else v) for k, v in ADAMW.items()},
            "adamw_decay": "rank >= 2 (matrices, embeddings); none on biases and norms",
            "prompt_ids": prompt,
            "greedy_ids": new,
            "greedy_min_gap": gap,
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
        }
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1)
        print(f"{name}: loss {float(loss):.6f}, greedy gap {gap:.4f}, "
              f"{sum(p.numel() for p in model.parameters())} parameters")


def transformers_logits(model_dir, ids):
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                                 dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(ids).logits


def ferrotron_eval(ferrotron, source, tokens, logits_out):
    """(loss, logits) of `ferrotron eval`; `source` is ["--hf-dir", D] or ["--run", D]."""
    out = subprocess.run([ferrotron, "eval", *source, "--tokens", tokens,
                          "--logits-out", logits_out],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["loss"], load_file(logits_out)["logits"]


def mean_loss(logits, ids):
    v = logits.shape[-1]
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1)))


def export_and_compare(ferrotron, source, tokens, out, extra, reference_loss, loss_tol):
    """Exports `source` with `extra` flags to `out`, then checks that
    transformers' logits of `out` match Ferrotron's re-import of it (1e-5) and
    that the loss is within `loss_tol` of `reference_loss`. Returns (ok, text)."""
    subprocess.run([ferrotron, "export", *source, "--out", out, *extra], check=True,
                   stdout=subprocess.DEVNULL)
    with open(tokens) as f:
        ids = torch.tensor(json.load(f)["input_ids"])
    loss, ours = ferrotron_eval(ferrotron, ["--hf-dir", out], tokens, out + ".logits")
    theirs = transformers_logits(out, ids)
    err = float((theirs - ours).abs().max())
    loss_err = abs(mean_loss(theirs, ids) - reference_loss)
    ok = err <= 1e-5 and loss_err <= loss_tol and abs(loss - mean_loss(theirs, ids)) <= 1e-5
    shards = [n for n in os.listdir(out) if n.endswith(".safetensors")]
    return ok, (f"{len(shards)} file(s), logits vs re-import {err:.2e}, "
                f"loss {mean_loss(theirs, ids):.6f} vs {reference_loss:.6f} "
                f"(tolerance {loss_tol:g})")


# bf16 keeps 8 significant bits; over these tiny models the loss moves by a
# few 1e-3 at most.
BF16_LOSS_TOL = 2e-2


def check_export(ferrotron, fixtures):
    failed = False

    def report(label, ok, text):
        nonlocal failed
        failed |= not ok
        print(f"{label}: {text} {'ok' if ok else 'FAIL'}")

    for name in sorted(os.listdir(fixtures)):
        d = os.path.join(fixtures, name)
        if not os.path.isdir(os.path.join(d, "model")):
            continue
        tokens = os.path.join(d, "input_ids.json")
        with open(os.path.join(d, "expected.json")) as f:
            loss = json.load(f)["loss"]
        source = ["--hf-dir", os.path.join(d, "model")]
        with tempfile.TemporaryDirectory() as tmp:
            report(f"{name} f32", *export_and_compare(
                ferrotron, source, tokens, os.path.join(tmp, "f32"), [], loss, 1e-5))
            report(f"{name} bf16 sharded", *export_and_compare(
                ferrotron, source, tokens, os.path.join(tmp, "bf16"),
                ["--dtype", "bf16", "--max-shard-size", "4KB"], loss, BF16_LOSS_TOL))

    # A trained run (2 steps from the gpt2 fixture, which has a tokenizer),
    # exported as bf16 shards: transformers gives the run's loss.
    d = os.path.join(fixtures, "gpt2")
    tokens = os.path.join(d, "input_ids.json")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w") as f:
            f.write("the king of love and the queen , my lord .\n" * 200)
        run = os.path.join(tmp, "run")
        subprocess.run([ferrotron, "train", "--hf-dir", os.path.join(d, "model"), "--corpus",
                        corpus, "--steps", "2", "--seq-len", "16", "--micro-batch", "2",
                        "--eval-every", "2", "--eval-batches", "1", "--sample-tokens", "0",
                        "--peak-tflops", "1", "--out", run], check=True,
                       stdout=subprocess.DEVNULL)
        run_loss, _ = ferrotron_eval(ferrotron, ["--run", run], tokens,
                                     os.path.join(tmp, "run.logits"))
        report("trained run bf16 sharded", *export_and_compare(
            ferrotron, ["--run", run], tokens, os.path.join(tmp, "bf16"),
            ["--dtype", "bf16", "--max-shard-size", "4KB"], run_loss, BF16_LOSS_TOL))
    if failed:
        sys.exit(1)
    print("export check passed")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("out", nargs="?", default=DEFAULT_OUT)
    c = sub.add_parser("check-export")
    c.add_argument("--ferrotron", required=True, help="path of the ferrotron binary")
    c.add_argument("fixtures", nargs="?", default=DEFAULT_OUT)
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    if a.cmd == "generate":
        generate(a.out)
    else:
        check_export(a.ferrotron, a.fixtures)


if __name__ == "__main__":
    main()
