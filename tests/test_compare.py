"""Comparing run folders by hand (kit.results.tables.compare) on hand-made run folders: the groups,
the means and stds over their runs, the test against the baseline with Holm's correction, the note
on a group of one run."""
import json
import os
import time

import numpy as np
import pytest

from kit import runs
from kit.config.run_config import RunConfig
from kit.results.frame import stats
from kit.results.frame.collect import load_runs
from kit.results.tables.compare import compare_runs, differing_fields, latest_runs

SCORES = {"bert": [0.80, 0.82, 0.84], "ssa-h": [0.85, 0.86, 0.90], "bert-mask": [0.70]}


def made_run(out, status="ok", score=None, **fields):
    """A run folder with config.json and metrics.json (best dev accuracy = score)."""
    cfg = RunConfig(**{"task": "synthetic", "model": "tiny", **fields}, outputs_dir=str(out))
    run_dir = runs.make_run_dir(cfg)
    runs.config_path(run_dir).write_text(json.dumps(cfg.to_dict()))
    dev = {"accuracy": score, "score": score}
    runs.metrics_path(run_dir).write_text(json.dumps({
        **runs.base_record(cfg), "status": status, "error": None if status == "ok" else "boom",
        "epochs": [{"epoch": 0, "dev": dev}], "best_epoch": 0, "best_dev": dev}))
    return run_dir


@pytest.fixture
def by_method(tmp_path):
    dirs = [made_run(tmp_path, score=s, method=m, seed=i)
            for m, scores in SCORES.items() for i, s in enumerate(scores)]
    return dirs + [made_run(tmp_path, status="failed", method="ssa-h", seed=3)]


def test_groups_by_method_with_means_stds_and_the_tests(by_method):
    table = compare_runs(by_method)
    assert table["method"].tolist() == ["bert", "bert-mask", "ssa-h"]      # the paper's order
    rows = table.set_index("method")
    assert rows["n"].tolist() == [3, 1, 3] and rows.loc["ssa-h", "n_failed"] == 1
    for method, scores in SCORES.items():
        assert rows.loc[method, "score_mean"] == pytest.approx(np.mean(scores), abs=1e-12)
        assert rows.loc[method, "accuracy_mean"] == pytest.approx(np.mean(scores), abs=1e-12)
    assert rows.loc["bert", "score_std"] == pytest.approx(0.02, abs=1e-12)
    assert rows.loc["ssa-h", "score_std"] == pytest.approx(np.sqrt(0.0007), abs=1e-12)
    assert np.isnan(rows.loc["bert-mask", "score_std"])
    assert rows["score"].tolist() == ["82.0 ± 2.0", "70.0", "87.0 ± 2.6"]
    # each group against bert: Welch's p, Holm across the two comparisons, marks on gains
    p = [stats.welch_test(SCORES[m], SCORES["bert"]) for m in ("bert-mask", "ssa-h")]
    assert rows.loc[["bert-mask", "ssa-h"], "p"].tolist() == pytest.approx(p)
    assert rows.loc[["bert-mask", "ssa-h"], "p_holm"].tolist() == pytest.approx(stats.holm(p))
    assert rows.loc["ssa-h", "diff"] == pytest.approx(5.0) and np.isnan(rows.loc["bert", "p"])
    assert rows.loc["bert-mask", "p"] == 1.0 and rows.loc["bert-mask", "mark"] == ""
    assert table.attrs["baseline"] == "bert"
    assert table.attrs["notes"] == ["one run in bert-mask (synthetic): no std, and no test can "
                                    "tell it from the baseline (p = 1); run more seeds"]
    assert "Holm-Bonferroni across these 2 comparisons" in table.attrs["caption"]
    permutation = compare_runs(by_method, baseline="ssa-h", test="permutation")
    assert permutation.set_index("method").loc["bert", "p"] == stats.permutation_test(
        SCORES["bert"], SCORES["ssa-h"]) == 0.1


def test_groups_by_the_fields_that_differ(tmp_path):
    dirs = [made_run(tmp_path, score=s, method="bert", lr=lr, seed=i)
            for lr, scores in ((1e-4, [0.6, 0.7]), (2e-4, [0.8, 0.9]))
            for i, s in enumerate(scores)]
    dirs.append(made_run(tmp_path, score=0.5, method="bert", lr=1e-4, seed=2,
                         save_labels=True, log_every=3))           # not what is computed
    table = compare_runs(dirs)
    assert table["lr"].tolist() == ["lr=0.0001", "lr=0.0002"]
    assert table["n"].tolist() == [3, 2] and table.attrs["baseline"] == "lr=0.0001"
    assert table["score_mean"].tolist() == pytest.approx([0.6, 0.85])
    assert table["diff"].iloc[1] == pytest.approx(25.0)
    assert compare_runs(dirs[:2])["group"].tolist() == ["all runs"]     # seeds only: one group
    # a field that differs only between tasks is their setting, not a group; method always is
    pair = [made_run(tmp_path, score=0.9, task="synthetic-pair", method=m, lr=1e-4,
                     max_length=64) for m in ("bert", "ssa-co")]
    assert compare_runs(dirs[:2] + pair)["method"].tolist() == ["bert", "bert", "ssa-co"]
    with pytest.raises(ValueError, match="baseline 'x' is no group; groups: bert, ssa-co"):
        compare_runs(pair, baseline="x")
    with pytest.raises(ValueError, match=r"by=\['gama'\]: not a column of these runs"):
        compare_runs(pair, by=["gama"])
    assert differing_fields(load_runs(dirs)) == ["lr"]


def test_the_latest_runs(tmp_path):
    dirs = [made_run(tmp_path, score=0.5, method="bert", seed=i) for i in range(3)]
    for age, run_dir in zip((30, 10, 20), dirs):       # seconds ago
        os.utime(runs.config_path(run_dir), (time.time() - age,) * 2)
    assert latest_runs(tmp_path, 2) == [dirs[2], dirs[1]]
    assert latest_runs(tmp_path / "none") == []


def test_a_damaged_run_is_counted_and_named_never_dropped(by_method):
    """A truncated metrics.json among the runs compared: its group counts it (n_damaged) and
    the notes name it, instead of a smaller n; a run whose config.json is gone too is named."""
    bert = by_method[0]
    runs.metrics_path(bert).write_text('{"status": "ok", "best_d')
    lost = made_run(by_method[0].parent, score=0.8, method="bert", seed=7)
    runs.config_path(lost).write_text("")
    runs.metrics_path(lost).write_text("")
    table = compare_runs(by_method + [lost])
    rows = table.dropna(subset=["method"]).set_index("method")
    assert rows.loc["bert", ["n", "n_failed", "n_damaged"]].tolist() == [2, 0, 1]
    assert rows.loc["bert", "score_mean"] == pytest.approx(0.83, abs=1e-12)
    note = table.attrs["notes"][0]
    assert note.startswith("2 damaged runs (") and f"{bert.name}: {runs.metrics_path(bert)}: " \
        "corrupt JSON" in note and f"{lost.name}: {runs.config_path(lost)}: corrupt JSON" in note
