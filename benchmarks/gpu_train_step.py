"""One training step of the book's language models against the strongest baselines a reader would use.

Run from anywhere (only ``torch`` and ``numpy`` are needed; ``transformers`` adds a row)::

    python benchmarks/gpu_train_step.py            # CUDA if present, else a small CPU table
    python benchmarks/gpu_train_step.py --steps 30  # more timed steps per row

A step is forward + backward + an AdamW step (``fused=True`` where PyTorch has it), the same
loss on both sides (mean next-token cross-entropy over all ``B T`` positions), on random token
ids. On CUDA the step runs under ``torch.autocast(dtype=torch.bfloat16)`` with float32 weights,
nanoGPT's recipe; on the CPU it runs in float32 (CPU bf16 speed says nothing about a GPU).

Rows:

* ``DecoderLM`` (``tfbook.torch.models``) against **nanoGPT**: the model of
  https://github.com/karpathy/nanoGPT (``model.py``), written out below (``NanoGPT``) with
  biases on, no dropout, ``F.scaled_dot_product_attention(is_causal=True)``, tied embeddings:
  the same architecture and parameter count. Before timing, DecoderLM's weights are copied
  into it and the two logits compared in float32, so the two sides compute the same function.
  Shapes: GPT-2 small (12 layers x 768, 12 heads, T = 1024, vocabulary 50304, B = 8) and
  nanoGPT's ``shakespeare_char`` (6 x 384, 6 heads, T = 256, vocabulary 65, B = 64).
* ``LlamaLM`` (``tfbook.torch.modern``) against **Hugging Face** ``LlamaForCausalLM`` built
  from a ``LlamaConfig`` (random weights, nothing downloaded, ``attn_implementation="sdpa"``),
  the same shape (12 x 768, 12 heads, 4 KV heads, SwiGLU 2048, T = 1024, vocabulary 32000,
  B = 8). Skipped, with the reason, where ``transformers`` is not installed.

Printed per row: median ms per step over the timed steps (after warm-up), the ratio
book / baseline (below 1: the book's model is faster), model FLOPs utilisation (MFU: the
FLOPs of the step by nanoGPT's count, ``6 N_θ + 12 L T D`` per token, over the time and
the GPU's dense bf16 peak; "-" where the peak of the GPU is not in the table below) and
the peak memory the CUDA allocator held (``torch.cuda.max_memory_allocated``). A row
that runs out of memory prints ``OOM`` and the next row runs. On the CPU the rows are small
shapes (2 cores take seconds per GPT-2-small step) and there is no MFU or memory column.

The two models of a row alternate step by step, so that a change in the machine's load or
clock affects both. The whole run takes about a minute on an H100/H200 (most of it building
the models), a few minutes on two busy CPU cores.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as TF

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere, without installing tfbook
    sys.path.insert(0, str(ROOT))

from tfbook.torch.models import DecoderLM, DecoderLMConfig  # noqa: E402
from tfbook.torch.modern import LlamaLM, LlamaLMConfig  # noqa: E402

# Dense bf16 peak FLOP/s (no sparsity) from the vendors' data sheets, by a substring of the name.
# The first entry whose key the device name contains wins ("NVIDIA H100 80GB HBM3" is the SXM card).
PEAK_BF16 = [("H200", 989e12), ("H100 NVL", 835e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("H800", 989e12),
             ("A100", 312e12), ("L40S", 362e12), ("A10G", 70e12), ("L4", 121e12),
             ("RTX 4090", 165e12), ("RTX 3090", 71e12)]


# ---------------------------------------------------------------------------------------
# nanoGPT's model (karpathy/nanoGPT model.py, dropout 0, flash path), for the comparison
# ---------------------------------------------------------------------------------------


class _LayerNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return TF.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class _Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.c_attn, self.c_proj, self.h = nn.Linear(d, 3 * d), nn.Linear(d, d), h

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.h, C // self.h).transpose(1, 2) for z in (q, k, v))
        y = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class _Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = _LayerNorm(d), _Attention(d, h), _LayerNorm(d)
        self.c_fc, self.gelu, self.c_proj = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(self.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, d):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln_f = _LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def copy_decoderlm_into_nanogpt(ours: DecoderLM, ref: NanoGPT) -> None:
    """Copy the weights (the book stores ``X @ W``, ``nn.Linear`` stores ``W.T``)."""
    with torch.no_grad():
        ref.wte.weight.copy_(ours.W_E)
        ref.wpe.weight.copy_(ours.pos.weight)
        for b, r in zip(ours.blocks, ref.h):
            a = b.attn
            r.attn.c_attn.weight.copy_(torch.cat([a.W_Q, a.W_K, a.W_V], dim=1).T)
            r.attn.c_attn.bias.copy_(torch.cat([a.b_Q, a.b_K, a.b_V]))
            r.attn.c_proj.weight.copy_(a.W_O.T)
            r.attn.c_proj.bias.copy_(a.b_O)
            r.c_fc.weight.copy_(b.ffn.W_1.T)
            r.c_fc.bias.copy_(b.ffn.b_1)
            r.c_proj.weight.copy_(b.ffn.W_2.T)
            r.c_proj.bias.copy_(b.ffn.b_2)
            for n_ours, n_ref in ((b.norm1, r.ln_1), (b.norm2, r.ln_2)):
                n_ref.weight.copy_(n_ours.gamma)
                n_ref.bias.copy_(n_ours.beta)
        ref.ln_f.weight.copy_(ours.norm.gamma)
        ref.ln_f.bias.copy_(ours.norm.beta)


class _HFWrapper(nn.Module):
    """``idx -> logits`` for a Hugging Face causal LM."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx):
        return self.model(input_ids=idx, use_cache=False).logits


