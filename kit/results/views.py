"""What the notebooks show: small tables and matplotlib figures built from a run's outputs."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from kit import runs


def epoch_table(metrics: dict) -> pd.DataFrame:
    """Dev metrics per epoch (plus SSA label statistics where there are any; three-subset
    statistics where the run has them: masked-LM pretraining has none)."""
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
