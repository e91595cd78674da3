"""The SSA mechanism benchmark (params/mechanism.yaml, notebooks/mechanism.ipynb): its dev accuracy
table (last and held-out epoch, each method against BERT-r with Holm-corrected Welch and permutation
p), its SSA labels against the synthetic task's true importance mask (from the saved epoch sets of
`save_labels: true`, read through kit.runs), and the frames
kit.results.figures.plots.plot_mechanism draws. Works on `kit.results.frame.collect.collect_runs`
frames of one model x task.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from kit import methods, runs
from kit.results.tables import build
from kit.models.backbones import load_tokenizer
from kit.results.figures.figure_data import method_dtype
from kit.results.frame.collect import finished
from kit.results.frame.no_runs import NoRuns, run_command
from kit.data.synthetic import SPURIOUS
from kit.train.progress import epoch_number

VIEWS = ("last", "heldout")
TESTS = {"welch": "Welch", "permutation": "perm."}
LABEL_COLUMNS = {"label1_precision": "precision", "chance_precision": "chance",
                 "label1_recall": "recall", "distractor_share_label1": "distractors labelled 1",
                 "shortcut_share_label1": "shortcut labelled 1", "flip_rate": "flip rate"}
_STATS = ("label1_precision", "label1_recall", "distractor_share_label1", "flip_rate")


def _setting(df: pd.DataFrame, column: str, default) -> pd.Series:
    return df[column].fillna(default) if column in df.columns else pd.Series(default, df.index)


def benchmark_runs(df: pd.DataFrame) -> pd.DataFrame:
    """The OK runs, a guided run (guide_loss other than task) relabelled "<label> + guiding" and
    an equal-steps run (budget equal_steps) "<label> eq. steps": rows of their own against
    BERT-r. `row_rank`: registry order, an eq. steps row after its method, guided rows last."""
    ok = df[df["status"] == "ok"] if len(df) else df
    if ok.empty:            # (an empty frame's columns have no dtype to do arithmetic in)
        raise NoRuns("mechanism benchmark: no finished runs of this task here; "
                     f"`{run_command('mechanism')}` makes them (or set profile and task)")
    guided = _setting(ok, "guide_loss", "task") != "task"
    equal = _setting(ok, "budget", "epochs") == "equal_steps"
    label = ok["method"].map(build.METHOD_LABELS).fillna(ok["method"])
    order = {name: i for i, name in enumerate(build.METHOD_LABELS)}
    rank = ok["method"].map(order).fillna(len(order))
    return ok.assign(method=ok["method"].mask(equal, label + " eq. steps")
                     .mask(guided, label + " + guiding"),
                     row_rank=guided * 2 * (len(order) + 1) + rank * 2 + equal)


def _one_setting(bench: pd.DataFrame) -> tuple:
    settings = bench[["model", "task"]].drop_duplicates()
    if len(settings) != 1:
        raise ValueError(f"mechanism tables: one model x task at a time, got {len(settings)} "
                         f"({', '.join(map('/'.join, settings.astype(str).values))})")
    return tuple(settings.iloc[0])


def _view_cells(view: pd.DataFrame, name: str, baseline: str, scale: int) -> pd.DataFrame:
    """One epoch view's columns: mean ± std (x scale), diff and p_holm of each test."""
    stats = view[view["status"] == "ok"].groupby("method")["score"].agg(["mean", "std"]) * scale
    cells = pd.DataFrame({name: [build.mean_std(m, s, 1) for m, s in stats.to_numpy()]},
                         stats.index)
    for test, short in TESTS.items():
        found = build.comparisons(view, baseline, test).set_index("method")
        cells[f"{name} diff"] = found["diff"].map("{:+.1f}".format)
        cells[f"{name} p_holm {short}"] = found["p_holm"].map("{:.3f}".format) + found["mark"]
    return cells


def accuracy_table(df: pd.DataFrame, baseline: str = "bert") -> pd.DataFrame:
    """Per method row (`benchmark_runs`): n seeds, then per epoch view (last, heldout) the task
    score x100 as mean ± std over seeds, diff against `baseline` and the Holm-corrected p of
    Welch's t-test and of the permutation test; blank on the baseline's row."""
    bench = benchmark_runs(df)
    _, task = _one_setting(bench)
    scale = build.score_scale(task, bench)
    cells = [_view_cells(build.epoch_view(bench, v), v, baseline, scale) for v in VIEWS]
    rows = bench.groupby("method").agg(n=("seed", "size"), rank=("row_rank", "first"))
    out = (pd.concat([rows, *cells], axis=1).sort_values(["rank"], kind="stable")
           .drop(columns="rank").fillna("").rename_axis("method").reset_index())
    out["method"] = out["method"].map(lambda m: build.METHOD_LABELS.get(m, m))
    n_tests = int((out["last diff"] != "").sum())
    out.attrs["caption"] = (
        f"Dev {task} score x{scale}, mean ± std over seeds. last: {build.EPOCH_VIEWS['last']}; "
        f"heldout: {build.EPOCH_VIEWS['heldout']}. diff against "
        f"{build.METHOD_LABELS.get(baseline, baseline)}; p_holm: two-sided Welch t-test / "
        f"permutation test, Holm-Bonferroni-corrected across the {n_tests} comparisons of each "
        f"view and test (* < 0.05, ** < 0.01, gains only). Guided runs (guide_loss) and "
        f"equal-steps runs (budget: equal_steps) are rows of their own.")
    return out


