"""The SSA paper's figures, drawn with matplotlib from tidy frames: gamma sensitivity (Fig. 7),
training cost (Fig. 6), SSA label quality on the synthetic task, the mechanism benchmark and
the case study (Fig. 8); `save_figure` writes outputs/figures/<name>.png atomically.

Each figure is a data function (kit.results.figures.figure_data; the case study's
kit.results.figures.model_scores, the only one that loads models), a plot function here (from that
frame only) and a `<kind>_figure` that does both in one call from a profile's runs
(`kit.results.frame.collect.collect_runs`).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kit import io as kio
from kit import methods
from kit.config.paths import outputs_root
from kit.train.progress import epoch_number        # frames count epochs from 0, axes from 1
from kit.results.figures.figure_data import (COST_METHODS, GAMMA_METHODS, LABEL_METHODS,
                                             cost_curves, gamma_baseline, gamma_points,
                                             label_quality, method_label, method_order,
                                             seeds_text, single)
from kit.results.frame.collect import collect_runs, finished
from kit.results.figures.model_scores import PAPER_SENTENCES, case_study_data
from kit.results.figures.token_view import find_run

# Colours and markers from the method registry; markers as well as colours: methods stay apart
# in greyscale print and for colour-blind readers.
_COLORS = {name: methods.get(name).color for name in methods.names(multitask=False)}
_MARKERS = {name: methods.get(name).marker for name in methods.names(multitask=False)}


def _color(method: str, i: int = 0) -> str:
    return _COLORS.get(method, f"C{(i + 4) % 10}")


def _marker(method: str, i: int = 0) -> str:
    return _MARKERS.get(method, "vP*Xh"[i % 5])


def figure_name(kind: str, profile: str | None = None, task: str | None = None) -> str:
    """A figure's default file stem: `<kind>[-<profile>][-<task>]` (a YAML path's stem), so
    figures of different profiles do not overwrite each other."""
    stem = Path(profile).stem if profile else ""
    return "-".join(str(part).replace("/", "_") for part in (kind, stem, task) if part)


def save_figure(fig, outputs_dir: str | os.PathLike = "outputs", name: str = "",
                kind: str = "figure", profile: str | None = None, task: str | None = None
                ) -> Path:
    """Write `fig` to `<outputs_dir>/figures/<name>.png` atomically (tmp file + rename);
    without a `name`, `figure_name(kind, profile, task)`. Returns the path (the outputs folder
    by kit.config.paths.outputs_root: the project's, from notebooks/ too)."""
    path = outputs_root(outputs_dir) / "figures" / f"{name or figure_name(kind, profile, task)}.png"
    with kio.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=150, bbox_inches="tight")
    return path


def _axes(ax, figsize):
    import matplotlib.pyplot as plt
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax
    return ax.figure, ax


# ---------------------------------------------------------------- Fig. 7: gamma sensitivity

