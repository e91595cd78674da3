"""A run's loop state and its checkpoint/ folder (part of the outputs contract, kit.runs):

    checkpoint/best      the best epoch's model as `save(model, tokenizer, folder)` writes it
                         (kit.models.model_io: plain transformers loads it)
    checkpoint/last      the latest state to resume from, after an epoch or inside one:
                         accelerate's save_state (model as safetensors; optimizer, fp16's loss
                         scaler and every rank's RNG and step, read back by accelerate with
                         torch.load(weights_only=True)) and progress.json, the loop's Progress
    checkpoint/epoch<N>  inside epoch N only: that epoch's examples and plan of batches as drawn
                         (SSA labels included: they came from the model of epoch N - 1, which a
                         mid-epoch resume no longer has), kit.io's array files (no pickle)

Everything is written beside, flushed to disk (fsync) and swapped in by renames, so neither a
kill nor a node's crash leaves a half checkpoint, and nothing read back can execute code. Every
run keeps `last` while it trains (a preempted run resumes); `save_checkpoints: false` only
removes the folder once the run is recorded ok (`discard`).

`last` also records the hardware that wrote it (kit.train.checkpoint_hardware: precision,
device, processes; a GPU's model and how many the process saw): resuming on other hardware is
refused in one line unless the run allows it (`resume_on_other_hardware`), and then noted in
metrics.json, since the resumed run is no longer bit for bit the uninterrupted one. It records
what the run resolved cuda_graphs and length_buckets to as well: a resume that resolves them
otherwise computes another run, and is refused in one line naming both, whatever the switch.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from kit import io as kio
import kit.runs.arrays as arrays
from kit.data.pipeline import Examples
from kit.runs import checkpoint_dir, read_json, write_history
from kit.train import accelerate_adapter
from kit.train import checkpoint_hardware as khw
from kit.train.checkpoint_hardware import CheckpointError


@dataclass
class Progress:
    """What the loop accumulates; saved with the last checkpoint so a killed run resumes."""
    epoch: int = -1                    # last finished epoch
    step: int = 0
    trained_examples: int = 0
    elapsed: float = 0.0
    history: list = field(default_factory=list)
    epochs: list = field(default_factory=list)
    label_stats: list = field(default_factory=list)
    walls: dict = field(default_factory=lambda: {"train": 0.0, "label_generation": 0.0, "eval": 0.0})
    best: dict | None = None
    resumed_after_epoch: int | None = None
    # inside epoch `epoch + 1` (a mid-epoch checkpoint): its batches done, the losses of the
    # logging window not yet written, each task's window losses, the lr, its train seconds
    position: int | None = None
    window: list = field(default_factory=list)
    window_tasks: list = field(default_factory=list)
    epoch_losses: list = field(default_factory=list)
    lr: float = 0.0
    epoch_train_s: float = 0.0
    resumed_at: dict | None = None
    written_on: dict | None = None     # `hardware` of the run that wrote the checkpoint
    # what this run resolved its cuda_graphs and length_buckets to (kit.models.regional_compile.
    # resolve_graphs): written into the record with its hardware (written_on, its one copy in a
    # checkpoint), checked on resume and never taken from it: this run's own stands
    resolved: dict = field(default_factory=dict)
    other_hardware: list = field(default_factory=list)   # a line per resume on other hardware

    # this run's own, never a checkpoint's: written with the hardware (written_on) instead
    RUN_OWN = ("resolved",)

    def saved(self) -> dict:
        """What progress.json keeps: every field but the run's own."""
        return {k: v for k, v in asdict(self).items() if k not in self.RUN_OWN}

    def load(self, state: dict) -> None:
        self.__dict__.update({k: v for k, v in state.items() if k not in self.RUN_OWN})


@dataclass
class EpochWork:
    """An epoch's examples per task, its plan of global batches (task, rows) and SSA label
    statistics: what a mid-epoch checkpoint keeps of the epoch (kit.train.loop.Epoch's fields)."""
    sets: list
    plan: list
    label_stats: dict | None = None


