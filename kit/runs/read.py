"""The outputs contract's readers: where a run's files are (paths) and what they say (reads).
kit.runs' docstring lists the files; the writers are kit.runs.write and kit.runs.lifecycle."""
from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kit import io as kio
import kit.runs.arrays as arrays
from kit.config.paths import outputs_root
from kit.config.run_config import RunConfig

if TYPE_CHECKING:         # pandas is imported where a frame is read: a run's process spares it
    import pandas as pd

read_json = kio.read_json     # a JSON object from disk, or a one-line ValueError naming the file


# ---------------------------------------------------------------- where a run's files are

def runs_root(outputs_dir: str | Path) -> Path:
    """outputs/runs: one folder per run id (where "outputs" is: kit.config.paths.outputs_root)."""
    return outputs_root(outputs_dir) / "runs"


def run_dir_of(cfg: RunConfig) -> Path:
    return runs_root(cfg.outputs_dir) / cfg.run_id


def previous_dir(cfg: RunConfig) -> Path:
    """.<run_id>.previous: a finished run's files that a rerun set aside (kit.runs.lifecycle)."""
    return runs_root(cfg.outputs_dir) / f".{cfg.run_id}.previous"


def config_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "config.json"


def metrics_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "metrics.json"


def history_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "history.csv"


def notebook_path(run_dir: str | Path) -> Path:
    """notebook.ipynb: the run's executed notebook (kit.batch writes it; the report renders it)."""
    return Path(run_dir) / "notebook.ipynb"