# ---------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------


@dataclass
class Shape:
    name: str
    B: int
    T: int
    layers: int
    d: int
    heads: int
    vocab: int
    kv_heads: int = 0  # Llama rows only
    d_ff: int = 0  # Llama rows only (SwiGLU hidden width)


GPU_SHAPES = [
    ("decoder", Shape("GPT-2 small", 8, 1024, 12, 768, 12, 50304)),
    ("decoder", Shape("shakespeare_char", 64, 256, 6, 384, 6, 65)),
    ("llama", Shape("Llama 12x768 GQA", 8, 1024, 12, 768, 12, 32000, kv_heads=4, d_ff=2048)),
]
CPU_SHAPES = [
    ("decoder", Shape("small 4x256", 8, 128, 4, 256, 4, 65)),
    ("decoder", Shape("shakespeare_char, B=4", 4, 256, 6, 384, 6, 65)),
    ("llama", Shape("Llama small 4x256 GQA", 8, 128, 4, 256, 4, 65, kv_heads=2, d_ff=688)),
]


def build_pair(kind: str, s: Shape):
    """(book model, baseline model, baseline name, note), on the CPU; the baseline None with the reason in note."""
    torch.manual_seed(0)
    if kind == "decoder":
        ours = DecoderLM(DecoderLMConfig(vocab_size=s.vocab, block_size=s.T, d_model=s.d, num_heads=s.heads,
                                         num_layers=s.layers, d_ff=4 * s.d, norm_first=True,
                                         activation="gelu", pos="learned", tie_weights=True))
        ref = NanoGPT(s.vocab, s.T, s.layers, s.heads, s.d)
        copy_decoderlm_into_nanogpt(ours, ref)
        idx = torch.randint(0, s.vocab, (1, min(s.T, 64)))
        with torch.no_grad():
            err = (ours(idx) - ref(idx)).abs().max().item()
        if not err < 1e-3:  # float32 round-off over a dozen layers is ~1e-5
            raise AssertionError(f"nanoGPT with DecoderLM's weights differs by {err:.2e}: not the same model")
        note = f"same function: max |logit diff| {err:.1e} (float32, copied weights)"
        return ours, ref, "nanoGPT", note
    ours = LlamaLM(LlamaLMConfig(vocab_size=s.vocab, block_size=s.T, d_model=s.d, num_heads=s.heads,
                                 num_kv_heads=s.kv_heads, num_layers=s.layers, d_ff=s.d_ff, tie_weights=True))
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except Exception as e:  # ImportError, or a transformers that fails to import
        return ours, None, "HF Llama", f"skipped: transformers not importable ({type(e).__name__})"
    cfg = LlamaConfig(vocab_size=s.vocab, hidden_size=s.d, intermediate_size=s.d_ff, num_hidden_layers=s.layers,
                      num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, max_position_embeddings=s.T,
                      tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0, attention_dropout=0.0)
    try:
        hf = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")
    except TypeError:  # older transformers
        hf = LlamaForCausalLM(cfg)
    n_ours, n_hf = (sum(p.numel() for p in m.parameters()) for m in (ours, hf))
    note = f"params {n_ours:,} vs {n_hf:,}" + ("" if n_ours == n_hf else " (NOT equal)")
    return ours, _HFWrapper(hf), "HF Llama", note


def step_fn(model, idx, y, device: str):
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    except (RuntimeError, TypeError, ValueError):  # no fused AdamW for this device/torch
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    amp = device == "cuda"

    def step():
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
            logits = model(idx)
            loss = TF.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_pair(steps: dict, device: str, warm_up: int, timed: int) -> dict:
    """Median seconds per step of each model, alternating, after ``warm_up`` steps each."""
    for _ in range(warm_up):
        for f in steps.values():
            f()
    _sync(device)
    times = {k: [] for k in steps}
    for _ in range(timed):
        for k, f in steps.items():
            _sync(device)
            t0 = time.perf_counter()
            f()
            _sync(device)
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def peak_flops(device: str) -> float | None:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    for key, flops in PEAK_BF16:
        if key in name:
            return flops
    return None


def model_flops_per_step(model, s: Shape) -> float:
    """nanoGPT's count: ``6 N_θ`` per token for the weights (the embedding counted once,
    as tied), ``12 L T D`` per token for attention's two T x T products, fwd + bwd."""
    n = sum(p.numel() for p in model.parameters())
    return (6 * n + 12 * s.layers * s.T * s.d) * s.B * s.T


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, getattr(torch.cuda, "OutOfMemoryError", ())) or "out of memory" in str(e).lower()


