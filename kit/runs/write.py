"""The outputs contract's writers of a run's files: its folder, history.csv, predictions and
saved SSA labels (metrics.json and config.json: kit.runs.lifecycle, which records how a run ends).
Only the main process of a data-parallel run writes."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from kit import io as kio
import kit.runs.arrays as arrays
from kit.config.run_config import RunConfig
from kit.runs.read import run_dir_of, saved_labels_path


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


def write_saved_labels(run_dir: str | Path, epoch: int, epoch_set: dict, stats: dict) -> None:
    """Save one SSA epoch: `epoch_set` (kit.data.pipeline.Examples' fields, vars(examples)) as
    arrays, `stats` (LabelStats as a dict) as the file's JSON."""
    arrays.write_arrays(saved_labels_path(run_dir, epoch), epoch_set, {"stats": stats})
