"""A run's loop state and its checkpoint/ folder (part of the outputs contract, kit.runs):

    checkpoint/best    the best epoch's model as `save(model, tokenizer, folder)` writes it
                       (kit.models.model_io: plain transformers loads it)
    checkpoint/last    accelerate's save_state after every epoch: model, optimizer, fp16's loss
                       scaler (scaler.pt), every rank's RNG and the registered Progress, which
                       `resume` restores

Both are written beside and swapped in, so a kill never leaves a half checkpoint.
"""
from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kit.runs import checkpoint_dir


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

    def state_dict(self) -> dict:          # accelerate's register_for_checkpointing protocol
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


def save_checkpoints(accelerator, model, tokenizer, run_dir: Path, improved: bool, save) -> None:
    """After an epoch, called on every rank: `best` (the model as `save(model, tokenizer, folder)`
    writes it, loadable by plain transformers) when it improved, and always `last`, accelerate's
    state (model, optimizer, each rank's RNG, the registered Progress) that `resume` reads back.
    Both are written beside and swapped in, so a kill never leaves a half checkpoint."""
    main = accelerator.is_main_process
    folder = checkpoint_dir(run_dir)
    if improved and main:
        _swap_in(lambda tmp: save(model, tokenizer, tmp), folder / "best")
    tmp = folder / "last.tmp"
    if main:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()        # every rank's RNG file is in
    if main:
        _swap_in(None, folder / "last")


def resume(accelerator, run_dir: Path, progress: Progress) -> bool:
    """Restore the last checkpoint, if there is one, into the prepared model and optimizer, the
    RNGs and `progress` (registered with the accelerator). SSA labels need no saving: they are
    regenerated from the restored model and the (seed, epoch)-seeded generator, exactly as the
    uninterrupted run drew them. A checkpoint written by another number of processes is refused
    (DDP's parameter names and the per-rank RNG files differ), and so is one written with fp16's
    loss scaler into a run without one, or the reverse (`auto` resolved on another machine)."""
    last = checkpoint_dir(run_dir) / "last"
    # a kill between the two renames of _swap_in leaves only the previous copy, as .old
    folder = next((f for f in (last, last.with_name("last.old")) if f.is_dir()), None)
    if folder is None:
        return False
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
    try:
        accelerator.load_state(str(folder))
    except Exception as err:
        raise CheckpointError(f"{folder} is corrupt ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); delete "
                              "that folder to restart the run from scratch") from None
    progress.resumed_after_epoch = progress.epoch
    return True


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
