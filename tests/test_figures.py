"""kit.results.figures.figure_data and kit.results.figures.token_view.find_run on hand-made run
folders (config.json, metrics.json, history.csv as the training loop writes them), and
kit.results.figures.plots' plots of those frames."""
import json
import math
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

from kit.results.figures import figure_data, plots, token_view  # noqa: E402
from kit.results.frame.collect import load_runs  # noqa: E402


def make_run(root: Path, run_id: str, task="SST-2", method="bert", seed=0, score=0.8,
             gamma=1.0, status="ok", history=None, ssa_labels=None, **config) -> Path:
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    cfg = {"task": task, "model": "minilm", "method": method, "seed": seed, "gamma": gamma,
           "lr": 1e-4, "profile": "p", **config}
    (run_dir / "config.json").write_text(json.dumps(cfg))
    metrics = {"run_id": run_id, "task": task, "model": "minilm", "method": method,
               "seed": seed, "status": status, "error": None if status == "ok" else "boom"}
    if status == "ok":
        dev = {"accuracy": score, "score": score}
        metrics.update(best_epoch=0, best_dev=dev, epochs=[{"epoch": 0, "dev": dev}],
                       best_three_subset={"mean": score, "std": 0.01, "subsets": [score] * 3},
                       wall_s={"train": 8.0, "label_generation": 2.0, "eval": 1.0, "total": 11.0},
                       ssa_labels=ssa_labels or [])
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    if history is not None:
        pd.DataFrame(history).to_csv(run_dir / "history.csv", index=False)
    return run_dir


# ---------------------------------------------------------------- gamma (Fig. 7)

@pytest.fixture
def gamma_runs(tmp_path):
    scores = {("ssa-h", 0.6): [0.80, 0.82, 0.84], ("ssa-h", 2.0): [0.85, 0.85, 0.85],
              ("bert-mask", 0.6): [0.79, 0.81, 0.80], ("bert-mask", 2.0): [0.70, 0.72, 0.74]}
    for (method, gamma), values in scores.items():
        for seed, value in enumerate(values):
            make_run(tmp_path, f"{method}-{gamma}-{seed}", method=method, gamma=gamma,
                     seed=seed, score=value)
    # the baseline crossed with gamma: per seed two identical-config runs, one sample each
    for seed, value in enumerate([0.78, 0.80, 0.82]):
        for gamma in (0.6, 2.0):
            make_run(tmp_path, f"bert-{gamma}-{seed}", method="bert", gamma=gamma, seed=seed,
                     score=value)
    make_run(tmp_path, "failed", method="ssa-h", gamma=0.6, seed=3, status="failed")
    return load_runs(tmp_path)


def test_gamma_points_mean_std_over_seeds(gamma_runs):
    points = figure_data.gamma_points(gamma_runs)
    assert list(zip(points["method"], points["gamma"])) == [
        ("bert-mask", 0.6), ("bert-mask", 2.0), ("ssa-h", 0.6), ("ssa-h", 2.0)]
    row = points[(points["method"] == "ssa-h") & (points["gamma"] == 0.6)].iloc[0]
    assert row["mean"] == pytest.approx(82.0) and row["std"] == pytest.approx(2.0)
    assert row["n"] == 3                                 # the failed seed is not counted
    assert row["label"] == "SSA-H" and row["task"] == "SST-2" and row["scale"] == 100
    assert points.loc[points["gamma"] == 2.0, "std"].iloc[1] == pytest.approx(0.0)


def test_gamma_baseline_counts_each_seed_once(gamma_runs):
    base = figure_data.gamma_baseline(gamma_runs)
    assert base["n"] == 3 and base["mean"] == pytest.approx(80.0)
    assert base["std"] == pytest.approx(2.0) and base["label"] == "BERT-r"
    assert figure_data.gamma_baseline(gamma_runs, baseline="none") is None


def test_gamma_points_refuse_mixed_configurations_and_tasks(tmp_path, gamma_runs):
    make_run(tmp_path, "other-lr", method="ssa-h", gamma=0.6, seed=0, lr=2e-5)
    with pytest.raises(ValueError, match="several finished runs"):
        figure_data.gamma_points(load_runs(tmp_path))
    mixed = pd.concat([gamma_runs, gamma_runs.assign(task="RTE")])
    with pytest.raises(ValueError, match="one task"):
        figure_data.gamma_points(mixed)
    with pytest.raises(ValueError, match="no finished runs"):
        figure_data.gamma_points(gamma_runs[gamma_runs["method"] == "bert"])