def plot_gamma(points: pd.DataFrame, baseline: dict | None = None, ax=None,
               title: str | None = None, dodge: float = 0.012):
    """Fig. 7: dev metric against gamma, one line per method with error bars (std over seeds),
    the baseline as a horizontal line with a mean ± std band. Methods are shifted sideways by
    `dodge` x the gamma range so equal values stay visible."""
    fig, ax = _axes(ax, (6, 4))
    groups = list(points.groupby("label", sort=False))
    span = float(points["gamma"].max() - points["gamma"].min()) or 1.0
    for i, (label, rows) in enumerate(groups):
        method, capped = rows["method"].iloc[0], rows.get("budget", pd.Series([""])).iloc[0]
        capped = capped not in ("", "epochs")          # equal steps: dotted, open markers
        n = ", ".join(sorted({str(int(v)) for v in rows["n"]}))
        shift = dodge * span * (i - (len(groups) - 1) / 2)    # keep error bars apart
        ax.errorbar(rows["gamma"] + shift, rows["mean"], yerr=rows["std"].fillna(0),
                    marker=_marker(method, i), capsize=3, color=_color(method, i),
                    linestyle=":" if capped else "-",
                    markerfacecolor="white" if capped else None, label=f"{label} (n={n})")
    if baseline is not None:
        ax.axhline(baseline["mean"], color=_color(baseline["method"]), linestyle="--",
                   label=f"{baseline['label']} (n={baseline['n']})")
        if np.isfinite(baseline["std"]):
            ax.axhspan(baseline["mean"] - baseline["std"], baseline["mean"] + baseline["std"],
                       color=_color(baseline["method"]), alpha=0.15, linewidth=0)
    gammas = sorted(points["gamma"].unique())
    ax.set_xticks(gammas)
    ax.set_xlabel("γ (masked variants per kept sentence per epoch)")
    metric, scale = points["metric"].iloc[0], points["scale"].iloc[0]
    ax.set_ylabel(f"dev {metric}" + (" (x100)" if scale == 100 else ""))
    seeds = f", {points['seeds'].iloc[0]}" if "seeds" in points else ""
    ax.set_title(title or f"{points['task'].iloc[0]}, {points['model'].iloc[0]}{seeds}: "
                 f"sensitivity to γ (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def gamma_figure(outputs_dir: str | os.PathLike = "outputs", profile: str | None = "gamma",
                 task: str | None = None, model: str | None = None, metric: str = "score",
                 methods: Sequence[str] = GAMMA_METHODS, baseline: str = "bert"):
    """Fig. 7 in one call: collect a profile's runs (one task and model), then plot_gamma."""
    runs = collect_runs(outputs_dir, profile, task=task or None, model=model or None)
    return plot_gamma(gamma_points(runs, metric, methods), gamma_baseline(runs, metric, baseline))


# ---------------------------------------------------------------- Fig. 6: training cost

