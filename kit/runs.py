"""THE outputs contract: what a run writes under outputs/runs/<run_id>/ and how it is read back.

    config.json        the resolved RunConfig, written when the run starts
    metrics.json       status ok / failed (+ error), written atomically when the run ends
    history.csv        one row per logging step
    predictions/       dev predictions of the best epoch (<split>.tsv, multi-task <TASK>/<split>.tsv),
                       test predictions in the GLUE server's format, submission.csv (CSV tasks)
    checkpoint/        best and last (kit.models.save_model layout); last also holds the loop state
    notebook.ipynb     written by kit.batch

Every reader and writer of a run folder is here (torch is imported only where checkpoints are
read or written: tables and figures run without it), and only the main process writes (several
processes of one data-parallel run share the folder). A finished run (metrics.json status ok) is never rerun or
overwritten; a lock keeps two processes from training one config at once.
"""
from __future__ import annotations

import csv
import io
import json
import random
import shutil
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kit import io as kio
from kit.config import RunConfig

STATE_FILE = "trainer_state.pt"


class RunLocked(RuntimeError):
    pass


class CheckpointError(RuntimeError):
    pass


def run_dir_of(cfg: RunConfig) -> Path:
    return Path(cfg.outputs_dir) / "runs" / cfg.run_id


def finished_metrics(cfg: RunConfig) -> dict | None:
    """The metrics of an earlier run of this exact config that ended ok, if any."""
    try:
        done = read_metrics(run_dir_of(cfg))
    except (OSError, ValueError):
        return None
    return done if done and done.get("status") == "ok" else None


# ---------------------------------------------------------------- reading a run folder

def read_json(path: Path) -> dict:
    """A JSON object from disk, or a one-line ValueError naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: corrupt JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_config(run_dir: str | Path) -> dict | None:
    """The run's config.json, None when it has none (not a run folder)."""
    path = Path(run_dir) / "config.json"
    return read_json(path) if path.exists() else None


def read_metrics(run_dir: str | Path) -> dict | None:
    """The run's metrics.json, None while it runs (or was killed before the end)."""
    path = Path(run_dir) / "metrics.json"
    return read_json(path) if path.exists() else None


def read_history(run_dir: str | Path) -> pd.DataFrame | None:
    """history.csv (step, epoch, wall_s, loss terms, lr), None before the first logged step."""
    path = Path(run_dir) / "history.csv"
    return pd.read_csv(path) if path.exists() else None


def make_run_dir(cfg: RunConfig) -> Path:
    """The run's folder, created; one line when the outputs folder cannot be written."""
    run_dir = run_dir_of(cfg)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise kio.OutputsError(f"cannot write to outputs folder {cfg.outputs_dir!r} "
                               f"({err.strerror}); set outputs_dir (kit.batch: --outputs) to a "
                               "writable folder") from None
    return run_dir


def base_record(cfg: RunConfig) -> dict:
    return {"run_id": cfg.run_id, "task": cfg.task, "model": cfg.model, "method": cfg.method,
            "seed": cfg.seed, "profile": cfg.profile,
            **({"tasks": list(cfg.tasks)} if cfg.tasks else {})}


def record_failed(cfg: RunConfig, error: str, tb: str | None = None) -> None:
    """metrics.json with status failed: the run's own error, or (kit.batch) its kernel's death."""
    kio.write_json(run_dir_of(cfg) / "metrics.json", {
        **base_record(cfg), "status": "failed", "error": error,
        **({"traceback": tb[-4000:]} if tb else {})})


def run_recorded(cfg: RunConfig, body) -> dict:
    """The frame of every run: a config that already finished ok is not rerun (its results are
    never overwritten); one process trains a run at a time (RunLocked otherwise); config.json
    first, then metrics.json with status ok, or failed and the error. `body(cfg, run_dir)`
    trains and returns the metrics; a run killed earlier resumes inside it.

    Data-parallel (torchrun / accelerate launch): the main process alone takes the lock, checks
    for a finished run and writes; it tells the other ranks whether to train, and they wait."""
    state = process_state()
    if not state.is_main_process:
        verdict, payload = _broadcast(state, None)
        if verdict == "done":
            return payload
        if verdict == "locked":
            raise RunLocked(payload)
        return {**base_record(cfg), "status": "ok", "error": None, **body(cfg, run_dir_of(cfg))}
    done = finished_metrics(cfg)
    if done is not None:
        return _broadcast(state, ("done", done))[1]
    run_dir = make_run_dir(cfg)
    with kio.FileLock(run_dir / ".lock") as locked:
        if not locked:
            message = f"{run_dir} is being trained by another process"
            _broadcast(state, ("locked", message))
            raise RunLocked(message)
        done = finished_metrics(cfg)       # it may have finished while we waited for the lock
        if done is not None:
            return _broadcast(state, ("done", done))[1]
        _broadcast(state, ("go", None))
        kio.write_json(run_dir / "config.json", cfg.to_dict())
        try:
            result = body(cfg, run_dir)
        except BaseException as err:   # KeyboardInterrupt too: a stopped run must say so
            record_failed(cfg, f"{type(err).__name__}: {err}".splitlines()[0],
                          traceback.format_exc())
            raise
        metrics = {**base_record(cfg), "status": "ok", "error": None, **result}
        kio.write_json(run_dir / "metrics.json", metrics)
        return metrics