def test_plot_gamma_and_save_figure(tmp_path, gamma_runs):
    fig = plots.plot_gamma(figure_data.gamma_points(gamma_runs),
                             figure_data.gamma_baseline(gamma_runs))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "BERT-r (n=3)", "BERT-mask (n=3)", "SSA-H (n=3)"]
    path = plots.save_figure(fig, tmp_path / "out", kind="gamma", profile="params/x.yaml",
                               task="SST-2")
    assert path == tmp_path / "out" / "figures" / "gamma-x-SST-2.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == [path.name]       # no temp file left
    assert plots.save_figure(fig, tmp_path, "named").name == "named.png"
    matplotlib.pyplot.close("all")


# ---------------------------------------------------------------- training cost (Fig. 6)

def history(losses, targets=None, start=0.0):
    rows = {"step": [10 * (i + 1) for i in range(len(losses))],
            "epoch": [round((i + 1) / len(losses), 4) for i in range(len(losses))],
            "wall_s": [start + 2.0 * (i + 1) for i in range(len(losses))], "loss": losses,
            "lr": [1e-4] * len(losses)}
    if targets is not None:
        rows.update(loss_target=targets, loss_ssa=[0.1] * len(losses))
    return rows


def test_cost_curves_from_history(tmp_path):
    make_run(tmp_path, "b", method="bert", history=history([0.7, 0.1, 0.0]))
    make_run(tmp_path, "h", method="ssa-h", history=history([0.9, 0.5], targets=[0.8, 0.4]))
    make_run(tmp_path, "h1", method="ssa-h", seed=1, history=history([1.0, 0.6], [0.9, 0.5]))
    make_run(tmp_path, "co", method="ssa-co", history=history([0.5]))
    runs = load_runs(tmp_path)
    curves = figure_data.cost_curves(runs)
    assert set(curves["method"]) == {"bert", "ssa-h"}                  # ssa-co not in Fig. 6
    bert = curves[curves["run_id"] == "b"]
    assert list(bert["wall_s"]) == [2.0, 4.0, 6.0] and list(bert["step"]) == [10, 20, 30]
    assert bert["log10_loss"].iloc[1] == pytest.approx(-1.0)
    assert math.isnan(bert["log10_loss"].iloc[2])                       # log of 0: left out
    target = figure_data.cost_curves(runs, loss="loss_target", seeds=[0])
    assert list(target.loc[target["method"] == "ssa-h", "loss"]) == [0.8, 0.4]
    assert list(target.loc[target["method"] == "bert", "loss"]) == [0.7, 0.1, 0.0]  # = loss
    assert set(target["seed"]) == {0}
    with pytest.raises(ValueError, match="no column 'loss_x'"):
        figure_data.cost_curves(runs, loss="loss_x")
    fig = plots.plot_cost(curves)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["BERT-r", "SSA-H (2 seeds)"]
    matplotlib.pyplot.close("all")


def test_cost_summary_and_missing_history(tmp_path):
    make_run(tmp_path, "h", method="ssa-h", history=history([0.9]))
    make_run(tmp_path, "m", method="bert-mask")                        # no history.csv
    runs = load_runs(tmp_path)
    summary = figure_data.cost_summary(runs)
    assert list(summary["method"]) == ["bert-mask", "ssa-h"]
    assert summary["label_generation_share"].iloc[1] == pytest.approx(2 / 11, abs=1e-3)
    with pytest.raises(ValueError, match="history.csv not found"):
        figure_data.cost_curves(runs)


