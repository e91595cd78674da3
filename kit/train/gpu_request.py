"""Whether this process was given a GPU (SLURM's allocation, CUDA_VISIBLE_DEVICES) that the
installed torch cannot use: a CPU-only wheel on a GPU node would train on the CPU for days, so
the doors' pre-flight stops with one line naming the build and how to install a CUDA one.
`ACCELERATE_USE_CPU=1` (kit.train.accel's switch) trains on the CPU on purpose. torch is
imported only where a GPU was asked for."""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from kit.config.run_config import ConfigError

# SLURM's counts, `[type:]count` (comma-separated per type): sbatch exports SLURM_GPUS_PER_TASK
# for --gpus-per-task (kit.slurm's #SBATCH line), SLURM_GPUS for --gpus, and so on
GPU_COUNT_VARS = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_TASK", "SLURM_GPUS", "SLURM_GPUS_PER_NODE")
# device lists, `0,1` or UUIDs: SLURM's gres plugin sets these for the GPUs a job got
GPU_LIST_VARS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")
# what SLURM and CUDA write where no device is given; CUDA stops at the first invalid entry
NO_DEVICE = ("", "-1", "NoDevFiles")
CUDA_INDEX_URL = "https://download.pytorch.org/whl/cu128"


def _positive_count(value: str) -> bool:
    """`2`, `a100:1` or `a100:1,v100:2` asks for at least one GPU; 0 or text does not."""
    counts = [item.rpartition(":")[2].strip() for item in value.split(",")]
    return any(c.isdigit() and int(c) > 0 for c in counts)


def _names_a_device(value: str) -> bool:
    first = value.split(",")[0].strip()
    return first not in NO_DEVICE and not first.startswith("-")


def gpu_requested(environ: Mapping[str, str]) -> str | None:
    """`NAME=value` of the first variable that gives this process a GPU, else None."""
    for name in GPU_COUNT_VARS + GPU_LIST_VARS:
        value = environ.get(name)
        if value is None:
            continue
        if _positive_count(value) if name in GPU_COUNT_VARS else _names_a_device(value):
            return f"{name}={value}"
    return None


def torch_build(version: str, cuda: str | None, hip: str | None) -> str:
    """`torch 2.13.0+cpu (a CPU-only build)`, `torch 2.13.0+cu128 (CUDA 12.8)`."""
    if hip:
        return f"torch {version} (ROCm {hip})"
    return f"torch {version} (CUDA {cuda})" if cuda else f"torch {version} (a CPU-only build)"


def no_gpu_line(asked: str, version: str, cuda: str | None, hip: str | None,
                python: str) -> str:
    """The one line for a GPU asked for that torch does not see."""
    build = torch_build(version, cuda, hip)
    cpu = "or set ACCELERATE_USE_CPU=1 to train on the CPU"
    if cuda or hip:
        return (f"{asked} gives this job a GPU, but {build} sees none: check the driver "
                f"(nvidia-smi) and that the GPU was allocated to this task, {cpu}")
    return (f"{asked} gives this job a GPU, but {build} cannot use it: install a CUDA build "
            f"({python} -m pip uninstall -y torch, then TORCH_INDEX_URL={CUDA_INDEX_URL} "
            f"./run_all.sh setup; cu128 or the CUDA version nvidia-smi shows), {cpu}")


def check_gpu_torch() -> None:
    """Raise ConfigError (one line) where this process was given a GPU and torch sees no CUDA
    device, unless ACCELERATE_USE_CPU asks for the CPU."""
    asked = gpu_requested(os.environ)
    if asked is None:
        return
    import torch                                  # only here: the doors start without it
    from accelerate.utils import parse_flag_from_env
    if torch.cuda.is_available() or parse_flag_from_env("ACCELERATE_USE_CPU"):
        return
    raise ConfigError(no_gpu_line(asked, torch.__version__, torch.version.cuda,
                                  torch.version.hip, sys.executable))
