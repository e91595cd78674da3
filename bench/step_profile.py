"""Where one training step of the kit goes on this CPU, by operator class (torch.profiler), and what
the packed dropout (kit.models.packed_dropout) changes.

The step is the loop's own (kit.train.step.train_step: the accelerator's autocast, backward,
clipping at 1.0, fused AdamW) on the kit's model and loss (kit.train.finetune.loss_terms) for
`bert` and `ssa-h` (SSA's token head, its loss on labelled tokens, the hybrid sentence vector),
minilm, a batch of `--batch` rows of `--length` real tokens. For each method and length, the two
dropouts (torch's Bernoulli draw per element, the packed mask) are timed in alternated steps, so
a busy machine slows both alike; then each step is profiled once. It answers "how close can
useful FLOP/s get to the matmul peak of the step's own precision?": the matrix products are only
a share of the step, and that share bounds the fraction of the peak the whole step can reach.
bf16 is profiled only where it is native (bench/common.native_peak_dtypes): an emulated bf16
step (AVX2) says nothing about the kit.

    python bench/step_profile.py --threads 2                  # SST-2's and RTE's mean lengths
    python bench/step_profile.py --length 68 --methods bert --threads 1
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kit.methods.bert import HeadSpec, SequenceModel
from kit.models.backbones import load_backbone, model_path
from kit.models.packed_dropout import use_packed_dropout
from kit.models.regional_compile import compile_layers
from kit.train.accel import make_accelerator
from kit.train.finetune import loss_terms
from kit.train.step import train_step

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# operator classes by aten name; the rest is "other" (layer norm, GELU, softmax, adds ...)
CLASSES = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "dropout RNG": ("aten::bernoulli_", "aten::random_"),
    "dtype casts and copies": ("aten::copy_",),
    "zero fills (dense embedding grad, masks)": ("aten::fill_", "aten::zero_"),
    "AdamW": ("aten::_fused_adamw_",),
    "grad clipping": ("aten::linalg_vector_norm", "aten::_foreach_norm", "aten::mul_",
                      "aten::_foreach_mul_", "aten::clamp"),
}
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
ACCELERATE = {"bf16": "bf16", "fp32": "no"}


def step_fn(method: str, length: int, batch: int, precision: str, dropout: str):
    """One training step of the kit (a closure), its model built afresh. `dropout`: torch, packed,
    or compiled (torch's, with the encoder layers compiled: kit.models.regional_compile)."""
    accelerator = make_accelerator(ACCELERATE[precision])
    model = SequenceModel(load_backbone("minilm")[0], HeadSpec(num_labels=2, method=method)).train()
    if dropout == "packed":
        use_packed_dropout(model)
    elif dropout == "compiled":     # torch's dropout, which inductor draws inside its kernels
        compile_layers(model, dynamic=False)     # one fixed shape here
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    ids = torch.randint(1000, 20000, (batch, length))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "special_mask": torch.zeros_like(ids, dtype=torch.bool),
              "labels": torch.randint(0, 2, (batch,)),
              "ssa_labels": torch.randint(0, 2, (batch, length))}
    alpha = 1.0 if method == "bert" else 0.7
    return lambda: train_step(accelerator, model, optimizer,
                              lambda: loss_terms(model, inputs, False, alpha), 1.0)


def shares(step, steps: int) -> dict[str, float]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    return {name: sum(e.self_cpu_time_total for e in events if e.key in ops) / total
            for name, ops in CLASSES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, nargs="+", default=[14, 68],
                        help="real tokens per row (default: SST-2's and RTE's mean lengths)")
    parser.add_argument("--methods", nargs="+", default=["bert", "ssa-h"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per contender")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dropouts", nargs="+", default=["torch", "packed"],
                        choices=["torch", "packed", "compiled"],
                        help="contenders; the first is the reference of the ratio column")
    parser.add_argument("--precisions", nargs="+", choices=list(DTYPES),
                        help="default: fp32, and bf16 where it is native")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from transformers.utils import logging
    logging.disable_progress_bar()
    hardware = common.hardware()
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, minilm; "
          f"CPU {hardware['cpu']} ({hardware['cpu_class']}), bf16 {hardware['bf16']}\n")
    print("| method | tokens | precision | dropout | s / step (median) | / first's time | "
          "useful GFLOP/s | its matmul peak GFLOP/s | of the peak | of the peak if only "
          "matmuls took time | " + " | ".join(CLASSES) + " | other |")
    print("|---" * (10 + len(CLASSES)) + "|")
    precisions = args.precisions or [p for p, dtype in DTYPES.items()
                                     if dtype in common.native_peak_dtypes()]
    warmups, first = [], args.dropouts[0]       # first: the ratio column's reference
    for precision in precisions:
        ceiling = common.matmul_peak(seconds=2.0, dtype=DTYPES[precision])["flops_per_s"]
        for method in args.methods:
            for length in args.length:
                steps = {d: step_fn(method, length, args.batch, precision, d)
                         for d in args.dropouts}
                for d, step in steps.items():   # warm-up: allocator, dispatch, compilation
                    t0 = time.perf_counter()
                    step()
                    step()
                    warmups.append(f"{method} {args.batch} x {length} {precision} {d}: "
                                   f"{time.perf_counter() - t0:.1f} s")
                times = {d: [] for d in steps}
                for _ in range(args.steps):     # alternated: noise falls on both alike
                    for d, step in steps.items():
                        t0 = time.perf_counter()
                        step()
                        times[d].append(time.perf_counter() - t0)
                median = {d: statistics.median(t) for d, t in times.items()}
                # useful FLOPs of one step: matmuls only, padding-free (bench/common)
                flops = common.training_flops(model_path("minilm"), [length] * args.batch, 1)
                for d, step in steps.items():
                    part = shares(step, 2)
                    useful = flops / median[d]
                    other = 1 - sum(part.values())
                    cells = [f"{100 * v:.1f}%" for v in [*part.values(), other]]
                    bound = useful / part["matmul"] / ceiling   # matmuls as now, the rest free
                    ratio = f"{median[d] / median[first]:.3f}" if d != first else ""
                    print(f"| {method} | {args.batch} x {length} | {precision} | {d} | "
                          f"{median[d]:.3f} | {ratio} | {useful / 1e9:.0f} | {ceiling / 1e9:.0f} | "
                          f"{100 * useful / ceiling:.1f}% | {100 * bound:.0f}% | "
                          + " | ".join(cells) + " |", flush=True)
    print("\nTwo warm-up steps (compilation included):\n" + "\n".join(warmups))


if __name__ == "__main__":
    main()