def plot_cost(curves: pd.DataFrame, ax=None, title: str | None = None):
    """Fig. 6: log10 training loss against wall-clock seconds, one line per run (seeds of a
    method share its colour)."""
    fig, ax = _axes(ax, (6.5, 4))
    for i, method in enumerate(method_order(curves["method"].unique())):
        rows = curves[curves["method"] == method]
        for j, (seed, run) in enumerate(rows.groupby("seed")):
            ax.plot(run["wall_s"], run["log10_loss"], color=_color(method, i),
                    marker=_marker(method, i), markevery=max(len(run) // 8, 1), markersize=4,
                    alpha=0.9 if j == 0 else 0.45, linewidth=1.3,
                    label=method_label(method) + (f" ({rows['seed'].nunique()} seeds)"
                                            if rows["seed"].nunique() > 1 else "")
                    if j == 0 else None)
    ax.set_xlabel("wall-clock time (s)")
    names = {"loss_target": "target-task loss L_target", "loss": "training objective"}
    name = curves["loss_name"].iloc[0] if "loss_name" in curves else "loss"
    ax.set_ylabel(f"log10 {names.get(name, name)}")
    where = ", ".join(str(curves[c].iloc[0]) for c in ("task", "model") if c in curves)
    ax.set_title(title or f"Training cost on {where}, {seeds_text(curves)}: loss against time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def cost_figure(outputs_dir: str | os.PathLike = "outputs", profile: str | None = None,
                task: str | None = None, model: str | None = None,
                methods: Sequence[str] = COST_METHODS, loss: str = "loss_target",
                seeds: Sequence[int] | None = None):
    """Fig. 6 in one call: collect a profile's runs (one task), then plot_cost."""
    runs = collect_runs(outputs_dir, profile, task=task or None, model=model or None)
    return plot_cost(cost_curves(runs, methods, loss, seeds))


# ---------------------------------------------------------------- SSA label quality

def plot_label_quality(frame: pd.DataFrame, ax=None, title: str | None = None):
    """Share of label 1 on cue tokens (solid) and on distractors (dashed) per epoch, per SSA
    method, mean ± std over seeds. Good labels: cue share high, distractor share low."""
    fig, ax = _axes(ax, (6, 4))
    for i, method in enumerate(method_order(frame["method"].unique())):
        rows = frame[frame["method"] == method]
        seeds = rows["seed"].nunique()
        # cue and distractor points of one method share its colour: filled vs open markers
        for column, style, face, what in (("cue_share_label1", "-", None, "cue tokens"),
                                          ("distractor_share_label1", "--", "white",
                                           "distractors")):
            stats = rows.groupby("epoch")[column].agg(["mean", "std"]).reset_index()
            ax.errorbar(epoch_number(stats["epoch"]), stats["mean"], yerr=stats["std"].fillna(0),
                        linestyle=style, marker=_marker(method, i), markerfacecolor=face,
                        capsize=3, color=_color(method, i),
                        label=f"{method_label(method)}: {what} (n={seeds})")
    ax.set_xticks(sorted(epoch_number(frame["epoch"].unique())))
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("epoch (labels generated with the model after the previous epoch)")
    ax.set_ylabel("share of SSA label 1")
    where = ", ".join(sorted(map(str, frame["task"].unique())))
    if "model" in frame:
        where += ", " + ", ".join(sorted(map(str, frame["model"].dropna().unique())))
    ax.set_title(title or f"SSA label quality on {where}, {seeds_text(frame)}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def label_quality_figure(outputs_dir: str | os.PathLike = "outputs",
                         profile: str | None = None, task: str | None = "synthetic",
                         model: str | None = None, methods: Sequence[str] = LABEL_METHODS):
    """SSA label quality in one call: collect a profile's runs, then plot_label_quality."""
    runs = collect_runs(outputs_dir, profile, task=task or None, model=model or None)
    return plot_label_quality(label_quality(runs, methods))


def plot_mechanism(scores: pd.DataFrame, labels: pd.DataFrame, title: str | None = None):
    """The SSA mechanism benchmark (params/mechanism.yaml) in two panels. Left: dev accuracy per
    method, one dot per seed, mean ± std bar (`scores`: method, seed, score as a fraction; any
    method name, e.g. a guided BERT-r relabelled "bert+guide"). Right: the SSA labels against
    the true importance mask per probed epoch, mean ± std over seeds (`labels`: method, epoch,
    label1_precision, label1_recall, from metrics.json `ssa_labels`; optional
    shortcut_share_label1, the share of label 1 on a spurious word): does the head learn the
    cue, or the shortcut the model already uses?"""
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    methods = method_order(scores["method"].unique())
    for i, method in enumerate(methods):
        values = scores.loc[scores["method"] == method, "score"].to_numpy(float) * 100
        jitter = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else np.zeros(1)
        left.scatter(i + jitter, values, s=14, alpha=0.6, color=_color(method, i),
                     marker=_marker(method, i))
        left.errorbar(i + 0.3, values.mean(), yerr=values.std(ddof=1) if len(values) > 1 else 0,
                      fmt="_", markersize=14, capsize=4, color="black")
    left.set_xticks(range(len(methods)), [method_label(m) for m in methods],
                    rotation=20, ha="right")
    left.set_ylabel("dev accuracy (%)")
    left.set_title(f"dev accuracy, {seeds_text(scores)}")
    left.grid(alpha=0.3, axis="y")
    if labels.empty:            # runs without saved labels (save_labels: false): say so
        right.text(0.5, 0.5, "no saved SSA labels in these runs\n(save_labels: true saves them)",
                   ha="center", va="center", transform=right.transAxes)
    for i, method in enumerate(method_order(labels["method"].unique())):
        rows = labels[labels["method"] == method]
        for column, style, what in (("label1_precision", "-", "precision"),
                                    ("label1_recall", "--", "recall"),
                                    ("shortcut_share_label1", ":", "label 1 on the shortcut")):
            if column not in rows:
                continue
            stats = rows.groupby("epoch")[column].agg(["mean", "std"]).reset_index()
            right.errorbar(epoch_number(stats["epoch"]), stats["mean"],
                           yerr=stats["std"].fillna(0),
                           linestyle=style, marker=_marker(method, i), capsize=3,
                           color=_color(method, i), label=f"{method_label(method)}: {what}")
    right.set_xticks(sorted(epoch_number(labels["epoch"].unique())))
    right.set_ylim(-0.03, 1.03)
    right.set_xlabel("epoch (labels from the model after the previous epoch)")
    right.set_ylabel("share")
    right.set_title("label precision / recall against the importance mask")
    right.grid(alpha=0.3)
    if not labels.empty:
        right.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- Fig. 8: case study

CASE_ROWS = (("vanilla_attention", "{vanilla}: [CLS] attention"),
             ("ssa_attention", "{ssa}: [CLS] attention"),
             ("ssa_weight", "{ssa}: hybrid weight w_i"),
             ("ssa_p_important", "{ssa}: P(important)"))


def plot_case_study(data: pd.DataFrame, vanilla: str = "bert", ssa: str = "ssa-h"):
    """Fig. 8: per sentence, a heatmap over its word-pieces of the vanilla model's and the SSA
    model's last-layer [CLS] attention (mean over heads) and the SSA scores (hybrid weights,
    P(important)); both models' predictions in the title. Colours are scaled per row (each
    row's maximum is full colour); the cells print the actual values."""
    import matplotlib.pyplot as plt
    vanilla_label, ssa_label = method_label(vanilla), method_label(ssa)
    sentences = list(data.groupby("sentence_id", sort=True))
    width = max(6.0, 0.75 * max(len(rows) for _, rows in sentences) + 2.5)
    fig, axes = plt.subplots(len(sentences), 1, figsize=(width, 2.6 * len(sentences)),
                             squeeze=False)
    for ax, (_, rows) in zip(axes[:, 0], sentences):
        present = [(c, t) for c, t in CASE_ROWS if rows[c].notna().any()]
        matrix = np.array([rows[c].to_numpy(dtype=float) for c, _ in present])
        peak = np.nanmax(np.abs(matrix), axis=1, keepdims=True)
        ax.imshow(np.nan_to_num(matrix / np.where(peak > 0, peak, 1)), cmap="Reds", vmin=0,
                  vmax=1, aspect="auto")
        for (r, c), value in np.ndenumerate(matrix):
            ax.text(c, r, "" if np.isnan(value) else f"{value:.2f}", ha="center", va="center",
                    fontsize=7, color="white" if value / max(peak[r, 0], 1e-12) > 0.6 else "black")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(rows["token"], rotation=40, ha="right", fontsize=8)
        ax.set_yticks(range(len(present)))
        ax.set_yticklabels([t.format(vanilla=vanilla_label, ssa=ssa_label) for _, t in present],
                           fontsize=8)
        first = rows.iloc[0]

        def said(prefix: str) -> str:
            conf = first[f"{prefix}_confidence"]
            return first[f"{prefix}_prediction"] + ("" if np.isnan(conf) else f" ({conf:.2f})")

        ax.set_title(f"“{first['sentence']}”\n{vanilla_label}: {said('vanilla')}   |   "
                     f"{ssa_label}: {said('ssa')}", fontsize=9)
    if {"task", "model", "vanilla_seed", "ssa_seed"} <= set(data.columns):
        first = data.iloc[0]
        fig.suptitle(f"{first['task']}, {first['model']}: {vanilla_label} (seed "
                     f"{first['vanilla_seed']}) vs {ssa_label} (seed {first['ssa_seed']})",
                     fontsize=10)
    fig.tight_layout()
    return fig


def case_study_figure(outputs_dir: str | os.PathLike = "outputs", profile: str | None = None,
                      task: str | None = None, model: str | None = None,
                      sentences: Sequence[str] = PAPER_SENTENCES, seed: int | None = 0,
                      vanilla: str = "bert", ssa: str = "ssa-h"):
    """Fig. 8 in one call: the best checkpoints of a profile's `vanilla` and `ssa` runs of one
    task and seed, then plot_case_study."""
    runs = collect_runs(outputs_dir, profile, task=task or None, model=model or None)
    single(finished(runs, [vanilla, ssa]), "task", "case study")
    data = case_study_data(find_run(runs, vanilla, seed), find_run(runs, ssa, seed), sentences)
    return plot_case_study(data, vanilla, ssa)
