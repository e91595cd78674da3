"""The accelerate set-up of a run: the precision `mixed_precision: auto` resolves to on this
machine, and the Accelerator (autocast, DDP, gradient accumulation, trackers) the loop uses."""
from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

# CPU features with bf16 matrix instructions (torch.cpu.get_capabilities() names): there a bf16
# matmul runs ~2.3x the fp32 one (docs/benchmarks.md); elsewhere bf16 is emulated, slower than fp32.
# ARM's bf16 is left at fp32: not measured.
NATIVE_BF16_FEATURES = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16() -> bool:
    return any(torch.cpu.get_capabilities().get(f, False) for f in NATIVE_BF16_FEATURES)


def resolve_precision(requested: str, cuda: bool, cuda_bf16: bool, cpu_bf16: bool) -> str:
    """What `mixed_precision: auto` means on this machine: bf16 autocast where the hardware has
    bf16 (GPU: else fp16), fp32 ("no") on a CPU without native bf16. Explicit values stand."""
    if requested != "auto":
        return requested
    if cuda:
        return "bf16" if cuda_bf16 else "fp16"
    return "bf16" if cpu_bf16 else "no"


def make_accelerator(mixed_precision: str = "auto", grad_accum: int = 1,
                     log_with: list | None = None, find_unused_parameters: bool = False):
    """accelerate with autocast at the resolved precision: prepare() wraps the model's forward, so
    training, probing and evaluation all run in it; weights and optimizer state stay fp32, and
    the forward's outputs come back as fp32 (losses and predictions are fp32)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs
    cuda = torch.cuda.is_available()
    precision = resolve_precision(mixed_precision, cuda, cuda and torch.cuda.is_bf16_supported(),
                                  not cuda and cpu_has_native_bf16())
    if cuda and mixed_precision == "auto":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    _allow_precision_change(precision)
    # multi-task: a batch trains one task's head (and gated stages freeze parameters), so DDP
    # must not wait for gradients that never come
    ddp = DistributedDataParallelKwargs(find_unused_parameters=find_unused_parameters)
    return Accelerator(mixed_precision=precision, gradient_accumulation_steps=grad_accum,
                       log_with=log_with or None, kwargs_handlers=[ddp], cpu=not cuda)


def _allow_precision_change(precision: str) -> None:
    """accelerate keeps one precision per process (its AcceleratorState refuses another until
    reset), so a notebook or test that runs fit in bf16 and then in fp32 would fail. In a single
    process, forget the old precision; the process state (PartialState) is kept. Models prepared
    earlier keep the autocast they were wrapped with."""
    from accelerate.state import AcceleratorState, PartialState
    state = AcceleratorState._shared_state
    single = PartialState._shared_state.get("num_processes", 1) == 1
    if state and single and state.get("_mixed_precision") != precision:
        AcceleratorState._reset_state()


# Linux: writing 5 to clear_refs resets the process's peak resident size (VmHWM) to its current
# size, so a run in a kernel that ran other points before reports its own peak
_CLEAR_REFS, _STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")


def reset_peak_memory() -> None:
    """Start counting peak memory from here (CUDA: allocator peak; Linux: resident peak)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:                  # not Linux, or not allowed: the process-wide peak stays
        pass


def peak_memory_mb() -> float:
    """Peak memory since reset_peak_memory(): CUDA allocated bytes, or the process's resident
    peak (on Linux since the reset; elsewhere since the process started)."""
    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    try:
        kib = next(int(line.split()[1]) for line in _STATUS.read_text().splitlines()
                   if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kib = peak / 1024 if sys.platform == "darwin" else peak     # bytes on macOS
    return round(kib / 1024, 1)
