"""Shared bits of the benchmark scripts: the arguments every benchmark takes, the hardware
header, one-subprocess-per-contender runs, and markdown tables.

Each contender runs in a fresh child process (the script re-invokes itself with `--child`),
so peak resident memory (ru_maxrss only ever grows) and library warm-up are per contender.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def base_parser(description: str) -> argparse.ArgumentParser:
    """The settings both benchmarks share; all contenders of one invocation get the same ones."""
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", default="RTE", help="GLUE task (RTE, SST-2 ...) from $GLUE_DIR, else data/glue")
    p.add_argument("--model", default="minilm",
                   help="minilm (embedded), a local Hugging Face folder, or bert-base-random / "
                        "bert-large-random: that architecture with random weights, built from its "
                        "config (no network; for throughput on a GPU, not for dev metrics)")
    p.add_argument("--max-train", type=int, default=0,
                   help="first N train rows of the kit's fixed shuffle; 0 = all")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", default="auto", choices=("auto", "no", "bf16", "fp16"),
                   help="the kit's mixed_precision for contenders without an @precision suffix")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads in every child; 0 = torch's default")
    p.add_argument("--json", metavar="OUT", help="also write the results here")
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run (minutes)")
    # internal: one contender, run in a child process, result written as JSON to --result
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return p


def parse(parser: argparse.ArgumentParser, quick: dict) -> argparse.Namespace:
    """Parse; with --quick the `quick` sizes replace the defaults (flags given explicitly win).
    A random-weights model name becomes the folder built for it, which the children then load."""
    args = parser.parse_args()
    if args.quick and not args.child:
        parser.set_defaults(**quick)
        args = parser.parse_args()
    if args.model in RANDOM_MODELS and not args.child:
        args.model = build_random_model(args.model)
    return args


# BERT-base / BERT-large sizes (BertConfig's defaults are BERT-base's)
RANDOM_MODELS = {"bert-base-random": {},
                 "bert-large-random": {"hidden_size": 1024, "num_hidden_layers": 24,
                                       "num_attention_heads": 16, "intermediate_size": 4096},
                 # bench/gpu.sh --cpu-smoke: the harness end to end in seconds
                 "bert-tiny-random": {"hidden_size": 32, "num_hidden_layers": 2,
                                      "num_attention_heads": 2, "intermediate_size": 64}}


def build_random_model(name: str) -> str:
    """outputs/bench/models/<name>: a BERT of that size with random weights and the embedded
    model's tokenizer (the bert-base-uncased vocabulary), saved once as a Hugging Face folder."""
    from transformers import BertConfig, BertModel
    from kit.models.backbones import load_tokenizer
    folder = REPO / "outputs" / "bench" / "models" / name
    if not (folder / "config.json").exists():
        tokenizer = load_tokenizer("minilm")
        BertModel(BertConfig(vocab_size=tokenizer.vocab_size, **RANDOM_MODELS[name])
                  ).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return str(folder)


SHARED = ("task", "model", "max_train", "epochs", "batch_size", "max_length", "lr", "seed",
          "precision", "threads")


def child_argv(args: argparse.Namespace, extra: tuple[str, ...] = ()) -> list[str]:
    """The parent's resolved settings as flags, so a child sees exactly what the parent chose
    (after --quick has filled in its sizes)."""
    out = []
    for name in (*SHARED, *extra):
        value = getattr(args, name)
        out += [f"--{name.replace('_', '-')}", ",".join(map(str, value))
                if isinstance(value, (list, tuple)) else str(value)]
    return out


def setup_child(args: argparse.Namespace) -> None:
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)


def run_child(script: str, argv: list[str], name: str) -> dict:
    """Run `script --child name` in a fresh interpreter and return the JSON it writes."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, script, *argv, "--child", name, "--result", str(result)]
        print(f"\n--- {name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO)
        if done.returncode != 0 or not result.exists():
            raise SystemExit(f"contender {name} failed (exit {done.returncode})")
        out = json.loads(result.read_text())
        out["process_wall_s"] = round(time.perf_counter() - t0, 2)   # incl. imports and loading
        return out


def write_result(path: str, result: dict) -> None:
    """A child's last act: its measurements plus its process-wide memory peaks."""
    result = {**result, **peak_memory()}
    Path(path).write_text(json.dumps(result, indent=1, default=float))


