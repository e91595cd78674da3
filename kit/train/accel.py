"""The accelerate set-up of a run: the device (CUDA, Apple's MPS, CPU), the precision
`mixed_precision: auto` resolves to there, and the Accelerator (autocast, loss scaling, DDP,
gradient accumulation, trackers) the loop uses, and the CPU threads a process may use
(`cpu_threads`). docs/gpu.md: what each device gets, what ran."""
from __future__ import annotations

import os
import re
import resource
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from kit.config.run_config import ConfigError
from kit.train import accelerate_adapter

# CPU features with bf16 matrix instructions (torch.cpu.get_capabilities() names): there a bf16
# matmul runs ~2.3x the fp32 one (docs/benchmarks.md); elsewhere bf16 is emulated, slower than fp32.
# ARM's bf16 is left at fp32: not measured.
NATIVE_BF16_FEATURES = ("avx512_bf16", "amx_bf16")
# SSA_KIT_CPU_BF16=native (or =emulated): `auto` resolves as on a CPU with (without) bf16 matrix
# instructions, whatever this one has, so either class's paths run on any machine - the tests'
# second lane (.ci/run) and a developer checking what the other class would do. bf16 on a CPU
# without the instructions is correct, only slower (emulated). Unset: this CPU decides.
CPU_BF16_SWITCH = "SSA_KIT_CPU_BF16"
CPU_BF16_CHOICES = {"native": True, "emulated": False}


def cpu_bf16_in_hardware() -> bool:
    """This CPU has bf16 matrix instructions (what provenance records, whatever the switch)."""
    return any(torch.cpu.get_capabilities().get(f, False) for f in NATIVE_BF16_FEATURES)


def cpu_bf16_pretended() -> bool | None:
    """The class SSA_KIT_CPU_BF16 asks `auto` to resolve as (True: native), or None: unset."""
    value = os.environ.get(CPU_BF16_SWITCH, "").strip().lower()
    if not value:
        return None
    if value not in CPU_BF16_CHOICES:
        raise ConfigError(f"{CPU_BF16_SWITCH}={value!r}: use one of {', '.join(CPU_BF16_CHOICES)} "
                         "(or leave it unset: this CPU decides)")
    return CPU_BF16_CHOICES[value]


def cpu_has_native_bf16() -> bool:
    """Whether `auto` treats this CPU as one with native bf16: the switch, else the hardware."""
    pretended = cpu_bf16_pretended()
    return cpu_bf16_in_hardware() if pretended is None else pretended


def cuda_has_native_bf16() -> bool:
    """bf16 tensor cores: compute capability 8.0 (Ampere) and later, or an AMD GPU (ROCm). Not
    torch.cuda.is_bf16_supported(): by default it also says yes where bf16 is only emulated (it
    creates a bf16 tensor on a V100, T4 or P100), and `auto` would pick slow bf16 over fp16."""
    return bool(torch.version.hip) or torch.cuda.get_device_capability()[0] >= 8


def choose_device(cuda: bool, mps: bool) -> str:
    """The device a run trains on: a CUDA GPU, else Apple's GPU (MPS), else the CPU; the order
    accelerate follows when it is not told cpu=True."""
    return "cuda" if cuda else "mps" if mps else "cpu"


def machine_device() -> str:
    """choose_device on this machine. ACCELERATE_USE_CPU=1 (accelerate's own switch) keeps a
    run on the CPU, e.g. on a Mac whose MPS lacks an operator the model needs."""
    from accelerate.utils import parse_flag_from_env
    if parse_flag_from_env("ACCELERATE_USE_CPU"):
        return "cpu"
    return choose_device(torch.cuda.is_available(), torch.backends.mps.is_available())


def process_state():
    """accelerate's process state (one process, or a rank of torchrun / accelerate launch) on
    the device the run's Accelerator will use: without a GPU, ranks are CPU processes (gloo),
    and accelerate needs to be told (cpu=True); it keeps the first device a process asks for."""
    from accelerate import PartialState
    return PartialState(cpu=machine_device() == "cpu")


def resolve_precision(requested: str, cuda: bool, cuda_bf16: bool, cpu_bf16: bool,
                      mps: bool = False) -> str:
    """What `mixed_precision: auto` means on this machine: bf16 autocast where the hardware has
    bf16 (CUDA: else fp16 with a loss scaler), fp32 ("no") on MPS and on a CPU without native
    bf16. Explicit values stand."""
    if requested != "auto":
        return requested
    if cuda:
        return "bf16" if cuda_bf16 else "fp16"
    if mps:     # MPS bf16 / fp16 autocast run (accelerate allows both) but were never measured here
        return "no"
    return "bf16" if cpu_bf16 else "no"


def machine_precision(requested: str) -> str:
    """resolve_precision with this machine's device and bf16 support."""
    device = machine_device()
    cuda = device == "cuda"
    return resolve_precision(requested, cuda, cuda and cuda_has_native_bf16(),
                             device == "cpu" and cpu_has_native_bf16(), device == "mps")


def resolve_dropout_rng(requested: str, device: str, precision: str,
                        compiled: bool = False) -> str:
    """What `dropout_rng: auto` means: `packed` (kit.models.packed_dropout) where a CPU runs the
    step in bf16, there torch's per-element Bernoulli draw is ~22% of a step; `torch` elsewhere:
    CUDA's dropout is one fused kernel, a compiled encoder (`compiled`) draws torch's dropout
    inside inductor's kernels, and in fp32 on a CPU the draw is 5-9% of a step (packed saves
    4-7.5% there, docs/benchmarks.md), which does not buy every earlier fp32 run - the results
    and pinned values made with torch's stream - a new random stream. Explicit values stand."""
    if requested != "auto":
        return requested
    return "packed" if device == "cpu" and precision == "bf16" and not compiled else "torch"


