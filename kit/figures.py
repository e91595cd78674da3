"""The SSA paper's figures from run folders: gamma sensitivity (Fig. 7), training cost (Fig. 6),
the case study (Fig. 8), and SSA label quality on the synthetic task.

Each figure is a data function (a tidy DataFrame built from outputs/: the runs' config.json,
metrics.json and history.csv, collected with `kit.report.collect_runs`), a plot function
(matplotlib, from that frame only) and `save_figure` (outputs/figures/<name>.png, written
atomically). Only the case study reads more than numbers: it loads the runs' best checkpoints
(torch is imported there and nowhere else in this module).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kit import io as kio
from kit import methods
from kit import runs
from kit.report import METHOD_LABELS, collect_runs, score_scale

GAMMA_METHODS = ("bert-mask", "ssa-co", "ssa-h")
COST_METHODS = ("bert", "bert-mask", "ssa-h")
LABEL_METHODS = ("ssa-co", "ssa-h")
# The paper's two SST-2 case-study sentences (section 4.7), spelled as printed.
PAPER_SENTENCES = ("a whole lot foul, freaky and funny.",
                   "in its ragged, cheaps and unassuming way, the movie works.")
# Readable names for GLUE's numeric labels in figure titles.
DISPLAY_LABELS = {"SST-2": {"0": "negative", "1": "positive"},
                  "CoLA": {"0": "unacceptable", "1": "acceptable"}}
# Colours and markers from the method registry; markers as well as colours: methods stay apart
# in greyscale print and for colour-blind readers.
_COLORS = {name: methods.get(name).color for name in methods.names(multitask=False)}
_MARKERS = {name: methods.get(name).marker for name in methods.names(multitask=False)}


def _label(method: str) -> str:
    return METHOD_LABELS.get(method, str(method))


def _color(method: str, i: int = 0) -> str:
    return _COLORS.get(method, f"C{(i + 4) % 10}")


def _marker(method: str, i: int = 0) -> str:
    return _MARKERS.get(method, "vP*Xh"[i % 5])


def _seeds(runs: pd.DataFrame) -> str:
    """The seeds of a figure's runs for its title: "seeds 0-2", "seeds 0, 2, 5", "seed 1"."""
    seeds = sorted({int(s) for s in runs["seed"].dropna()})
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def _method_order(methods) -> list:
    order = list(METHOD_LABELS)
    return sorted(methods, key=lambda m: (order.index(m) if m in order else len(order), str(m)))


def _ok(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "ok"] if len(runs) else runs


def _single(runs: pd.DataFrame, column: str, what: str) -> str:
    """The one value of `column` in `runs` (a figure shows one task, one model)."""
    values = sorted(map(str, runs[column].dropna().unique()))
    if len(values) != 1:
        raise ValueError(f"{what}: expected runs of one {column}, got "
                         f"{', '.join(values) if values else 'no runs'}; pick one with the "
                         f"{column} parameter")
    return values[0]


def _one_per_seed(runs: pd.DataFrame, keys: Sequence[str], what: str) -> None:
    dup = runs.duplicated([*keys, "seed"], keep=False)
    if dup.any():
        first = runs[dup].iloc[0]
        raise ValueError(f"{what}: several finished runs for "
                         + ", ".join(f"{k}={first[k]}" for k in [*keys, "seed"])
                         + " (other hyper-parameters vary): filter the runs to one configuration")


def figure_name(kind: str, profile: str | None = None, task: str | None = None) -> str:
    """A figure's default file stem: `<kind>[-<profile>][-<task>]` (a YAML path's stem), so
    figures of different profiles do not overwrite each other."""
    stem = Path(profile).stem if profile else ""
    return "-".join(str(part).replace("/", "_") for part in (kind, stem, task) if part)


def save_figure(fig, outputs_dir: str | os.PathLike = "outputs", name: str = "",
                kind: str = "figure", profile: str | None = None, task: str | None = None
                ) -> Path:
    """Write `fig` to `<outputs_dir>/figures/<name>.png` atomically (tmp file + rename);
    without a `name`, `figure_name(kind, profile, task)`. Returns the path."""
    path = Path(outputs_dir) / "figures" / f"{name or figure_name(kind, profile, task)}.png"
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