@pytest.mark.parametrize("ks, mixed", [((1, 1), False), ((2, 2), False), ((1, 2), True)])
def test_the_cost_figure_and_table_never_mix_k_points_at_once(tmp_path, ks, mixed):
    """A run timed beside K - 1 others (--per-device K, recorded as per_device) and a run timed
    alone: the cost figure and table refuse to put their clocks side by side, saying so."""
    for run_id, method, k in zip("bh", ("bert", "ssa-h"), ks):
        run = make_run(tmp_path, run_id, method=method, history=history([0.9, 0.5]))
        metrics = json.loads((run / "metrics.json").read_text())
        (run / "metrics.json").write_text(json.dumps({**metrics, "per_device": k}))
    runs = load_runs(tmp_path)
    assert list(runs.sort_values("run_id")["per_device"]) == list(ks)
    if not mixed:
        assert len(figure_data.cost_curves(runs)) == 4 and len(figure_data.cost_summary(runs)) == 2
        return
    for what, make in (("cost figure", figure_data.cost_curves),
                       ("cost table", figure_data.cost_summary)):
        with pytest.raises(ValueError) as err:
            make(runs)
        assert str(err.value) == (f"{what}: its runs were timed with 1 and 2 points per device at "
                                  "once (--per-device): their wall clocks do not compare; pick "
                                  "runs of one kind (a profile run alike)")


# ---------------------------------------------------------------- SSA label quality

def stats(epoch, cue, distractor):
    return {"epoch": epoch, "rule": "paper", "probed": 100, "kept": 80, "variants": 80,
            "flipped": 20, "flip_rate": 0.25, "labelled_tokens": 300, "share_label1": 0.2,
            "cue_share_label1": cue, "distractor_share_label1": distractor}


def test_label_quality_per_epoch(tmp_path):
    make_run(tmp_path, "h0", task="synthetic", method="ssa-h",
             ssa_labels=[stats(1, 0.6, 0.1), stats(2, 0.8, 0.05)])
    make_run(tmp_path, "h1", task="synthetic", method="ssa-h", seed=1,
             ssa_labels=[stats(1, 0.4, 0.3), stats(2, None, None)])
    make_run(tmp_path, "m", task="synthetic", method="bert-mask",
             ssa_labels=[{"epoch": 1, "augmented": 100}])
    runs = load_runs(tmp_path)
    frame = figure_data.label_quality(runs)
    assert list(zip(frame["run_id"], frame["epoch"])) == [("h0", 1), ("h0", 2), ("h1", 1)]
    assert frame["cue_share_label1"].tolist() == [0.6, 0.8, 0.4]
    assert frame["distractor_share_label1"].tolist() == [0.1, 0.05, 0.3]
    assert frame["kept"].tolist() == [80, 80, 80]
    fig = plots.plot_label_quality(frame)
    assert fig.axes[0].get_xticks().tolist() == [2, 3]     # the frame's epochs 1, 2, counted from 1
    lines = fig.axes[0].get_legend().get_texts()
    assert [t.get_text() for t in lines] == ["SSA-H: cue tokens (n=2)",
                                             "SSA-H: distractors (n=2)"]
    matplotlib.pyplot.close("all")
    with pytest.raises(ValueError, match="no SSA label statistics"):
        figure_data.label_quality(runs[runs["method"] == "bert-mask"], methods=("bert-mask",))


# ---------------------------------------------------------------- case study (Fig. 8)

def test_plot_case_study_from_a_frame():
    tokens = ["a", "funny", "film"]
    data = pd.DataFrame({
        "sentence_id": 0, "sentence": "a funny film", "position": range(3), "token": tokens,
        "vanilla_attention": [0.2, 0.5, 0.3], "ssa_attention": [0.3, 0.4, 0.3],
        "ssa_weight": [0.1, 0.8, 0.1], "ssa_p_important": [0.2, 0.9, np.nan],
        "vanilla_prediction": "negative", "vanilla_confidence": 0.6,
        "ssa_prediction": "positive", "ssa_confidence": 0.9})
    fig = plots.plot_case_study(data)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens
    title = ax.get_title()
    assert "BERT-r: negative (0.60)" in title and "SSA-H: positive (0.90)" in title
    assert len(ax.get_yticklabels()) == 4
    named = plots.plot_case_study(data.assign(task="SST-2", model="minilm", vanilla_seed=0,
                                                ssa_seed=0))
    assert named._suptitle.get_text() == "SST-2, minilm: BERT-r (seed 0) vs SSA-H (seed 0)"
    matplotlib.pyplot.close("all")


