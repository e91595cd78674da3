"""THE outputs contract: what a run writes under outputs/runs/<run_id>/ and how it is read back.

    config.json        the resolved RunConfig, written when the run starts
    metrics.json       status ok / failed (+ error) / preempted (+ where it stopped: a signal
                       stopped it after a checkpoint; rerunning resumes), written atomically
    history.csv        one row per logging step
    predictions/       dev predictions of the best epoch (<split>.tsv, multi-task <TASK>/<split>.tsv),
                       test predictions in the GLUE server's format, submission.csv (CSV tasks)
    checkpoint/        best (kit.models.model_io's layout: plain transformers loads it) and last
                       (accelerate's save_state: model, optimizer, RNGs, loop progress; for
                       resuming); written and restored by kit.train.run_state
    ssa_labels/        each SSA epoch's training set and label statistics, epoch<N>.npz
                       (save_labels: true; kit.io.write_arrays' format, never a pickle: outputs/
                       may be shared; written by write_saved_labels, read by read_saved_labels)
    notebook.ipynb     written by kit.batch

Every reader and writer of a run folder is here (torch is not imported at module level: tables
and figures run without it); only the main process of a data-parallel run writes. A finished
run (metrics.json status ok) is reused, unless rerun replaces it with a run that ends ok; a lock
keeps two processes from training one config at once.
"""
from __future__ import annotations

import csv
import io
import shutil
import traceback
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from kit import io as kio
from kit.config.paths import outputs_root
from kit.config.run_config import RunConfig


class RunLocked(RuntimeError):
    pass


class RunPreempted(Exception):
    """A run stopped on a signal after writing a checkpoint (kit.train.preemption); `where`: what
    metrics.json records of it (signal, epoch, step, checkpoint ...). Rerunning resumes it."""

    def __init__(self, where: dict):
        super().__init__(f"stopped by {where.get('signal')} at epoch {where.get('epoch')}, "
                         f"step {where.get('step')}; rerun to resume")
        self.where = where


def run_dir_of(cfg: RunConfig) -> Path:
    return runs_root(cfg.outputs_dir) / cfg.run_id


def finished_metrics(cfg: RunConfig) -> dict | None:
    """The metrics of an earlier run of this exact config that ended ok, if any."""
    try:
        done = read_metrics(run_dir_of(cfg))
    except (OSError, ValueError):
        return None
    return done if done and done.get("status") == "ok" else None


# ---------------------------------------------------------------- reading a run folder

read_json = kio.read_json     # a JSON object from disk, or a one-line ValueError naming the file


def config_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "config.json"


def metrics_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "metrics.json"


def history_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "history.csv"


def notebook_path(run_dir: str | Path) -> Path:
    """notebook.ipynb: the run's executed notebook (kit.batch writes it; the report renders it)."""
    return Path(run_dir) / "notebook.ipynb"


def read_config(run_dir: str | Path) -> dict | None:
    """The run's config.json, None when it has none (not a run folder)."""
    path = config_path(run_dir)
    return read_json(path) if path.exists() else None


def read_metrics(run_dir: str | Path) -> dict | None:
    """The run's metrics.json, None while it runs (or was killed before the end)."""
    path = metrics_path(run_dir)
    return read_json(path) if path.exists() else None


def read_history(run_dir: str | Path) -> pd.DataFrame | None:
    """history.csv (step, epoch, wall_s, loss terms, lr), None before the first logged step."""
    path = history_path(run_dir)
    return pd.read_csv(path) if path.exists() else None


def runs_root(outputs_dir: str | Path) -> Path:
    """outputs/runs: one folder per run id (where "outputs" is: kit.config.paths.outputs_root)."""
    return outputs_root(outputs_dir) / "runs"


def run_folders(root: str | Path) -> list[Path]:
    """The run folders under a runs root, sorted: its sub-folders but hidden ones (.locks ...)."""
    return sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


def run_started(run_dir: str | Path) -> bool:
    """Whether a run has used this folder: config.json (started) or metrics.json (ended, or its
    kernel died and kit.batch recorded it)."""
    return config_path(run_dir).exists() or metrics_path(run_dir).exists()


def dev_predictions_path(run_dir: str | Path, epoch: int | None = None) -> Path:
    """predictions/dev.tsv (the best epoch's), or dev_epoch<N>.tsv (save_epoch_predictions)."""
    name = "dev.tsv" if epoch is None else f"dev_epoch{epoch}.tsv"
    return predictions_dir(Path(run_dir)) / name