def peak_memory() -> dict:
    """Peak resident set size of this process (the whole child: loading, training, eval);
    on a GPU also the peak of memory allocated by torch."""
    import torch
    out = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if torch.cuda.is_available():
        out["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def hardware() -> dict:
    """Where a figure was measured: the CPU and its class (kit.train.provenance: avx2 / avx512 /
    avx512_bf16 / amx ...), the flags that decide bf16, bf16 native or emulated with its rate at
    a small size, cores, load, versions. Every benchmark prints it above its numbers."""
    import torch
    import transformers
    from kit.train.provenance import cpu_info
    cpu, probe = cpu_info(), bf16_probe()
    return {"cpu": cpu["model"], "cpu_class": cpu["cpu_class"], "cpu_flags": cpu["flags"],
            "bf16": f"{'native' if probe['native'] else 'emulated'} "
                    f"({probe['gflops_256']} GFLOP/s at 256 x 256)",
            "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
            "load_avg_1m": round(os.getloadavg()[0], 2),   # a busy machine skews every number
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def print_header(title: str) -> dict:
    """Print what was run, where; returns both for the JSON."""
    command = shlex.join([sys.executable, *sys.argv])
    hw = hardware()
    print(f"# {title}\n\ncommand: `{command}`\n")
    print("hardware: " + ", ".join(f"{k}={v}" for k, v in hw.items()) + "\n", flush=True)
    return {"command": command, "hardware": hw, "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def memory_mb(result: dict) -> float:
    """The memory that limits a run: GPU memory on a GPU, else resident memory."""
    return result.get("peak_gpu_mb", result["peak_rss_mb"])


def ratio(a, b) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def dump_json(path: str | None, payload: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=1, default=float) + "\n")
        print(f"\nwrote {path}")


def kit_config(args: argparse.Namespace, outputs_dir: str, **overrides):
    """The kit's RunConfig for these settings. A fresh outputs_dir per run: fit() returns an
    earlier finished run of the same config instead of training again."""
    from kit.config.run_config import RunConfig
    return RunConfig(task=args.task, model=args.model, seed=args.seed,
                     max_train_examples=args.max_train, max_length=args.max_length,
                     epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                     weight_decay=0.01, warmup_ratio=0.1, outputs_dir=outputs_dir,
                     save_checkpoints=False, **overrides)


def matmul_peak(size: int = 2048, seconds: float = 3.0, dtype: str | None = None) -> dict:
    """Measured matrix-multiply peak of this process (its torch threads) in `dtype` ("float32",
    "bfloat16", "float16"); by default the precision the kit trains in with `auto` on a GPU
    (bf16, else fp16), fp32 on a CPU. The ceiling that useful FLOP/s is set against, taken in
    the same run as the contenders."""
    import torch
    cuda = torch.cuda.is_available()
    if dtype is None:
        from kit.train.accel import cuda_has_native_bf16
        dtype = ("bfloat16" if cuda_has_native_bf16() else "float16") if cuda else "float32"
    device = "cuda" if cuda else "cpu"
    a, b = (torch.randn(size, size, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
    out = torch.empty_like(a)

    def timed(n):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            torch.mm(a, b, out=out)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    timed(2)                                                     # warm-up
    n = max(3, int(seconds / max(timed(3) / 3, 1e-6)))
    return {"flops_per_s": 2 * size ** 3 * n / timed(n), "dtype": dtype, "size": size}


def native_peak_dtypes() -> tuple[str, ...]:
    """The matmul dtypes worth a peak on this machine: fp32 always; bf16 where it is native (a
    GPU with bf16, a CPU with avx512_bf16 / AMX). Elsewhere bf16 is emulated (an AVX2 CPU: 1.2-1.8
    GFLOP/s against fp32's 27-54, docs/benchmarks.md): its 2048 x 2048 peak would take minutes and
    is no ceiling anything trains against; bf16_probe() records it small instead."""
    return ("float32", "bfloat16") if native_bf16() else ("float32",)


def native_bf16() -> bool:
    """Whether the device matmul_peak measures on (the CUDA GPU, else the CPU) has bf16 in
    hardware."""
    import torch
    from kit.train.accel import cpu_has_native_bf16, cuda_has_native_bf16
    return cuda_has_native_bf16() if torch.cuda.is_available() else cpu_has_native_bf16()


def bf16_probe() -> dict:
    """The bf16 matmul rate at a small size (256 x 256, ~0.2 s even where bf16 is emulated) and
    whether it is native: what the hardware header says about bf16 on every machine."""
    rate = matmul_peak(size=256, seconds=0.1, dtype="bfloat16")["flops_per_s"]
    return {"native": native_bf16(), "gflops_256": round(rate / 1e9, 2)}


def peaks(seconds: float = 2.0, size: int = 2048) -> dict[str, float]:
    """The matmul peaks (FLOP/s) of this process, measured now, in each native dtype
    (native_peak_dtypes): the ceilings a contender is set against. Taken right before and right
    after every contender, because a shared machine's speed drifts between minutes (one
    measurement before all contenders once gave 127-147% "of peak")."""
    return {d: matmul_peak(size=size, seconds=seconds, dtype=d)["flops_per_s"]
            for d in native_peak_dtypes()}


def around(before: dict[str, float], after: dict[str, float]) -> dict:
    """A contender's ceilings: the mean of the peaks measured right before and after it, and
    their drift (after / before) as a check on how steady the machine was meanwhile."""
    return {d: {"before": before[d], "after": after[d], "mean": (before[d] + after[d]) / 2,
                "drift": round(after[d] / before[d], 3)} for d in before}


def training_flops(model_dir: str, lengths, epochs: int) -> float:
    """Model FLOPs of training on sequences of these real lengths, padding not counted:
    per layer 2 FLOPs per weight per token (Q, K, V, output, two feed-forward matrices) plus
    attention's scores and weighted sum (2 x 2 L^2 d), plus the pooler once per sequence;
    training = forward + backward = 3x forward. Embedding lookups and element-wise ops are
    not counted (the usual model-FLOPs convention)."""
    import numpy as np
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(model_dir)
    d, ff, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    lengths = np.asarray(lengths, dtype=float)
    forward = layers * (2 * (4 * d * d + 2 * d * ff) * lengths.sum()
                        + 4 * d * (lengths ** 2).sum()) + 2 * d * d * len(lengths)
    return 3 * forward * epochs


def check_environment() -> None:
    """Offline; GLUE from $GLUE_DIR when set, else the project's own copy (kit.data.pipeline.glue_source)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")   # no fork warnings, no extra threads


def budgeted(args, smoke: dict, full: dict) -> tuple[dict, float, float]:
    """A GPU script's start: (its settings, a copy of `smoke` under --cpu-smoke else `full`;
    the monotonic start; the deadline --budget-s sets, else the settings' budget_s), the
    environment checked."""
    started = time.monotonic()
    s = dict(smoke if args.cpu_smoke else full)
    check_environment()
    return s, started, started + (args.budget_s or s["budget_s"])