def gamma_points(runs: pd.DataFrame, metric: str = "score",
                 methods: Sequence[str] = GAMMA_METHODS) -> pd.DataFrame:
    """Dev `metric` (best epoch, full dev set) per method x budget x gamma over the seeds of the
    finished runs: columns task, model, method, label, budget, gamma, mean, std (sample std;
    NaN with one seed), n, seeds, scale (the values are x100 where the task is shown x100). Runs
    of `budget: equal_steps` (BERT-mask at BERT-r's optimizer steps) are their own line,
    labelled "(equal steps)". One task and model; one configuration per line x gamma x seed."""
    ok = _ok(runs)
    ok = ok[ok["method"].isin(methods)] if len(ok) else ok
    if ok.empty:
        raise ValueError(f"gamma figure: no finished runs of {', '.join(methods)}")
    task, model = _single(ok, "task", "gamma figure"), _single(ok, "model", "gamma figure")
    if metric not in ok.columns:
        raise ValueError(f"gamma figure: no metric {metric!r} in the runs of {task}")
    ok = ok.assign(budget=ok["budget"].fillna("epochs") if "budget" in ok else "epochs")
    _one_per_seed(ok, ["method", "budget", "gamma"], "gamma figure")
    scale = score_scale(task, ok)
    stats = (ok.groupby(["method", "budget", "gamma"])[metric].agg(["mean", "std", "count"])
             .reset_index().rename(columns={"count": "n"}))
    stats["seeds"] = _seeds(ok)
    stats[["mean", "std"]] *= scale
    stats.insert(0, "model", model)
    stats.insert(0, "task", task)
    stats.insert(3, "label", stats["method"].map(_label) + stats["budget"].map(
        lambda b: "" if b == "epochs" else f" ({b.replace('_', ' ')})"))
    stats["scale"], stats["metric"] = scale, metric
    order = {m: i for i, m in enumerate(_method_order(stats["method"].unique()))}
    return (stats.assign(_o=stats["method"].map(order)).sort_values(["_o", "budget", "gamma"])
            .drop(columns="_o").reset_index(drop=True))


def gamma_baseline(runs: pd.DataFrame, metric: str = "score", baseline: str = "bert"
                   ) -> dict | None:
    """The baseline's dev `metric` over seeds as {method, label, mean, std, n} (scaled like
    `gamma_points`), or None without baseline runs. The baseline ignores gamma: runs of one seed
    that differ only in gamma (a grid that crosses every method with gamma) are one sample,
    their mean."""
    ok = _ok(runs)
    ok = ok[ok["method"] == baseline] if len(ok) else ok
    if ok.empty or metric not in ok.columns:
        return None
    task = _single(ok, "task", "gamma baseline")
    per_seed = ok.groupby("seed")[metric].mean() * score_scale(task, ok)
    return {"method": baseline, "label": _label(baseline), "mean": float(per_seed.mean()),
            "std": float(per_seed.std()) if len(per_seed) > 1 else float("nan"),
            "n": int(len(per_seed))}


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

def load_history(run_dir: str | os.PathLike) -> pd.DataFrame:
    """A run's history.csv (one row per logging window: step, epoch, wall_s, loss terms, lr)."""
    path = Path(run_dir) / "history.csv"
    history = runs.read_history(run_dir)
    if history is None:
        raise ValueError(f"{path} not found: the run logged no training step")
    missing = {"step", "wall_s", "loss"} - set(history.columns)
    if missing:
        raise ValueError(f"{path}: no column(s) {', '.join(sorted(missing))}")
    return history


