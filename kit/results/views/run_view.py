"""What the notebooks show: small tables and matplotlib figures built from a run's outputs
(a multi-task run's: `per_task_table`, `multitask_epoch_table`)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from kit import runs
from kit.config.tasks import get_task
from kit.train.metrics import reported_metrics
from kit.train.progress import dev_columns, epoch_number


def summary_line(metrics: dict) -> str:
    """What a notebook prints after fit(): run id, status and the best epoch (counted from 1)
    with its dev metrics, e.g. `synthetic-ssa-h-s0-1a2b3c4d5e ok: best epoch 2/3, accuracy
    0.8125, f1 0.8010` (multi-task: each task's metrics and their mean score)."""
    if metrics.get("status") != "ok":
        return f"{metrics.get('run_id')} {metrics.get('status')}: {metrics.get('error')}"
    return f"{metrics['run_id']} ok: {best_epoch_line(metrics)}"


def best_epoch_line(metrics: dict) -> str:
    """A finished run's best epoch (counted from 1) of its epochs, with its dev metrics:
    `best epoch 2/3, accuracy 0.8125, f1 0.8010`; the notebooks' summary line and the end of
    `python -m kit.run` say it in these words."""
    dev = ", ".join(f"{k} {v:.4f}" for k, v in dev_columns(metrics.get("best_dev") or {}).items())
    return (f"best epoch {epoch_number(metrics['best_epoch'])}/"
            f"{len(metrics.get('epochs') or [])}, {dev}")


def epoch_table(metrics: dict) -> pd.DataFrame:
    """Dev metrics per epoch, counted from 1 (plus SSA label statistics where there are any;
    three-subset statistics where the run has them: masked-LM pretraining has none); `best`
    marks the best epoch."""
    rows = [{"epoch": e["epoch"], **e["dev"],
             **{f"three_subset_{k}": e["three_subset"][k] for k in ("mean", "std")
                if k in e["three_subset"]},
             "train_loss": e["train_loss"], "wall_s": e["wall_s"]}
            for e in metrics.get("epochs", [])]
    table = pd.DataFrame(rows)
    stats = pd.DataFrame(metrics.get("ssa_labels") or [])
    if len(stats) and "flip_rate" in stats:
        keep = ["epoch", "kept", "variants", "flip_rate", "share_label1",
                "cue_share_label1", "distractor_share_label1"]
        table = table.merge(stats[[c for c in keep if c in stats]], on="epoch", how="left")
    if len(table):
        table["best"] = table["epoch"].eq(metrics.get("best_epoch")).map({True: "★", False: ""})
        table["epoch"] = epoch_number(table["epoch"])     # records count from 0, readers from 1
    return table.set_index("epoch")


def plot_loss(run_dir: str | Path, ax=None):
    """Training loss terms against steps, from history.csv."""
    import matplotlib.pyplot as plt
    history = runs.read_history(run_dir)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for column in [c for c in history.columns if c.startswith("loss")]:
        values = history[column]
        if column == "loss_ssa":     # logged as 0 before SSA starts: not computed, not drawn
            values = values.where(values.ne(0).cummax())
        ax.plot(history["step"], values, label=column)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend()
    return ax


def per_task_table(metrics: dict) -> pd.DataFrame:
    """One row per task: its official dev metrics at the selected epoch (x1, fractions), the
    task score, three-subset mean/std and its train rows; comparable with single-task runs."""
    rows = []
    for name, values in metrics["per_task"].items():
        official = reported_metrics(get_task(name))
        three = metrics["per_task_three_subset"][name]
        rows.append({"task": name, **{m: values[m] for m in official}, "score": values["score"],
                     "three_subset_mean": three["mean"], "three_subset_std": three["std"],
                     "train_rows": metrics["task_sizes"][name]})
    return pd.DataFrame(rows).set_index("task")


def multitask_epoch_table(metrics: dict) -> pd.DataFrame:
    """Per epoch (counted from 1): each task's dev score, the selection score (mean), train
    loss, stage, batches."""
    rows = []
    for e in metrics["epochs"]:
        scores = {f"{n}": m["score"] for n, m in e["dev"].items() if n != "score"}
        rows.append({"epoch": epoch_number(e["epoch"]), **scores,
                     "mean_score": e["dev"]["score"], "train_loss": e["train_loss"],
                     "stage": e["stage"],
                     "batches": " ".join(f"{n}:{c}" for n, c in e["task_batches"].items()),
                     "wall_s": e["wall_s"]})
    return pd.DataFrame(rows).set_index("epoch")
