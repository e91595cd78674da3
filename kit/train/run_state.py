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

Everything is written beside and swapped in, so a kill never leaves a half checkpoint, and
nothing read back can execute code.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kit import io as kio
from kit.data.pipeline import Examples
from kit.runs import checkpoint_dir, read_json, write_history

class CheckpointError(RuntimeError):
    pass


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

    def load(self, state: dict) -> None:
        self.__dict__.update(state)


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
        _swap_in(lambda tmp: save(model, tokenizer, tmp), folder / "best")
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
                kio.write_arrays(tmp / f"set{k}.npz", vars(examples), {})
            kio.write_arrays(tmp / "plan.npz",
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
    and progress.json, written beside and swapped in."""
    main = accelerator.is_main_process
    tmp = checkpoint_dir(run_dir) / "last.tmp"
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()        # every rank's RNG file is in
    if main:
        kio.write_json(tmp / PROGRESS, asdict(progress))
        _swap_in(None, checkpoint_dir(run_dir) / "last")
    accelerator.wait_for_everyone()        # the other ranks may read the checkpoint next


def epoch_dir(run_dir: Path, epoch: int) -> Path:
    return checkpoint_dir(run_dir) / f"epoch{epoch}"


PROGRESS = "progress.json"


def resume(accelerator, run_dir: Path, progress: Progress) -> EpochWork | None:
    """Restore the last checkpoint, if there is one, into the prepared model and optimizer, the
    RNGs and `progress`; returns the interrupted epoch's work when it was written inside an
    epoch (else None: the next epoch is drawn as the uninterrupted run drew it - SSA labels from
    the restored model and the (seed, epoch)-seeded generator). A checkpoint written by another number of processes is refused
    (DDP's parameter names and the per-rank RNG files differ), and so is one written with fp16's
    loss scaler into a run without one, or the reverse (`auto` resolved on another machine)."""
    last = checkpoint_dir(run_dir) / "last"
    # a kill between the two renames of _swap_in leaves only the previous copy, as .old
    folder = next((f for f in (last, last.with_name("last.old")) if f.is_dir()), None)
    if folder is None:
        return None
    wrote = len(list(folder.glob("random_states_*.pkl")))     # one per rank
    if wrote != accelerator.num_processes:
        raise CheckpointError(f"{folder} was written by {wrote} process(es), this run has "
                              f"{accelerator.num_processes}: resume it with --processes {wrote}, "
                              "or delete that folder to restart the run from scratch")
    scaled = (folder / "scaler.pt").exists()
    if scaled != (accelerator.scaler is not None):
        raise CheckpointError(f"{folder} was written {'with' if scaled else 'without'} fp16's loss "
                              f"scaler and this run's precision is {accelerator.mixed_precision} "
                              "(mixed_precision auto resolves per machine): resume it on a machine "
                              "like the one that wrote it, or delete that folder to restart the "
                              "run from scratch")
    if not (folder / PROGRESS).exists():
        raise CheckpointError(f"{folder} has no {PROGRESS} (an older kit's checkpoint, whose loop "
                              "state was a pickle, which the kit no longer reads); delete that "
                              "folder to restart the run from scratch")
    try:
        accelerator.load_state(str(folder))
        progress.load(read_json(folder / PROGRESS))
        work = None if progress.position is None else load_epoch(run_dir, progress.epoch + 1)
    except Exception as err:
        raise CheckpointError(f"{folder} is corrupt ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); delete "
                              "that folder to restart the run from scratch") from None
    progress.resumed_after_epoch = progress.epoch
    return work


def load_epoch(run_dir: Path, epoch: int) -> EpochWork:
    """The examples and plan `save_mid_epoch` kept of `epoch`."""
    folder = epoch_dir(run_dir, epoch)
    plan, meta = kio.read_arrays(folder / "plan.npz")
    sets = [Examples(**kio.read_arrays(folder / f"set{k}.npz")[0]) for k in range(meta["sets"])]
    return EpochWork(sets, [(int(t), rows.tolist()) for t, rows in zip(plan["task"], plan["rows"])],
                     meta["label_stats"])


def _swap_in(write, folder: Path) -> None:
    """Swap `folder.tmp` in as `folder` (after `write(tmp)` made it, if given), keeping the old
    copy as `folder.old` until the new one is in place."""
    tmp = folder.with_name(folder.name + ".tmp")
    old = folder.with_name(folder.name + ".old")
    if write is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
    if folder.exists():                    # else .old may be the only complete copy
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