def read_dev_predictions(run_dir: str | Path, epoch: int | None = None) -> pd.DataFrame | None:
    """A single-task run's dev predictions (`dev_predictions_path`) as written: index,
    prediction, label, all strings (label names stay names, "NA" stays text); None without."""
    path = dev_predictions_path(run_dir, epoch)
    if not path.exists():
        return None
    return pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, quoting=csv.QUOTE_NONE)


def checkpoint_dir(run_dir: str | Path) -> Path:
    """checkpoint/: best (kit.models.model_io's layout), last (kit.train.run_state's state)."""
    return Path(run_dir) / "checkpoint"


def best_checkpoint(run_dir: str | Path) -> Path | None:
    """checkpoint/best when the run kept one (kit.models.model_io.save_model's layout, whose head
    spec, head_spec.json, every saved model has), else None."""
    folder = checkpoint_dir(run_dir) / "best"
    return folder if (folder / "head_spec.json").exists() else None


def saved_labels_path(run_dir: str | Path, epoch: int) -> Path:
    """ssa_labels/epoch<N>.npz: one SSA epoch's set and statistics (reuse_labels_from reads it)."""
    return saved_labels_dir(run_dir) / f"epoch{epoch}.npz"


def saved_labels_dir(run_dir: str | Path) -> Path:
    """ssa_labels/: one epoch<N>.npz per SSA-labelled epoch of a run with save_labels: true
    (written by kit.methods.ssa.ssa_labels_epoch through write_saved_labels)."""
    return Path(run_dir) / "ssa_labels"


def write_saved_labels(run_dir: str | Path, epoch: int, epoch_set: dict, stats: dict) -> None:
    """Save one SSA epoch: `epoch_set` (kit.data.pipeline.Examples' fields, vars(examples)) as
    arrays, `stats` (LabelStats as a dict) as the file's JSON."""
    kio.write_arrays(saved_labels_path(run_dir, epoch), epoch_set, {"stats": stats})


def read_saved_epoch(run_dir: str | Path, epoch: int) -> dict | None:
    """One saved SSA epoch, {"epoch_set": Examples' fields, "stats": its LabelStats as a dict};
    None when the run saved none for it. An epoch<N>.pt of an earlier kit version (a pickle)
    is refused, never loaded."""
    path = saved_labels_path(run_dir, epoch)
    if not path.exists():
        _refuse_pickled_labels([path.with_suffix(".pt")])
        return None
    arrays, meta = kio.read_arrays(path)
    if not isinstance(meta, dict) or not isinstance(meta.get("stats"), dict):
        raise kio.refused(path, "no SSA label statistics in its header")
    return {"epoch_set": arrays, "stats": meta["stats"]}


def read_saved_labels(run_dir: str | Path) -> Iterator[dict]:
    """The run's saved SSA epochs in epoch order, each as `read_saved_epoch` gives it; nothing
    when it saved none. Refuses (kio.UnsafeFileError) a folder holding .pt labels of an earlier
    kit version: they are pickles, which run code."""
    folder = saved_labels_dir(run_dir)
    _refuse_pickled_labels(sorted(folder.glob("epoch*.pt")))
    epochs = sorted(int(path.stem.removeprefix("epoch")) for path in folder.glob("epoch*.npz")
                    if path.stem.removeprefix("epoch").isdigit())
    for epoch in epochs:
        yield read_saved_epoch(run_dir, epoch)


def _refuse_pickled_labels(paths: list[Path]) -> None:
    """One line for the first .pt label file there is: torch.load would unpickle it."""
    old = [path for path in paths if path.exists()]
    if old:
        raise kio.refused(old[0], "SSA labels saved as .pt by an earlier kit version, a pickle",
                          hint="; regenerate them: remove that run's folder and rerun it with "
                               "save_labels: true")


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


def record_failed(cfg: RunConfig, error: str, tb: str | None = None,
                  environment: dict | None = None) -> None:
    """metrics.json with status failed: the run's own error, or (kit.batch) its kernel's death;
    `environment`: where it ran (kit.train.provenance)."""
    kio.write_json(run_dir_of(cfg) / "metrics.json", {
        **base_record(cfg), "status": "failed", "error": error,
        **({"traceback": tb[-4000:]} if tb else {}), "environment": environment})