def cost_curves(runs: pd.DataFrame, methods: Sequence[str] = COST_METHODS,
                loss: str = "loss_target", seeds: Sequence[int] | None = None) -> pd.DataFrame:
    """Training loss against wall-clock time, one row per logged window of each finished run of
    `methods` at the default budget (epochs; equal_steps runs are left out): run_id, task, model, method, label, seed, step, epoch, wall_s, loss, log10_loss,
    loss_name.

    `loss` is a history.csv column: "loss_target" (default) is the target task's loss, the
    number that compares across methods ("loss" for methods without auxiliary terms); "loss" is
    the training objective (for SSA alpha * L_target + (1 - alpha) * L_SSA, as the paper plots
    it, and alpha * L_target alone before SSA starts); "loss_ssa" is NaN before
    ssa_start_epoch, where it was not computed (no zero line). wall_s counts from the start of
    training, label generation and evaluation included (the SSA delays in Fig. 6).
    log10_loss is NaN where the loss is not positive."""
    ok = _ok(runs)
    ok = ok[ok["method"].isin(methods)] if len(ok) else ok
    if "budget" in ok:                  # the runs as the paper trains them (not equal_steps)
        ok = ok[ok["budget"].fillna("epochs") == "epochs"]
    if seeds and len(ok):
        ok = ok[ok["seed"].isin(list(seeds))]
    if ok.empty:
        raise ValueError(f"cost figure: no finished runs of {', '.join(methods)}")
    _single(ok, "task", "cost figure")
    _one_per_seed(ok, ["method"], "cost figure")
    frames = []
    for _, run in ok.iterrows():
        history = load_history(run["run_dir"])
        column = loss if loss in history.columns else "loss"
        if loss not in history.columns and loss != "loss_target":
            raise ValueError(f"{run['run_dir']}/history.csv: no column {loss!r}")
        values = history[column].astype(float)
        if column == "loss_ssa" and "epoch" in history:   # logged before SSA started: no term
            start = run.get("ssa_start_epoch", 1)
            values = values.where(history["epoch"] > (1 if pd.isna(start) else start))
        frames.append(pd.DataFrame({
            "run_id": run["run_id"], "task": run["task"], "model": run.get("model"),
            "method": run["method"], "label": _label(run["method"]),
            "seed": run["seed"], "step": history["step"],
            "epoch": history["epoch"] if "epoch" in history else np.nan,
            "wall_s": history["wall_s"].astype(float), "loss": values,
            "log10_loss": np.log10(values.where(values > 0)), "loss_name": loss}))
    return pd.concat(frames, ignore_index=True)


def cost_summary(runs: pd.DataFrame, methods: Sequence[str] = COST_METHODS) -> pd.DataFrame:
    """Per finished run of `methods`: wall seconds in total, training, SSA label generation and
    evaluation, the best dev score, the last logged target-task loss (train_loss_target: the
    loss that compares across methods) and the label generation share of the total."""
    ok = _ok(runs)
    ok = ok[ok["method"].isin(methods)] if len(ok) else ok
    columns = ["wall_total_s", "wall_train_s", "wall_label_generation_s", "wall_eval_s",
               "score", "train_loss_target"]
    table = ok[["method", "seed", *[c for c in columns if c in ok.columns]]].copy()
    if {"wall_total_s", "wall_label_generation_s"} <= set(table.columns):
        table["label_generation_share"] = (table["wall_label_generation_s"]
                                           / table["wall_total_s"]).round(3)
    order = {m: i for i, m in enumerate(_method_order(table["method"].unique()))}
    return (table.assign(_o=table["method"].map(order)).sort_values(["_o", "seed"])
            .drop(columns="_o").reset_index(drop=True))