def save_checkpoints(accelerator, model, tokenizer, run_dir: Path, improved: bool, save,
                     progress: Progress) -> None:
    """After an epoch, called on every rank: `best` (the model as `save(model, tokenizer, folder)`
    writes it, loadable by plain transformers) when it improved, and always `last` (`save_last`).
    The epoch's own examples are no longer needed once it is over."""
    folder = checkpoint_dir(run_dir)
    if improved and accelerator.is_main_process:
        with kio.atomic_dir(folder / "best") as tmp:
            save(model, tokenizer, tmp)
    save_last(accelerator, run_dir, progress)
    if accelerator.is_main_process:
        for old in folder.glob("epoch*"):
            shutil.rmtree(old, ignore_errors=True)


def save_mid_epoch(accelerator, run_dir: Path, progress: Progress, work: EpochWork) -> None:
    """Inside epoch `progress.epoch + 1`, called on every rank: the epoch's examples and plan
    (once per epoch, by the main process), then `last`. Only the latest state is kept."""
    epoch = progress.epoch + 1
    folder = epoch_dir(run_dir, epoch)
    if accelerator.is_main_process and not folder.is_dir():
        with kio.atomic_dir(folder) as tmp:
            for k, examples in enumerate(work.sets):
                arrays.write_arrays(tmp / f"set{k}.safetensors", vars(examples), {})
            arrays.write_arrays(tmp / "plan.safetensors",
                             {"task": np.array([t for t, _ in work.plan], dtype=np.int64),
                              "rows": [np.asarray(r, dtype=np.int64) for _, r in work.plan]},
                             {"epoch": epoch, "sets": len(work.sets),
                              "label_stats": work.label_stats})
    save_last(accelerator, run_dir, progress)


def save_inside(accelerator, run_dir: Path, progress: Progress, work: EpochWork, position: int,
                t0: float, started: float) -> float:
    """A mid-epoch checkpoint after `position` batches of the epoch (the loop has put its
    unlogged window into `progress`, so history.csv's next row is the uninterrupted run's);
    history.csv brought up to date. `t0`: the start of the epoch's train clock, `started`:
    the run's; returns the clock's new start (the train seconds so far are counted here)."""
    now = time.perf_counter()
    progress.walls["train"] += now - t0
    progress.epoch_train_s += now - t0
    progress.position, progress.elapsed = position, now - started
    if accelerator.is_main_process:
        write_history(run_dir, progress.history)
    save_mid_epoch(accelerator, run_dir, progress, work)
    return time.perf_counter()


def save_last(accelerator, run_dir: Path, progress: Progress) -> None:
    """`last`: accelerate's state (model, optimizer, fp16's scaler, each rank's RNG and step)
    and progress.json with the hardware that wrote it, written beside and swapped in."""
    main = accelerator.is_main_process
    tmp = checkpoint_dir(run_dir) / "last.tmp"
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()        # every rank's RNG file is in
    if main:
        progress.written_on = {**khw.hardware(accelerator), **progress.resolved}
        kio.write_json(tmp / PROGRESS, progress.saved())
        last = checkpoint_dir(run_dir) / "last"     # .old: what resume reads after a kill
        kio.swap_in(tmp, last, last.with_name("last.old"))
    accelerator.wait_for_everyone()        # the other ranks may read the checkpoint next


def epoch_dir(run_dir: Path, epoch: int) -> Path:
    return checkpoint_dir(run_dir) / f"epoch{epoch}"


PROGRESS = "progress.json"


