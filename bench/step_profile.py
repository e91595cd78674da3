"""Where one training step of the kit's model goes on this CPU, by operator class (torch.profiler).

The step is the kit's single-task `bert` step: kit.methods.bert.SequenceModel (encoder + pooler +
classifier) on a batch of `--batch` rows of `--length` real tokens, forward under bf16 autocast
(or fp32), fp32 cross-entropy, backward, gradient clipping at 1.0, fused AdamW (kit.train.loop). It
answers "how close can useful FLOP/s get to the matmul peak of the step's own precision?": the
matrix products are only a share of the step, and that share bounds the fraction of the peak the
whole step can reach. bf16 is profiled only where it is native (bench/common.native_peak_dtypes):
an emulated bf16 step (AVX2) says nothing about the kit.

    python bench/step_profile.py --length 68 --threads 1      # RTE's mean length
    python bench/step_profile.py --length 14 --threads 1      # SST-2's
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from kit.models.backbones import load_backbone, model_path
from kit.methods.bert import HeadSpec, SequenceModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# operator classes by aten name; the rest is "other" (layer norm, GELU, softmax, adds ...)
CLASSES = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "dropout RNG": ("aten::bernoulli_",),
    "dtype casts and copies": ("aten::copy_",),
    "zero fills (dense embedding grad, masks)": ("aten::fill_", "aten::zero_"),
    "AdamW": ("aten::_fused_adamw_",),
    "grad clipping": ("aten::linalg_vector_norm", "aten::_foreach_norm", "aten::mul_",
                      "aten::_foreach_mul_", "aten::clamp"),
}


def step_fn(length: int, batch: int, precision: str):
    backbone, _ = load_backbone("minilm")
    model = SequenceModel(backbone, HeadSpec(num_labels=2)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(1000, 20000, (batch, length))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "special_mask": torch.zeros_like(ids, dtype=torch.bool)}
    labels = torch.randint(0, 2, (batch,))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(**inputs)["logits"]
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def peak(precision: str) -> float:
    return common.matmul_peak(seconds=2.0, dtype=DTYPES[precision])["flops_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=68)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from transformers.utils import logging
    logging.disable_progress_bar()
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch} x "
          f"{args.length} tokens, minilm\n")
    hardware = common.hardware()
    print(f"CPU {hardware['cpu']} ({hardware['cpu_class']}), bf16 {hardware['bf16']}\n")
    print("| precision | s / step | useful GFLOP/s | its matmul peak GFLOP/s | of the peak | "
          "of the peak if only matmuls took time | " + " | ".join(CLASSES) + " | other |")
    print("|---" * (7 + len(CLASSES)) + "|")
    native = common.native_peak_dtypes()
    for precision in [p for p, dtype in DTYPES.items() if dtype in native]:
        step = step_fn(args.length, args.batch, precision)
        for _ in range(3):
            step()
        before = peak(precision)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        seconds = (time.perf_counter() - t0) / args.steps
        ceiling = (before + peak(precision)) / 2
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        shares = {name: sum(e.self_cpu_time_total for e in events if e.key in ops) / total
                  for name, ops in CLASSES.items()}
        # useful FLOPs of one step: matmuls only, padding-free (bench/common.training_flops)
        flops = common.training_flops(model_path("minilm"), [args.length] * args.batch, 1)
        useful = flops / seconds
        other = 1 - sum(shares.values())
        cells = [f"{100 * v:.1f}%" for v in [*shares.values(), other]]
        bound = useful / shares["matmul"] / ceiling   # the matmuls as fast as now, the rest free
        print(f"| {precision} | {seconds:.3f} | {useful / 1e9:.0f} | {ceiling / 1e9:.0f} | "
              f"{100 * useful / ceiling:.1f}% | {100 * bound:.0f}% | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