def shortcut_token_id(model: str) -> int:
    """The id of the shortcut word (kit.data.synthetic.SPURIOUS) in `model`'s vocabulary; it must be
    one word-piece, or the labels on it cannot be counted per token."""
    tokenizer = load_tokenizer(model)
    if tokenizer.tokenize(SPURIOUS) != [SPURIOUS]:
        raise ValueError(f"{model}: {SPURIOUS!r} is not one word-piece "
                         f"({tokenizer.tokenize(SPURIOUS)})")
    return tokenizer.convert_tokens_to_ids(SPURIOUS)


def _share(hits: np.ndarray) -> float:
    return float(hits.mean()) if hits.size else np.nan


def epoch_quality(epoch_set: dict, stats: dict, shortcut_id: int) -> dict:
    """One saved SSA epoch: its label statistics (`_STATS`), chance_precision (the share of cue
    tokens among the labelled ones: the precision of labelling at random) and
    shortcut_share_label1 (the share of label 1 on the labelled shortcut-word tokens)."""
    ids, labels, importance = (np.concatenate(epoch_set[key])
                               for key in ("input_ids", "ssa_labels", "importance"))
    labelled = labels >= 0                    # 1 or 0; IGNORE (-100) is unlabelled
    return {"epoch": stats["epoch"], **{key: stats[key] for key in _STATS},
            "chance_precision": _share(importance[labelled] == 1),
            "shortcut_share_label1": _share(labels[labelled & (ids == shortcut_id)] == 1)}


def label_records(df: pd.DataFrame, shortcut_id: int | None = None,
                  required: bool = True) -> pd.DataFrame:
    """Per finished SSA-labelled run and saved epoch (`save_labels: true`): method, seed and
    `epoch_quality`. `shortcut_id`: the shortcut word's token id, by default from the runs'
    model (`shortcut_token_id`). No saved labels: a ValueError, or (`required=False`: the
    notebook on runs of another profile) one printed line and an empty frame."""
    bench = finished(benchmark_runs(df), methods.names(epoch="ssa-labels"))
    if shortcut_id is None and len(bench):
        shortcut_id = shortcut_token_id(_one_setting(bench)[0])
    records = [{"method": run["method"], "seed": run["seed"],
                **epoch_quality(blob["epoch_set"], blob["stats"], shortcut_id)}
               for _, run in bench.iterrows() for blob in runs.read_saved_labels(run["run_dir"])]
    if not records:
        why = ("mechanism labels: no saved SSA labels; they exist for SSA-labelled runs (ssa-co, "
               "ssa-h) with save_labels: true, from ssa_start_epoch on")
        if required:
            raise ValueError(why)
        print(f"{why} (the mechanism profile saves them): the label table and panel stay empty",
              flush=True)
        return pd.DataFrame(columns=["method", "seed", "epoch", *LABEL_COLUMNS])
    return pd.DataFrame(records)


def label_table(records: pd.DataFrame) -> pd.DataFrame:
    """Per method x epoch of `label_records`: each of LABEL_COLUMNS as mean ± std over seeds."""
    ordered = records.assign(method=records["method"].astype(method_dtype(records["method"])))
    stats = ordered.groupby(["method", "epoch"], observed=True)[list(LABEL_COLUMNS)].agg(
        ["mean", "std"])
    out = pd.DataFrame({label: [build.mean_std(m, s, 2) for m, s in stats[column].to_numpy()]
                        for column, label in LABEL_COLUMNS.items()})
    out.insert(0, "SSA labels", [f"{build.METHOD_LABELS.get(m, m)}, epoch {epoch_number(e)}"
                                 for m, e in stats.index])
    out.attrs["caption"] = (
        "SSA labels against the true importance mask per probed epoch (labels from the model "
        "after the previous epoch), mean ± std over seeds, over labelled tokens only: precision "
        "= cue tokens among those labelled 1; chance = cue tokens among the labelled ones (the "
        "precision of labelling at random); recall = labelled cue tokens labelled 1; "
        "distractors / shortcut labelled 1 = the share of label 1 on importance-0 tokens / on "
        f"the shortcut word {SPURIOUS!r}; flip rate = masked variants whose prediction flipped.")
    return out


def figure_scores(df: pd.DataFrame) -> pd.DataFrame:
    """plot_mechanism's left panel: method (`benchmark_runs`), seed, last-epoch score."""
    view = build.epoch_view(benchmark_runs(df), "last")
    return view.loc[view["status"] == "ok", ["method", "seed", "score"]].reset_index(drop=True)


def figure_title(df: pd.DataFrame) -> str:
    """The runs' setting: task, training rows, the shortcut's phi in train, model."""
    bench = benchmark_runs(df)
    model, task = _one_setting(bench)
    first = bench.iloc[0]
    rows = first.get("max_train_examples") or first.get("synthetic_size")
    return (f"{task}, {rows} rows, shortcut phi {first.get('synthetic_spurious', 0)} (train) "
            f"/ 0 (dev), {model}")
