"""Where a result was made: the kit's commit, the library versions, the CPU (its class decides
bf16 and speed), the GPU, threads and processes. Every run's metrics.json carries it
(`environment`, written by kit.runs), `kit.doctor` prints it, the benchmarks head their numbers
with it, and a table that mixes environments says so in one line
(kit.results.frame.collect.table_notes).
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch

from kit.config.paths import kit_commit     # the checkout whose commit a run records
from kit.train.accel import cpu_bf16_in_hardware, cuda_has_native_bf16, machine_device

# the capabilities that decide what the kit does on a CPU (torch.cpu.get_capabilities() names,
# weakest first; kit.doctor lists those an x86 CPU has and lacks in this order). torch reads them
# with the cpuinfo library (CPUID, /proc/cpuinfo), so /proc/cpuinfo's own flags are not parsed
# again here: they would say the same under other names (avx512f for avx512_f).
CPU_FLAGS = ("avx2", "avx512_f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_fp16", "avx512_fp16")
# ARM's (Apple silicon, Graviton ...): recorded so two ARM machines can be told apart; the kit
# decides nothing from them yet (kit.train.accel leaves ARM's bf16 at fp32: not measured)
ARM_FLAGS = ("neon", "bf16", "i8mm", "sve", "sve2", "sme")
LIBRARIES = ("torch", "transformers", "accelerate", "datasets")


def cpu_class(flags: tuple[str, ...] | list[str], arch: str) -> str:
    """One short name for what the CPU can do with matrices: amx > avx512_bf16 > avx512 > avx2
    (x86), else its architecture (arm64 ...)."""
    for name, flag in (("amx", "amx_bf16"), ("avx512_bf16", "avx512_bf16"),
                       ("avx512", "avx512_f"), ("avx2", "avx2")):
        if flag in flags:
            return name
    return arch


@functools.cache
def cpu_model() -> str:
    """The CPU's marketing name (Linux /proc/cpuinfo, macOS sysctl), else torch's cpuinfo name,
    else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            name = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], text=True,
                                  capture_output=True, timeout=5).stdout.strip()
            if name:
                return name
        except (OSError, subprocess.SubprocessError):
            pass
    # ARM Linux has no "model name" line; torch's cpuinfo knows the core (Neoverse-V1 ...)
    return (torch.cpu.get_capabilities().get("cpu_name") or platform.processor()
            or platform.machine() or "?")


@functools.cache
def cpu_info() -> dict:
    """{model, arch, flags (those of CPU_FLAGS / ARM_FLAGS it has, in their order), native_bf16,
    cpu_class}. Cached: the CPU does not change under a running process."""
    caps = torch.cpu.get_capabilities()
    flags = [f for f in CPU_FLAGS + ARM_FLAGS if caps.get(f) is True]   # not sve_max_length's int
    arch = platform.machine()
    return {"model": cpu_model(), "arch": arch, "flags": flags,
            "native_bf16": cpu_bf16_in_hardware(), "cpu_class": cpu_class(flags, arch)}


def gpu_info() -> dict | None:
    """The accelerator a run would use: CUDA (name, count, compute capability, native bf16),
    Apple MPS, or None on a CPU-only machine."""
    device = machine_device()
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        return {"kind": "cuda", "name": torch.cuda.get_device_name(0),
                "count": torch.cuda.device_count(), "capability": f"{major}.{minor}",
                "bf16": cuda_has_native_bf16()}
    if device == "mps":
        return {"kind": "mps", "name": "Apple MPS", "count": 1}
    return None


@functools.cache
def versions() -> dict:
    """python and the libraries' versions (package metadata: nothing is imported)."""
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


PER_DEVICE_ENV = "SSA_KIT_PER_DEVICE"   # set by kit.cluster.pool for the kernels of K > 1


def points_per_device() -> int:
    """K, the points that shared this run's device (kit.cluster.pool's slots say so in their
    kernels' environment; 1 otherwise): its wall clock and examples per second were measured
    beside K - 1 others, so tables and figures keep them apart."""
    value = os.environ.get(PER_DEVICE_ENV, "1")
    return int(value) if value.isdigit() and int(value) >= 1 else 1


def environment(processes: int) -> dict:
    """The provenance block of a run's metrics.json."""
    commit, dirty = kit_commit()
    return {"kit_commit": commit, "kit_dirty": dirty, **versions(), "cpu": cpu_info(),
            "threads": torch.get_num_threads(), "gpu": gpu_info(), "processes": processes,
            "per_device": points_per_device()}