def plot_cost(curves: pd.DataFrame, ax=None, title: str | None = None):
    """Fig. 6: log10 training loss against wall-clock seconds, one line per run (seeds of a
    method share its colour)."""
    fig, ax = _axes(ax, (6.5, 4))
    for i, method in enumerate(_method_order(curves["method"].unique())):
        rows = curves[curves["method"] == method]
        for j, (seed, run) in enumerate(rows.groupby("seed")):
            ax.plot(run["wall_s"], run["log10_loss"], color=_color(method, i),
                    marker=_marker(method, i), markevery=max(len(run) // 8, 1), markersize=4,
                    alpha=0.9 if j == 0 else 0.45, linewidth=1.3,
                    label=_label(method) + (f" ({rows['seed'].nunique()} seeds)"
                                            if rows["seed"].nunique() > 1 else "")
                    if j == 0 else None)
    ax.set_xlabel("wall-clock time (s)")
    names = {"loss_target": "target-task loss L_target", "loss": "training objective"}
    name = curves["loss_name"].iloc[0] if "loss_name" in curves else "loss"
    ax.set_ylabel(f"log10 {names.get(name, name)}")
    where = ", ".join(str(curves[c].iloc[0]) for c in ("task", "model") if c in curves)
    ax.set_title(title or f"Training cost on {where}, {_seeds(curves)}: loss against time")
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

def _read_metrics(run_dir: str | os.PathLike) -> dict:
    metrics = runs.read_metrics(run_dir)
    if metrics is None:
        raise ValueError(f"{Path(run_dir) / 'metrics.json'}: not found (the run has not ended)")
    return metrics


def label_quality(runs: pd.DataFrame, methods: Sequence[str] = LABEL_METHODS) -> pd.DataFrame:
    """Per finished SSA run and labelled epoch (metrics.json `ssa_labels`): the share of label 1
    on the true cue tokens and on distractor tokens (synthetic tasks only: their token
    importance is known), with the epoch's probing counts. Columns: run_id, task, method,
    label, seed, epoch, cue_share_label1, distractor_share_label1, share_label1, flip_rate,
    probed, kept, variants, labelled_tokens. Epochs without cue statistics are left out."""
    ok = _ok(runs)
    ok = ok[ok["method"].isin(methods)] if len(ok) else ok
    keep = ["cue_share_label1", "distractor_share_label1", "share_label1", "flip_rate",
            "probed", "kept", "variants", "labelled_tokens"]
    rows = []
    for _, run in ok.iterrows():
        for stats in _read_metrics(run["run_dir"]).get("ssa_labels") or []:
            if stats.get("cue_share_label1") is None and stats.get(
                    "distractor_share_label1") is None:
                continue
            rows.append({"run_id": run["run_id"], "task": run["task"], "model": run.get("model"),
                         "method": run["method"],
                         "label": _label(run["method"]), "seed": run["seed"],
                         "epoch": stats["epoch"], **{k: stats.get(k) for k in keep}})
    if not rows:
        raise ValueError("label quality: no SSA label statistics with cue/distractor shares; "
                         "they exist for ssa-co / ssa-h runs on the synthetic tasks, from "
                         "epoch ssa_start_epoch on (so epochs >= 2)")
    frame = pd.DataFrame(rows)
    frame[keep[:4]] = frame[keep[:4]].astype(float)
    return frame


def plot_label_quality(frame: pd.DataFrame, ax=None, title: str | None = None):
    """Share of label 1 on cue tokens (solid) and on distractors (dashed) per epoch, per SSA
    method, mean ± std over seeds. Good labels: cue share high, distractor share low."""
    fig, ax = _axes(ax, (6, 4))
    for i, method in enumerate(_method_order(frame["method"].unique())):
        rows = frame[frame["method"] == method]
        seeds = rows["seed"].nunique()
        # cue and distractor points of one method share its colour: filled vs open markers
        for column, style, face, what in (("cue_share_label1", "-", None, "cue tokens"),
                                          ("distractor_share_label1", "--", "white",
                                           "distractors")):
            stats = rows.groupby("epoch")[column].agg(["mean", "std"]).reset_index()
            ax.errorbar(stats["epoch"], stats["mean"], yerr=stats["std"].fillna(0),
                        linestyle=style, marker=_marker(method, i), markerfacecolor=face,
                        capsize=3, color=_color(method, i),
                        label=f"{_label(method)}: {what} (n={seeds})")
    ax.set_xticks(sorted(frame["epoch"].unique()))
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("epoch (labels generated with the model after the previous epoch)")
    ax.set_ylabel("share of SSA label 1")
    where = ", ".join(sorted(map(str, frame["task"].unique())))
    if "model" in frame:
        where += ", " + ", ".join(sorted(map(str, frame["model"].dropna().unique())))
    ax.set_title(title or f"SSA label quality on {where}, {_seeds(frame)}")
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
    methods = _method_order(scores["method"].unique())
    for i, method in enumerate(methods):
        values = scores.loc[scores["method"] == method, "score"].to_numpy(float) * 100
        jitter = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else np.zeros(1)
        left.scatter(i + jitter, values, s=14, alpha=0.6, color=_color(method, i),
                     marker=_marker(method, i))
        left.errorbar(i + 0.3, values.mean(), yerr=values.std(ddof=1) if len(values) > 1 else 0,
                      fmt="_", markersize=14, capsize=4, color="black")
    left.set_xticks(range(len(methods)), [METHOD_LABELS.get(m, m) for m in methods],
                    rotation=20, ha="right")
    left.set_ylabel("dev accuracy (%)")
    left.set_title(f"dev accuracy, {_seeds(scores)}")
    left.grid(alpha=0.3, axis="y")
    for i, method in enumerate(_method_order(labels["method"].unique())):
        rows = labels[labels["method"] == method]
        for column, style, what in (("label1_precision", "-", "precision"),
                                    ("label1_recall", "--", "recall"),
                                    ("shortcut_share_label1", ":", "label 1 on the shortcut")):
            if column not in rows:
                continue
            stats = rows.groupby("epoch")[column].agg(["mean", "std"]).reset_index()
            right.errorbar(stats["epoch"], stats["mean"], yerr=stats["std"].fillna(0),
                           linestyle=style, marker=_marker(method, i), capsize=3,
                           color=_color(method, i), label=f"{_label(method)}: {what}")
    right.set_xticks(sorted(labels["epoch"].unique()))
    right.set_ylim(-0.03, 1.03)
    right.set_xlabel("epoch (labels from the model after the previous epoch)")
    right.set_ylabel("share")
    right.set_title("label precision / recall against the importance mask")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- Fig. 8: case study

def find_run(runs: pd.DataFrame, method: str, seed: int | None = None) -> Path:
    """The folder of a finished run of `method` (and `seed`) that kept its best checkpoint;
    the one with the highest dev score when several qualify."""
    ok = _ok(runs)
    ok = ok[ok["method"] == method] if len(ok) else ok
    if seed is not None and len(ok):
        ok = ok[ok["seed"] == seed]
    with_ckpt = ok[[(Path(d) / "checkpoint" / "best" / "head_spec.json").exists()
                    for d in ok["run_dir"]]] if len(ok) else ok
    if with_ckpt.empty:
        why = ("none kept checkpoint/best: rerun with save_checkpoints: true" if len(ok)
               else "no finished run")
        raise ValueError(f"case study: {why} (method {method}"
                         + (f", seed {seed}" if seed is not None else "") + ")")
    return Path(with_ckpt.sort_values("score", ascending=False)["run_dir"].iloc[0])


def _display_label(task: str, label: str) -> str:
    return DISPLAY_LABELS.get(task, {}).get(label, label)


def token_scores(run_dir: str | os.PathLike, sentences: Sequence[str | Sequence[str]],
                 max_length: int = 128) -> pd.DataFrame:
    """Per sentence and real word-piece ([CLS]/[SEP]/padding left out), from a run's best
    checkpoint: `attention`, the last layer's attention from [CLS] averaged over heads and
    renormalised over the shown word-pieces (`attention_raw` before that); for SSA runs the
    token head's `p_important` = P(label 1), and for ssa-h the hybrid layer's `weight` w_i
    (NaN otherwise); the sentence's `prediction` (label name; the value for regression) and
    `confidence` (its probability). A sentence is a string, or a pair [a, b] for pair tasks."""
    import torch
    from kit.models import load_trained
    from kit.tasks import get_task
    run_dir = Path(run_dir)
    config = runs.read_config(run_dir) or {}
    task = get_task(config["task"]) if config.get("task", "csv") != "csv" else None
    model, tokenizer = load_trained(run_dir / "checkpoint" / "best", eager_attention=True)
    rows = []
    for sid, sentence in enumerate(sentences):
        pair = [sentence] if isinstance(sentence, str) else list(sentence)
        enc = tokenizer(*pair, return_tensors="pt", truncation=True, max_length=max_length,
                        return_special_tokens_mask=True)
        special = enc["special_tokens_mask"].bool()
        with torch.inference_mode():
            out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                        special_mask=special, token_type_ids=enc.get("token_type_ids"),
                        output_attentions=True)
        real = (enc["attention_mask"].bool() & ~special)[0]
        cls_attention = out["attentions"][-1][0].float().mean(0)[0][real]
        attention = cls_attention / cls_attention.sum().clamp_min(1e-12)
        nan = torch.full_like(attention, float("nan"))
        p_important = (torch.softmax(out["token_logits"][0].float(), -1)[:, 1][real]
                       if out["token_logits"] is not None else nan)
        weight = out["token_weights"][0].float()[real] if out["token_weights"] is not None else nan
        logits = out["logits"][0].float()
        if task is None or task.regression:
            prediction, confidence = f"{logits[0].item():.2f}", float("nan")
        else:
            probs = torch.softmax(logits, -1)
            k = int(probs.argmax())
            prediction = _display_label(task.name, task.labels[k])
            confidence = float(probs[k])
        tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0][real].tolist())
        text = sentence if isinstance(sentence, str) else " ||| ".join(sentence)
        for position, token in enumerate(tokens):
            rows.append({"sentence_id": sid, "sentence": text, "position": position,
                         "token": token.replace("Ġ", "").replace("▁", ""),
                         "attention": float(attention[position]),
                         "attention_raw": float(cls_attention[position]),
                         "weight": float(weight[position]),
                         "p_important": float(p_important[position]),
                         "prediction": prediction, "confidence": confidence})
    return pd.DataFrame(rows)