def notebook_span(run_dir: str | Path) -> tuple[float, float] | None:
    """(start, end) of the run's executed notebook as papermill stamped it, in seconds since the
    epoch (kit.plan's batch probe); None where the notebook or its stamps are absent."""
    from datetime import datetime
    try:
        stamps = kio.read_json(notebook_path(run_dir))["metadata"]["papermill"]
        return tuple(datetime.fromisoformat(stamps[k]).timestamp()
                     for k in ("start_time", "end_time"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def predictions_dir(run_dir: Path, task_name: str | None = None) -> Path:
    """predictions/, or predictions/<TASK>/ for one task of a multi-task run."""
    return run_dir / "predictions" / (task_name or "")


def dev_predictions_path(run_dir: str | Path, epoch: int | None = None) -> Path:
    """predictions/dev.tsv (the best epoch's), or dev_epoch<N>.tsv (save_epoch_predictions)."""
    name = "dev.tsv" if epoch is None else f"dev_epoch{epoch}.tsv"
    return predictions_dir(Path(run_dir)) / name


def checkpoint_dir(run_dir: str | Path) -> Path:
    """checkpoint/: best (kit.models.model_io's layout), last (kit.train.run_state's state)."""
    return Path(run_dir) / "checkpoint"


def saved_labels_dir(run_dir: str | Path) -> Path:
    """ssa_labels/: one epoch<N>.safetensors per SSA-labelled epoch of a run with save_labels: true
    (written by kit.methods.ssa.ssa_labels_epoch through write_saved_labels)."""
    return Path(run_dir) / "ssa_labels"


def saved_labels_path(run_dir: str | Path, epoch: int) -> Path:
    """ssa_labels/epoch<N>.safetensors: one SSA epoch's set and statistics (reuse_labels_from
    reads it)."""
    return saved_labels_dir(run_dir) / f"epoch{epoch}.safetensors"


def run_folders(root: str | Path) -> list[Path]:
    """The run folders under a runs root, sorted: its sub-folders but hidden ones (.locks ...)."""
    return sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


# ---------------------------------------------------------------- what they say

def read_config(run_dir: str | Path) -> dict | None:
    """The run's config.json, None when it has none (not a run folder)."""
    path = config_path(run_dir)
    return read_json(path) if path.exists() else None


def read_metrics(run_dir: str | Path) -> dict | None:
    """The run's metrics.json, None while it runs (or was killed before the end); a corrupt one
    is a one-line ValueError naming it (tables say so: kit.results.frame.collect)."""
    path = metrics_path(run_dir)
    return read_json(path) if path.exists() else None


def readable_metrics(run_dir: str | Path) -> dict | None:
    """The run's metrics.json where a reader only asks how the run ended: None when it has
    none, and when it cannot be read (corrupt, or its disk gone): the tables name that file."""
    try:
        return read_metrics(run_dir)
    except (OSError, ValueError):
        return None


def source_status(run_dir: str | Path) -> str:
    """How the run in `run_dir` ended, as a point that reads its output (saved SSA labels) asks:
    "ok", or why its output is not to be trained on: "failed", "blocked" (its own source did
    not finish), "unfinished, preempted", "unfinished, no metrics.json" (running, or killed),
    "damaged (why)" (a metrics.json that cannot be read) or "absent" (no such folder). A run
    that failed in its last epoch has saved every earlier epoch's labels: only "ok" vouches
    for them."""
    if not Path(run_dir).is_dir():
        return "absent"
    try:
        metrics = read_metrics(run_dir)
    except (OSError, ValueError) as err:
        return f"damaged ({str(err).splitlines()[0]})"
    status = (metrics or {}).get("status")
    if metrics is None or status == "preempted":
        return f"unfinished, {'preempted' if metrics else 'no metrics.json'}"
    if status == "failed" and metrics.get("blocked_by"):
        return "blocked"
    return str(status)


def blocked_source(folder: Path) -> str | None:
    """`source NAME: status` where the run in `folder` did not end ok (a reader of its output is
    blocked by it), else None."""
    status = source_status(folder)
    return None if status == "ok" else f"source {folder.name}: {status}"


def finished_metrics(cfg: RunConfig) -> dict | None:
    """The metrics of an earlier run of this exact config that ended ok, if any."""
    done = readable_metrics(run_dir_of(cfg))
    return done if done and done.get("status") == "ok" else None


def metrics_stamp(run_dir: str | Path) -> tuple | None:
    """Which metrics.json the folder holds (each write is a new file, kit.io, and a file set
    aside and put back keeps its own): (inode, mtime), None when it has none."""
    try:
        stat = metrics_path(run_dir).stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def run_started(run_dir: str | Path) -> bool:
    """Whether a run has used this folder: config.json (started) or metrics.json (ended, or its
    kernel died and kit.batch recorded it)."""
    return config_path(run_dir).exists() or metrics_path(run_dir).exists()


def notebook_error(run_dir: str | Path) -> str | None:
    """The first error the run's executed notebook shows, `ename: evalue` on one line (a cell
    that failed after fit(): kit.batch's `notebook failed`); None without an error or a
    notebook."""
    path = notebook_path(run_dir)
    if not path.exists():
        return None
    try:
        cells = read_json(path).get("cells") or []
    except (OSError, ValueError) as err:
        return f"its notebook cannot be read ({str(err).splitlines()[0]})"
    for output in (o for cell in cells for o in cell.get("outputs") or []):
        if output.get("output_type") == "error":
            text = f"{output.get('ename')}: {output.get('evalue')}".strip()
            return text.splitlines()[0] if text else "an error"
    return None


def read_history(run_dir: str | Path) -> pd.DataFrame | None:
    """history.csv (step, epoch, wall_s, loss terms, lr), None before the first logged step."""
    import pandas as pd
    path = history_path(run_dir)
    return pd.read_csv(path) if path.exists() else None


def read_dev_predictions(run_dir: str | Path, epoch: int | None = None) -> pd.DataFrame | None:
    """A single-task run's dev predictions (`dev_predictions_path`) as written: index,
    prediction, label, all strings (label names stay names, "NA" stays text); None without."""
    path = dev_predictions_path(run_dir, epoch)
    if not path.exists():
        return None
    import pandas as pd
    return pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, quoting=csv.QUOTE_NONE)


def best_checkpoint(run_dir: str | Path) -> Path | None:
    """checkpoint/best when the run kept one (kit.models.model_io.save_model's layout, whose head
    spec, head_spec.json, every saved model has), else None."""
    folder = checkpoint_dir(run_dir) / "best"
    return folder if (folder / "head_spec.json").exists() else None


def read_saved_epoch(run_dir: str | Path, epoch: int) -> dict | None:
    """One saved SSA epoch, {"epoch_set": Examples' fields, "stats": its LabelStats as a dict};
    None when the run saved none for it. An epoch<N>.pt or .npz of an earlier kit version is
    refused, never loaded."""
    path = saved_labels_path(run_dir, epoch)
    if not path.exists():
        _refuse_older_labels([path.with_suffix(".pt"), path.with_suffix(".npz")])
        return None
    epoch_set, meta = arrays.read_arrays(path)
    if not isinstance(meta, dict) or not isinstance(meta.get("stats"), dict):
        raise arrays.refused(path, "no SSA label statistics in its header")
    return {"epoch_set": epoch_set, "stats": meta["stats"]}


def saved_label_epochs(run_dir: str | Path) -> list[int]:
    """The epochs the run saved SSA labels for, in order, by their files' names: nothing is
    read (empty when it saved none). Refuses (arrays.UnsafeFileError) a folder holding labels of
    an earlier kit version: .pt (pickles, which run code) or .npz (kit-arrays/1)."""
    folder = saved_labels_dir(run_dir)
    _refuse_older_labels(sorted(folder.glob("epoch*.pt")) + sorted(folder.glob("epoch*.npz")))
    return sorted(int(path.stem.removeprefix("epoch")) for path in folder.glob("epoch*.safetensors")
                  if path.stem.removeprefix("epoch").isdigit())


def read_saved_labels(run_dir: str | Path) -> Iterator[dict]:
    """The run's saved SSA epochs in epoch order, each as `read_saved_epoch` gives it (one
    decoded per step of the iteration); nothing when it saved none."""
    for epoch in saved_label_epochs(run_dir):
        yield read_saved_epoch(run_dir, epoch)


def _refuse_older_labels(paths: list[Path]) -> None:
    """One line for the first label file of an earlier kit version there is: .pt (torch.load
    would unpickle it) or .npz (kit-arrays/1, before the kit wrote safetensors)."""
    old = [path for path in paths if path.exists()]
    if old:
        what = ".pt by an earlier kit version, a pickle" if old[0].suffix == ".pt" else (
            ".npz by an earlier kit version (kit-arrays/1)")
        raise arrays.refused(old[0], f"SSA labels saved as {what}",
                          hint="; regenerate them: remove that run's folder and rerun it with "
                               "save_labels: true")