def run_row(kind: str, s: Shape, device: str, warm_up: int, timed: int) -> dict:
    row = {"shape": s.name, "B": s.B, "T": s.T, "note": ""}
    ours = ref = None
    try:
        ours, ref, ref_name, note = build_pair(kind, s)
        row.update(book="DecoderLM" if kind == "decoder" else "LlamaLM", baseline=ref_name, note=note)
        g = torch.Generator().manual_seed(1)
        idx = torch.randint(0, s.vocab, (s.B, s.T + 1), generator=g).to(device)
        x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
        models = {"book": ours} if ref is None else {"book": ours, "baseline": ref}
        steps, mem = {}, {}
        for k, m in models.items():
            # Each model's own memory: what the allocator holds beyond what was there before the
            # model came to the GPU (the other model), at the peak of its second step (weights,
            # gradients, AdamW's two moments and the activations).
            before = torch.cuda.memory_allocated() if device == "cuda" else 0
            m.to(device)
            steps[k] = step_fn(m, x, y, device)
            if device == "cuda":
                steps[k]()
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                steps[k]()
                torch.cuda.synchronize()
                mem[k] = (torch.cuda.max_memory_allocated() - before) / 2**30
        peak = peak_flops(device)
        sec = time_pair(steps, device, warm_up, timed)
        for k, m in models.items():
            row[f"{k}_ms"] = 1e3 * sec[k]
            row[f"{k}_mfu"] = None if peak is None else model_flops_per_step(m, s) / sec[k] / peak
            row[f"{k}_gib"] = mem.get(k)
        if ref is not None:
            row["ratio"] = sec["book"] / sec["baseline"]
    except Exception as e:  # one row's failure (OOM above all) must not end the run
        if not _is_oom(e):
            row["note"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        else:
            row["note"] = "OOM"
        row.setdefault("book", "DecoderLM" if kind == "decoder" else "LlamaLM")
        row.setdefault("baseline", "nanoGPT" if kind == "decoder" else "HF Llama")
    finally:
        del ours, ref
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def _f(x, spec, none="-"):
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def print_table(rows, device):
    head = (f"{'model':<10} {'baseline':<9} {'shape':<22} {'B':>3} {'T':>5} {'book ms':>9} {'base ms':>9} "
            f"{'ratio':>6}")
    if device == "cuda":
        head += f" {'MFU book':>9} {'MFU base':>9} {'GiB book':>9} {'GiB base':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        line = (f"{r['book']:<10} {r['baseline']:<9} {r['shape']:<22} {r['B']:>3} {r['T']:>5} "
                f"{_f(r.get('book_ms'), '9.1f'):>9} {_f(r.get('baseline_ms'), '9.1f'):>9} "
                f"{_f(r.get('ratio'), '6.2f'):>6}")
        if device == "cuda":
            line += (f" {_f(r.get('book_mfu') and 100 * r['book_mfu'], '8.1f') + '%':>9}"
                     f" {_f(r.get('baseline_mfu') and 100 * r['baseline_mfu'], '8.1f') + '%':>9}"
                     f" {_f(r.get('book_gib'), '9.2f'):>9} {_f(r.get('baseline_gib'), '9.2f'):>9}")
        print(line)
        if r.get("note"):
            print(f"{'':<10} {r['note']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="timed steps per model (default 20 CUDA, 3 CPU)")
    ap.add_argument("--warm-up", type=int, default=None, help="untimed steps first (default 5 CUDA, 1 CPU)")
    ap.add_argument("--cpu", action="store_true", help="the CPU table even where CUDA is present")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    timed = args.steps or (20 if device == "cuda" else 3)
    warm_up = args.warm_up if args.warm_up is not None else (5 if device == "cuda" else 1)
    if device == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for the float32 parts, as nanoGPT sets it
        what = f"{torch.cuda.get_device_name()}, bf16 autocast"
    else:
        what = f"CPU, {torch.get_num_threads()} threads, float32"
    print(f"training step (forward + backward + AdamW), {what}; torch {torch.__version__}, "
          f"{timed} timed steps after {warm_up} warm-up, median", flush=True)
    rows = []
    t0 = time.perf_counter()
    for kind, s in (GPU_SHAPES if device == "cuda" else CPU_SHAPES):
        rows.append(run_row(kind, s, device, warm_up, timed))
        r = rows[-1]
        print(f"  {r['book']} vs {r['baseline']} at {s.name}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
    print()
    print_table(rows, device)
    if device == "cuda":
        print("\nMFU: nanoGPT's FLOP count (6 N_θ + 12 L T D per token) over the GPU's dense bf16 peak "
              f"({_f(peak_flops(device) and peak_flops(device) / 1e12, '.0f')} TFLOP/s); "
              "GiB: torch.cuda.max_memory_allocated in one step.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