def process_state():
    """accelerate's process state (one process, or a rank of torchrun / accelerate launch).
    Without a GPU, ranks are CPU processes (gloo): accelerate needs to be told (cpu=True)."""
    import torch
    from accelerate import PartialState
    return PartialState(cpu=not torch.cuda.is_available())


def _broadcast(state, verdict):
    """The main process's verdict, on every rank (a no-op in one process)."""
    if state.num_processes == 1:
        return verdict
    from accelerate.utils import broadcast_object_list
    return broadcast_object_list([verdict])[0]


# ---------------------------------------------------------------- loop state and checkpoints

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


def _rng_state() -> dict:
    import torch
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def save_checkpoints(model, tokenizer, run_dir: Path, improved: bool, progress: Progress,
                     optimizer, save) -> None:
    """After an epoch: `best` when it improved, and always `last` with the loop state (progress,
    optimizer, RNG) that `resume` reads back. `save(model, tokenizer, folder)` writes a model."""
    if improved:
        _save_atomic(save, model, tokenizer, run_dir / "checkpoint" / "best")
    _save_atomic(save, model, tokenizer, run_dir / "checkpoint" / "last",
                 state={"progress": asdict(progress), "optimizer": optimizer.state_dict(),
                        "rng": _rng_state()})


def resume(model, optimizer, run_dir: Path, load) -> Progress | None:
    """Load the last checkpoint's weights (read with `load`), optimizer, RNG and loop state, if
    there is one. SSA labels need no saving: they are regenerated from the restored model and
    the (seed, epoch)-seeded generator, exactly as the uninterrupted run drew them."""
    import torch
    last = run_dir / "checkpoint" / "last"
    # a kill between the two renames of _save_atomic leaves only the previous copy, as .old
    folder = next((f for f in (last, last.with_name("last.old")) if (f / STATE_FILE).exists()), None)
    if folder is None:
        return None
    try:
        state = torch.load(folder / STATE_FILE, weights_only=False)
        model.load_state_dict(load(folder)[0].state_dict())
        optimizer.load_state_dict(state["optimizer"])
    except Exception as err:
        raise CheckpointError(f"{folder} is corrupt ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); delete "
                              "that folder to restart the run from scratch") from None
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    if state["rng"]["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    progress = Progress(**state["progress"])
    progress.resumed_after_epoch = progress.epoch
    return progress


def _save_atomic(save, model, tokenizer, folder: Path, state: dict | None = None) -> None:
    """Write into a sibling temp folder, then swap it in: a crash never leaves a half checkpoint."""
    import torch
    tmp = folder.with_name(folder.name + ".tmp")
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    if folder.exists():                    # else .old may be the only complete copy
        shutil.rmtree(old, ignore_errors=True)
    save(model, tokenizer, tmp)
    if state is not None:
        torch.save(state, tmp / STATE_FILE)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- history and predictions

def write_history(run_dir: Path, history: list[dict]) -> None:
    if not history:
        return
    buf = io.StringIO()
    fields = list(dict.fromkeys(k for row in history for k in row))
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(history)
    kio.write_text(run_dir / "history.csv", buf.getvalue())


def label_text(task, value) -> str:
    return f"{float(value):.7g}" if task.regression else task.labels[int(value)]


def predictions_dir(run_dir: Path, task_name: str | None = None) -> Path:
    """predictions/, or predictions/<TASK>/ for one task of a multi-task run."""
    return run_dir / "predictions" / (task_name or "")


def write_dev_predictions(folder: Path, task, splits: dict, results: dict,
                          suffix: str = "") -> None:
    for name, (preds, labels) in results.items():
        rows = ["index\tprediction\tlabel"] + [
            f"{i}\t{label_text(task, p)}\t{label_text(task, y)}"
            for i, p, y in zip(splits[name].ids, preds, labels)]
        kio.write_text(folder / f"{name}{suffix}.tsv", "\n".join(rows) + "\n")


def write_test_predictions(folder: Path, task, name: str, split, preds: np.ndarray) -> None:
    """The GLUE server's format: `index<TAB>prediction`, label strings (scores for STS-B)."""
    rows = ["index\tprediction"] + [f"{i}\t{label_text(task, p)}" for i, p in zip(split.ids, preds)]
    kio.write_text(folder / f"{name}.tsv", "\n".join(rows) + "\n")