def make_accelerator(mixed_precision: str = "auto", grad_accum: int = 1,
                     log_with: list | None = None, find_unused_parameters: bool = False):
    """accelerate with autocast at the resolved precision: prepare() wraps the model's forward, so
    training, probing and evaluation all run in it; weights and optimizer state stay fp32, and
    the forward's outputs come back as fp32 (losses and predictions are fp32). fp16 adds a loss
    scaler: backward scales the loss, clip_grad_norm_ unscales, and a step whose gradients hold
    inf / NaN is skipped (the scale halves); save_state keeps the scaler (scaler.pt)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs
    device = machine_device()
    precision = machine_precision(mixed_precision)
    set_tf32(device, mixed_precision)
    limit_threads()
    accelerate_adapter.reset_precision(precision)
    # multi-task: a batch trains one task's head (and gated stages freeze parameters), so DDP
    # must not wait for gradients that never come
    ddp = DistributedDataParallelKwargs(find_unused_parameters=find_unused_parameters)
    accelerator = Accelerator(mixed_precision=precision, gradient_accumulation_steps=grad_accum,
                              log_with=log_with or None, kwargs_handlers=[ddp],
                              cpu=device == "cpu")
    if precision == "fp16" and accelerator.device.type == "cpu":
        accelerate_adapter.fp16_on_cpu(accelerator)
    return accelerator


def cpu_threads(processes: int = 1) -> int:
    """CPU threads for each of `processes` processes on this node: the CPUs the job was given -
    SLURM_CPUS_PER_TASK under SLURM (whose cgroup may leave every core of the node visible),
    else the CPUs this process may run on (sched_getaffinity: taskset, cpusets, containers) -
    shared out, at least one. Not os.cpu_count(): that counts the node's cores, not the job's.
    Every place that sets threads asks this (kit.batch for torchrun's OMP_NUM_THREADS)."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        cpus = int(slurm)
    elif hasattr(os, "sched_getaffinity"):
        cpus = len(os.sched_getaffinity(0))
    else:                                  # macOS, Windows: no affinity to ask
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, processes))


def limit_threads() -> None:
    """No more torch threads than this process's share of the job's CPUs (`cpu_threads` over
    the node's processes, torchrun's LOCAL_WORLD_SIZE): torch's default may count every core of
    the node, and 64 threads on 8 allocated cores run slower than 8. OMP_NUM_THREADS, when
    set, stands, and so does a smaller count set before (a test's one thread)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    share = cpu_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    if torch.get_num_threads() > share:
        torch.set_num_threads(share)


def set_tf32(device: str, requested: str) -> None:
    """CUDA: TF32 tensor cores (Ampere and later) for the fp32 matmuls and convolutions under
    `auto` (inputs rounded to a 10-bit mantissa, fp32 accumulation), strict fp32 otherwise. Set
    per run, either way: the flags are process-wide, and a warm kernel's earlier `auto` run must
    not leave them on for a `no` run."""
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = (
            requested == "auto")


# Linux: writing 5 to clear_refs resets the process's peak resident size (VmHWM) to its current
# size, so a run in a kernel that ran other points before reports its own peak
_CLEAR_REFS, _STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")


def reset_peak_memory() -> None:
    """Start counting peak memory from here (CUDA: allocator peak; MPS: the driver's pools,
    emptied; Linux: resident peak)."""
    device = machine_device()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return
    if device == "mps":      # MPS keeps no peak counter: empty the cached pools instead
        torch.mps.empty_cache()
        return
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:                  # not Linux, or not allowed: the process-wide peak stays
        pass


def peak_memory_mb() -> float:
    """Peak memory since reset_peak_memory(): CUDA allocated bytes; on MPS what the Metal driver
    holds for the process now (its pools keep freed blocks, so about the peak since the reset);
    or the process's resident peak (on Linux since the reset; elsewhere since the process
    started)."""
    device = machine_device()
    if device == "cuda":
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    if device == "mps":
        return round(torch.mps.driver_allocated_memory() / 2**20, 1)
    try:
        kib = next(int(line.split()[1]) for line in _STATUS.read_text().splitlines()
                   if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kib = peak / 1024 if sys.platform == "darwin" else peak     # bytes on macOS
    return round(kib / 1024, 1)


# torch's error for an operator MPS lacks (PYTORCH_ENABLE_MPS_FALLBACK unset): long, with a link,
# over several lines in some versions, and the run's record keeps the first line: say it in one
_MPS_MISSING = re.compile(r"operator '([^']+)' is not currently implemented for the MPS device")


def mps_missing_op(message: str) -> str | None:
    """The one-line problem for torch's missing-MPS-operator error, or None for other errors."""
    found = _MPS_MISSING.search(message)
    if found is None:
        return None
    return (f"operator {found.group(1)} is not implemented on MPS: set "
            "PYTORCH_ENABLE_MPS_FALLBACK=1 in the environment before Python starts (torch reads "
            "it at import) to run it on the CPU, or ACCELERATE_USE_CPU=1 to train on the CPU")


@contextmanager
def explain_mps_errors():
    """Re-raise torch's missing-MPS-operator NotImplementedError as one line (also a decorator)."""
    try:
        yield
    except NotImplementedError as err:
        line = mps_missing_op(str(err))
        if line is None:
            raise
        raise NotImplementedError(line) from err