def test_find_run_needs_a_checkpoint(tmp_path):
    make_run(tmp_path, "b", method="bert", score=0.7)
    runs = load_runs(tmp_path)
    with pytest.raises(ValueError, match="save_checkpoints"):
        token_view.find_run(runs, "bert", seed=0)
    with pytest.raises(ValueError, match="no finished run"):
        token_view.find_run(runs, "ssa-h")
    (tmp_path / "b" / "checkpoint" / "best").mkdir(parents=True)
    (tmp_path / "b" / "checkpoint" / "best" / "head_spec.json").write_text("{}")
    assert token_view.find_run(runs, "bert", seed=0) == tmp_path / "b"


# ---------------------------------------------------------------- paper-ready details

def test_titles_name_task_model_and_seeds(tmp_path, gamma_runs):
    fig = plots.plot_gamma(figure_data.gamma_points(gamma_runs), figure_data.gamma_baseline(gamma_runs))
    assert fig.axes[0].get_title().startswith("SST-2, minilm, seeds 0-2: ")
    markers = {c.get_label(): c.lines[0].get_marker() for c in fig.axes[0].containers}
    assert list(markers) == ["BERT-mask (n=3)", "SSA-H (n=3)"]
    assert len(set(markers.values())) == 2                              # one marker per method
    cost = tmp_path / "cost"                                 # apart from the gamma runs
    make_run(cost, "b", method="bert", history=history([0.7, 0.5]))
    make_run(cost, "h", method="ssa-h", seed=2, history=history([0.9, 0.5], [0.8, 0.4]))
    fig = plots.plot_cost(figure_data.cost_curves(load_runs(cost)))
    assert fig.axes[0].get_title() == ("Training cost on SST-2, minilm, seeds 0, 2: "
                                       "loss against time")
    assert fig.axes[0].get_ylabel() == "log10 target-task loss L_target"
    matplotlib.pyplot.close("all")


def test_label_quality_cue_and_distractor_markers_differ(tmp_path):
    make_run(tmp_path, "h0", task="synthetic", method="ssa-h", ssa_labels=[stats(1, 0.6, 0.1)])
    fig = plots.plot_label_quality(figure_data.label_quality(load_runs(tmp_path)))
    ax = fig.axes[0]
    lines = [line for line in ax.get_lines() if len(line.get_xdata())]
    faces = {str(line.get_markerfacecolor()) for line in lines}
    assert len(faces) == 2                                               # filled and open
    assert ax.get_title() == "SSA label quality on synthetic, minilm, seed 0"
    matplotlib.pyplot.close("all")


def test_no_ssa_loss_before_ssa_starts(tmp_path):
    # ssa_start_epoch 1: the rows of epoch 0 (epoch <= 1 in history.csv) had no SSA loss term
    rows = history([0.5, 0.5, 0.4, 0.3], [0.7, 0.7, 0.5, 0.4])
    rows.update(epoch=[0.5, 1.0, 1.5, 2.0], loss_ssa=[0.0, 0.0, 0.2, 0.1])
    make_run(tmp_path, "h", method="ssa-h", history=rows, ssa_start_epoch=1)
    curves = figure_data.cost_curves(load_runs(tmp_path), loss="loss_ssa")
    assert curves["loss"].isna().tolist() == [True, True, False, False]
    assert curves["loss"].tolist()[2:] == [0.2, 0.1]


def test_gamma_points_keep_the_equal_steps_budget_apart(tmp_path, gamma_runs):
    for seed, value in enumerate([0.76, 0.78, 0.80]):
        make_run(tmp_path, f"eq-{seed}", method="bert-mask", gamma=2.0, seed=seed, score=value,
                 budget="equal_steps")
    points = figure_data.gamma_points(load_runs(tmp_path))
    capped = points[points["budget"] == "equal_steps"]
    assert capped["label"].tolist() == ["BERT-mask (equal steps)"]
    assert capped["mean"].tolist() == pytest.approx([78.0]) and capped["n"].tolist() == [3]
    plain = points[(points["method"] == "bert-mask") & (points["budget"] == "epochs")]
    assert plain["mean"].tolist() == pytest.approx([80.0, 72.0])        # gamma 0.6, 2.0
    fig = plots.plot_gamma(points)
    assert [c.get_label() for c in fig.axes[0].containers] == [
        "BERT-mask (n=3)", "BERT-mask (equal steps) (n=3)", "SSA-H (n=3)"]
    matplotlib.pyplot.close("all")