def case_study_data(vanilla_dir: str | os.PathLike, ssa_dir: str | os.PathLike,
                    sentences: Sequence[str | Sequence[str]] = PAPER_SENTENCES,
                    max_length: int = 128) -> pd.DataFrame:
    """`token_scores` of a vanilla run and an SSA run side by side, one row per word-piece:
    sentence_id, sentence, position, token, vanilla_attention, ssa_attention, ssa_weight,
    ssa_p_important, vanilla_prediction, vanilla_confidence, ssa_prediction, ssa_confidence,
    then task, model, vanilla_seed, ssa_seed (from the runs' config.json, for the title).
    Both runs must share a tokenizer (the same backbone)."""
    vanilla = token_scores(vanilla_dir, sentences, max_length)
    ssa = token_scores(ssa_dir, sentences, max_length)
    keys = ["sentence_id", "sentence", "position", "token"]
    if not vanilla[keys].equals(ssa[keys]):
        raise ValueError("case study: the two runs tokenize differently (different backbones)")
    data = vanilla[keys].copy()
    for prefix, frame in (("vanilla", vanilla), ("ssa", ssa)):
        for column in ("attention", "weight", "p_important", "prediction", "confidence"):
            if prefix == "vanilla" and column in ("weight", "p_important"):
                continue
            data[f"{prefix}_{column}"] = frame[column].to_numpy()
    configs = [runs.read_config(d) or {} for d in (vanilla_dir, ssa_dir)]
    return data.assign(task=configs[0].get("task"), model=configs[0].get("model"),
                       vanilla_seed=configs[0].get("seed"), ssa_seed=configs[1].get("seed"))


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
    vanilla_label, ssa_label = _label(vanilla), _label(ssa)
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
    _single(_ok(runs[runs["method"].isin([vanilla, ssa])]), "task", "case study")
    data = case_study_data(find_run(runs, vanilla, seed), find_run(runs, ssa, seed), sentences)
    return plot_case_study(data, vanilla, ssa)
