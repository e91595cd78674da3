"""What hardware wrote a checkpoint and whether this run's may resume it bit for bit (kit.train.
run_state's `last`): the record (`hardware`), the one-line refusal or the run's note (`compare`),
the refusal of another cuda_graphs / length_buckets resolution (`check_resolution`), and the
check that accelerate really restored every RNG (`check_rngs`).
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from kit.config.rules import precision_name
from kit.train import accelerate_adapter


class CheckpointError(RuntimeError):
    pass


def hardware(accelerator) -> dict:
    """What a bit-exact resume needs to be the same: the precision autocast runs in, the device
    type and the number of processes (each has its own RNG file and slice of every batch); on a
    GPU also its model (another model computes other kernels' sums) and how many this process
    sees (accelerate saves, and restores by index, the RNG state of every visible GPU). A CPU adds
    nothing: its record stays that of older checkpoints."""
    hw = {"precision": accelerator.mixed_precision, "device": accelerator.device.type,
          "processes": accelerator.num_processes}
    if accelerator.device.type == "cuda":
        hw.update(gpu=torch.cuda.get_device_name(accelerator.device),
                  gpus=torch.cuda.device_count())
    return hw


def describe(hw: dict) -> str:
    """`bf16 on cuda x4 (NVIDIA A100-SXM4-80GB, 8 visible)`: `hardware` in a line; what the
    record does not know (an older checkpoint's GPU) is left out."""
    precision = precision_name(hw["precision"])
    gpu = [hw["gpu"]] if "gpu" in hw else []
    gpu += [f"{hw['gpus']} visible"] if "gpus" in hw else []
    return f"{precision} on {hw['device']} x{hw['processes']}" + (f" ({', '.join(gpu)})" if gpu
                                                                   else "")


def _differs(written: dict, here: dict) -> list[str]:
    """The fields of `hardware` both records know and disagree on: a field an older checkpoint
    did not record (a GPU's model and count) is unknown there, not different."""
    return [k for k in here if k in written and written[k] != here[k]]


def older_checkpoint(folder: Path, here: dict) -> dict:
    """`hardware` of a checkpoint from before the record, as far as its files tell: one RNG file
    per process, scaler.pt under fp16; its GPU is unknown (left out)."""
    scaled = (folder / accelerate_adapter.SCALER_FILE).exists()
    return {"device": here["device"], "processes": len(accelerate_adapter.rng_files(folder)),
            "precision": "fp16" if scaled else here["precision"] if here["precision"] != "fp16"
            else "bf16 or fp32"}


def gpus_of_rng_file(folder: Path, accelerator) -> dict:
    """{"gpus": n} for a record from before the GPU count, as its RNG file tells (one CUDA state
    per visible GPU), so that another count is a hardware difference, not an RNG failure; {}
    when the file does not tell."""
    try:
        states = accelerate_adapter.rng_states(folder, accelerator.process_index)
        return {"gpus": len(states["cuda"])}
    except Exception:       # noqa: BLE001 - unreadable: check_rngs says so after load_state
        return {}


# what a scheduler's requeue may change on a mixed partition (A100-40GB and -80GB nodes): the
# GPU's model and how many a task sees. Precision, device type and processes are the run's own
NODE_ONLY = {"gpu", "gpus"}


def requeued() -> bool:
    """Inside a SLURM job, where a preempted task is requeued onto whatever node is free."""
    return bool(os.environ.get("SLURM_JOB_ID"))


def compare(folder: Path, written: dict, here: dict, allowed: bool,
            scheduled: bool = False) -> str | None:
    """None on the same hardware; else the line saying what differs, raised as CheckpointError
    unless the run allows another hardware, or (`scheduled`: inside a SLURM job) only the GPU
    node changed: then returned, the run's note. A preemption stays a preemption."""
    differs = _differs(written, here)
    if not differs:
        return None
    line = f"{folder} was written with {describe(written)}; this run has {describe(here)}"
    if allowed:
        return f"{line}: resumed there (resume_on_other_hardware), not bit for bit"
    if scheduled and set(differs) <= NODE_ONLY:
        return f"{line}: resumed there (a SLURM job requeued onto another GPU node), not bit for bit"
    auto = " (mixed_precision auto resolves per machine)" if "precision" in differs else ""
    processes = f" (--processes {written['processes']})" if "processes" in differs else ""
    raise CheckpointError(f"{line}{auto}: resume it on hardware like that{processes}, set "
                          "resume_on_other_hardware: true to resume anyway (not bit-exact), or "
                          "delete that folder to restart the run from scratch")


# what a run's `auto` settings resolved to (kit.models.regional_compile.resolve_graphs), recorded
# beside the hardware: another resolution is another computation (graphs train on length buckets
# with padded rows and draw dropout from inductor's generator), so no switch resumes across it
RESOLVED_FIELDS = ("cuda_graphs", "length_buckets")


def check_resolution(folder: Path, written: dict, here: dict) -> None:
    """Refuse, in one line naming both, a checkpoint whose record resolved RESOLVED_FIELDS
    otherwise than this run (`here`: Resolved.record); a record without them (unknown) passes."""
    if all(written.get(k, here[k]) == here[k] for k in RESOLVED_FIELDS):
        return
    then = ", ".join(f"{k} {written.get(k, '?')}" for k in RESOLVED_FIELDS)
    now = ", ".join(f"{k} {here[k]}" for k in RESOLVED_FIELDS)
    raise CheckpointError(f"{folder} was written with {then}; this run resolves {now} "
                          f"({here['cuda_graphs_reason']}): resume it where it resolves the same, "
                          "or delete that folder to restart the run from scratch")


def check_rngs(folder: Path, accelerator) -> None:
    """Every RNG as the checkpoint has it: accelerate's load_state restores them inside a
    try that swallows any failure (a missing CUDA state, an unreadable file) with a log line at
    INFO, on the main process only, which nobody sees by default; the run would go on with
    other dropout masks and lose its exact resume without a word. All ranks agree."""
    try:
        states = accelerate_adapter.rng_states(folder, accelerator.process_index)
        numpy_now, numpy_then = np.random.get_state(), states["numpy"]
        same = (random.getstate() == states["python"]
                and numpy_now[0] == numpy_then[0] and np.array_equal(numpy_now[1], numpy_then[1])
                and tuple(numpy_now[2:]) == tuple(numpy_then[2:])
                and torch.equal(torch.get_rng_state(), states["torch"])
                and accelerator.step == states.get("step", accelerator.step))
        if same and accelerator.device.type == "cuda":
            same = all(torch.equal(a, b) for a, b in zip(
                torch.cuda.get_rng_state_all(), states["cuda"], strict=True))
    except Exception:       # noqa: BLE001 - unreadable or incomplete: not restored either
        same = False
    if accelerator.num_processes > 1:
        same = not accelerator.reduce(torch.tensor([float(not same)],
                                                   device=accelerator.device), "sum").item()
    if not same:
        raise CheckpointError(f"{folder}: its random number generator states were not restored "
                              "(accelerate's load_state only logs that), so the run would not "
                              "repeat the uninterrupted one: set resume_on_other_hardware: true "
                              "to resume anyway (not bit-exact), or delete that folder to "
                              "restart the run from scratch")