def resume(accelerator, run_dir: Path, progress: Progress,
           other_hardware: bool = False) -> EpochWork | None:
    """Restore the last checkpoint, if there is one, into the prepared model and optimizer, the
    RNGs and `progress`; returns the interrupted epoch's work when it was written inside an
    epoch (else None: the next epoch is drawn as the uninterrupted run drew it - SSA labels from
    the restored model and the (seed, epoch)-seeded generator). A checkpoint written on other
    hardware (`khw.hardware`: precision, device, processes, GPU model and count) is refused in
    one line naming both, or with `other_hardware` resumed and noted in progress.other_hardware.
    On the same hardware the RNGs must come back exactly (`khw.check_rngs`). Temporary files a killed run left go first."""
    if accelerator.is_main_process:
        clean_stale(run_dir)
    last = checkpoint_dir(run_dir) / "last"
    # a kill between the two renames of kio.swap_in leaves only the previous copy, as .old
    folder = next((f for f in (last, last.with_name("last.old")) if f.is_dir()), None)
    if folder is None:
        return None
    if not (folder / PROGRESS).exists():
        raise CheckpointError(f"{folder} has no {PROGRESS} (an older kit's checkpoint, whose loop "
                              "state was a pickle, which the kit no longer reads); delete that "
                              "folder to restart the run from scratch")
    here = khw.hardware(accelerator)
    try:
        state = read_json(folder / PROGRESS)
        written = state.get("written_on") or khw.older_checkpoint(folder, here)
        khw.check_resolution(folder, written, progress.resolved)
        if "gpus" in here and "gpus" not in written:
            written = {**written, **khw.gpus_of_rng_file(folder, accelerator)}
        note = khw.compare(folder, written, here, other_hardware, khw.requeued())
        hook = (accelerator.register_load_state_pre_hook(_weights_of_any_wrapper(accelerator))
                if written["processes"] != here["processes"] else None)
        try:
            with accelerate_adapter.scaler_set_aside(accelerator, folder):
                accelerator.load_state(str(folder))
        finally:
            if hook is not None:
                hook.remove()
        progress.load(state)
        work = None if progress.position is None else load_epoch(run_dir, progress.epoch + 1)
    except CheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"{folder} is corrupt ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); delete "
                              "that folder to restart the run from scratch") from None
    if note is None:
        khw.check_rngs(folder, accelerator)
    else:
        progress.other_hardware.append(note)
    progress.resumed_after_epoch = progress.epoch
    return work


def _weights_of_any_wrapper(accelerator):
    """A load_state pre-hook for a checkpoint of another number of processes: DDP saved its
    weights as `module.<name>`, one process as `<name>`; load them into the plain model
    whichever it was (safetensors' load_model: tied weights stored once) and take the model off
    accelerate's list."""
    from safetensors import safe_open
    from safetensors.torch import load_model

    def hook(models: list, input_dir: str) -> None:
        for i, model in enumerate(models):
            file = accelerate_adapter.model_file(input_dir, i)
            target = accelerator.unwrap_model(model)
            with safe_open(str(file), "pt") as f:
                if next(iter(f.keys()), "").startswith("module."):
                    target = torch.nn.Module()
                    target.module = accelerator.unwrap_model(model)
            load_model(target, file, device="cpu")
        models.clear()
    return hook


def load_epoch(run_dir: Path, epoch: int) -> EpochWork:
    """The examples and plan `save_mid_epoch` kept of `epoch`."""
    folder = epoch_dir(run_dir, epoch)
    plan, meta = arrays.read_arrays(folder / "plan.safetensors")
    sets = [Examples(**arrays.read_arrays(folder / f"set{k}.safetensors")[0])
            for k in range(meta["sets"])]
    return EpochWork(sets, [(int(t), rows.tolist()) for t, rows in zip(plan["task"], plan["rows"])],
                     meta["label_stats"])


# what a killed run may leave in checkpoint/: half-written copies (`last.tmp`, `best.tmp`, and
# kit.io.atomic_dir's `.epoch<N>.*.tmp`, each a whole epoch's examples) and atomic_dir's old
# copies (`.epoch<N>.*.old`). Only the run writes there (the run folder itself also holds the
# batch's notebook, written while the run runs: not touched)
STALE = ("*.tmp", ".*.tmp", ".*.old")


def clean_stale(run_dir: Path) -> None:
    """Remove what a killed run left half-written in checkpoint/ (`STALE`); called by the
    process that holds the run's lock, before it resumes. `last.old` stays: it may be the only
    whole checkpoint."""
    for pattern in STALE:
        for path in checkpoint_dir(run_dir).glob(pattern):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def discard(run_dir: Path) -> None:
    """Remove checkpoint/ of a run recorded ok that was not asked to keep it
    (`save_checkpoints: false`): it was there only for a preempted run to resume."""
    shutil.rmtree(checkpoint_dir(run_dir), ignore_errors=True)
