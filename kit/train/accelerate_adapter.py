"""The parts of accelerate the kit relies on that accelerate offers no public API for, all in this
one module: its process-wide precision (reset between two runs of one process), its fp16 path
switched on for a CPU, its loss scaler set aside while loading a checkpoint written without one,
and the file names and RNG keys of its save_state folder. tests/test_accelerate_adapter.py pins
each one, so an accelerate that changed it fails there, loudly, not in a run; pyproject.toml
bounds accelerate to the versions those tests passed on."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

SCALER_FILE = "scaler.pt"             # accelerate.utils.constants.SCALER_NAME


def reset_precision(precision: str) -> None:
    """accelerate keeps one precision per process (its AcceleratorState refuses another until
    reset), so a notebook or test that runs fit in bf16 and then in fp32 would fail. In a single
    process, forget the old precision; the process state (PartialState) is kept. Models prepared
    earlier keep the autocast they were wrapped with."""
    from accelerate.state import AcceleratorState, PartialState
    state = AcceleratorState._shared_state
    single = PartialState._shared_state.get("num_processes", 1) == 1
    if state and single and state.get("_mixed_precision") != precision:
        AcceleratorState._reset_state()


def fp16_on_cpu(accelerator) -> None:
    """accelerate (1.15) takes fp16 on a CPU as no autocast and no loss scaler, yet reports
    "fp16": the run would be fp32 under an fp16 label. torch has both for the CPU (autocast in
    float16, GradScaler("cpu")), so switch accelerate's own fp16 path on before prepare(): a CPU
    then runs the code a T4 runs (autocast, scaled backward, unscale in clip_grad_norm_, the
    prepared optimizer stepping through the scaler, scaler.pt in save_state). Slow without
    avx512_fp16 / AMX-FP16 (emulated, like bf16): it is there to be right, not fast."""
    if accelerator.native_amp:          # an accelerate that does it itself
        return
    accelerator.native_amp = True
    accelerator.scaler = torch.amp.GradScaler("cpu")


@contextmanager
def scaler_set_aside(accelerator, folder: Path):
    """load_state of a checkpoint without scaler.pt (fp16 here, not there) with no scaler, so
    accelerate does not look for one: the run starts a fresh loss scale; the scaler is back
    afterwards."""
    scaler = accelerator.scaler
    if not (folder / SCALER_FILE).exists():
        accelerator.scaler = None
    try:
        yield
    finally:
        accelerator.scaler = scaler


def model_file(folder: str | Path, index: int) -> Path:
    """The weights save_state writes for the `index`-th prepared model."""
    return Path(folder) / (f"model_{index}.safetensors" if index else "model.safetensors")


def rng_files(folder: Path) -> list[Path]:
    """save_state's RNG files: one per process."""
    return sorted(folder.glob("random_states_*.pkl"))


def rng_states(folder: Path, rank: int) -> dict:
    """The RNG states save_state kept for process `rank`: {"python": random's state, "numpy":
    numpy's legacy state tuple, "torch": the CPU generator's state, "cuda": one state per visible
    GPU (absent without CUDA), "step": the accumulation step (absent in older accelerate)}. Read
    with accelerate's own loader (torch.load(weights_only=True): no code runs)."""
    from accelerate.utils import load
    states = load(folder / f"random_states_{rank}.pkl")
    names = {"random_state": "python", "numpy_random_seed": "numpy",
             "torch_manual_seed": "torch", "torch_cuda_manual_seed": "cuda", "step": "step"}
    return {ours: states[theirs] for theirs, ours in names.items() if theirs in states}