def run_recorded(cfg: RunConfig, body, state, environment: Callable[[int], dict],
                 reused: Callable[[dict], None] = lambda metrics: None) -> dict:
    """The frame of every run: a finished config is reused (`reused(its metrics)`) unless
    cfg.rerun, whose run replaces it only by ending ok (`begin`, `end_rerun`); one process trains
    a run at a time (RunLocked otherwise); config.json first, then metrics.json ok, or failed and
    the error. `body(cfg, run_dir)` trains, returns the metrics; a killed run (a rerun too)
    resumes inside it. Data-parallel: the main process alone locks, checks and writes; the other
    ranks hear whether to train. `state`: kit.train.accel.process_state(); `environment(n)`:
    the record's provenance (kit.train.provenance.environment)."""
    if not state.is_main_process:
        verdict, payload = _broadcast(state, None)
        if verdict == "done":
            return payload
        if verdict == "locked":
            raise RunLocked(payload)
        return {**base_record(cfg), "status": "ok", "error": None, **body(cfg, run_dir_of(cfg))}
    done = finished_metrics(cfg)
    if done is not None and not cfg.rerun:
        reused(done)
        return _broadcast(state, ("done", done))[1]
    run_dir = make_run_dir(cfg)
    with lock(cfg) as locked:
        if not locked:
            message = f"{run_dir} is being trained by another process"
            _broadcast(state, ("locked", message))
            raise RunLocked(message)
        done = begin(cfg)                  # it may have finished while we waited for the lock
        if done is not None:
            reused(done)
            return _broadcast(state, ("done", done))[1]
        _broadcast(state, ("go", None))
        kio.write_json(run_dir / "config.json", {**cfg.to_dict(), "rerun": False})  # what ran
        try:
            result = body(cfg, run_dir)
        except RunPreempted as stopped:    # not a failure: the next invocation resumes it
            kio.write_json(run_dir / "metrics.json", {
                **base_record(cfg), "status": "preempted", "error": None,
                "preempted": stopped.where, "environment": environment(state.num_processes)})
            raise
        except BaseException as err:   # KeyboardInterrupt too: a stopped run must say so
            record_failed(cfg, f"{type(err).__name__}: {err}".splitlines()[0],
                          traceback.format_exc(), environment(state.num_processes))
            if cfg.rerun:              # (kit.run trains a rerun as rerun=False, ends it itself)
                end_rerun(cfg, ok=False)
            raise
        metrics = {**base_record(cfg), "status": "ok", "error": None, **result,
                   "finished_at": datetime.now().astimezone().isoformat(timespec="seconds"),
                   "environment": environment(state.num_processes)}
        kio.write_json(run_dir / "metrics.json", metrics)
        end_rerun(cfg, ok=True)
        return metrics


def lock(cfg: RunConfig) -> kio.FileLock:
    """The run's lock: one process trains a run, or moves its files, at a time."""
    return kio.FileLock(run_dir_of(cfg) / ".lock")


def begin(cfg: RunConfig) -> dict | None:
    """Under the lock, once what a process killed while moving a rerun's files left is settled:
    the finished run's metrics to reuse, else None; cfg.rerun sets its files aside (hidden)."""
    kio.settle(run_dir_of(cfg), _previous(cfg))
    if (done := finished_metrics(cfg)) is not None:
        end_rerun(cfg, ok=True)            # a run set aside whose rerun had finished
        if cfg.rerun:
            kio.set_aside(run_dir_of(cfg), _previous(cfg))
    return None if cfg.rerun else done


def end_rerun(cfg: RunConfig, ok: bool) -> None:
    """Under the lock, as a rerun ends: ok drops the run set aside, failed puts it back."""
    if (previous := _previous(cfg)).exists():
        shutil.rmtree(previous) if ok else kio.put_back(run_dir_of(cfg), previous)


def _previous(cfg: RunConfig) -> Path:
    return runs_root(cfg.outputs_dir) / f".{cfg.run_id}.previous"


def _broadcast(state, verdict):
    """The main process's verdict, on every rank (a no-op in one process)."""
    if state.num_processes == 1:
        return verdict
    from accelerate.utils import broadcast_object_list
    return broadcast_object_list([verdict])[0]


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
