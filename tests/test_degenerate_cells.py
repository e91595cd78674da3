"""Degenerate cells in the batch's first table (the Table 2 layout) on tiny hand-made frames, the
columns `load_runs` gives: a one-seed demo's CoLA MCC 0.0 (a majority-class model) is flagged
and left out of every row's Avg, exactly as a three-seed constant cell is."""
import pandas as pd
import pytest

from kit.results.tables.paper_table import paper_table
from kit.results.tables.build import comparisons, degenerate, summary_table

GLUE_METRICS = {"CoLA": ("mcc",), "STS-B": ("pearson", "spearman"), "RTE": ("accuracy",),
                "synthetic": ("accuracy",)}


def frame(cells: dict) -> pd.DataFrame:
    """{(task, method): [score per seed]} -> a load_runs-like frame of OK runs; a task's metrics
    all equal its score (STS-B: Pearson = Spearman), so the expected cells are easy to read."""
    rows = []
    for (task, method), scores in cells.items():
        for seed, score in enumerate(scores):
            rows.append({"run_id": f"{task}-{method}-s{seed}", "task": task, "model": "minilm",
                         "method": method, "seed": seed, "status": "ok", "error": None,
                         "score": score, **{m: score for m in GLUE_METRICS[task]}})
    return pd.DataFrame(rows)


def test_one_seed_constant_predictor_is_flagged_and_left_out_of_avg():
    # the demo's layout: one seed; BERT-r's CoLA run predicted "acceptable" everywhere (MCC 0.0)
    runs = frame({("CoLA", "bert"): [0.0], ("CoLA", "ssa-h"): [0.2],
                  ("STS-B", "bert"): [0.6], ("STS-B", "ssa-h"): [0.62],
                  ("RTE", "bert"): [0.55], ("RTE", "ssa-h"): [0.57],
                  ("synthetic", "bert"): [0.93], ("synthetic", "ssa-h"): [0.94]})
    table = paper_table(runs)
    assert list(table.columns) == ["Avg", "CoLA", "STS-B", "RTE", "synthetic"]
    assert table.loc["BERT-r"].tolist() == [
        "69.3", "0.0† (n=1)", "60.0/60.0 (n=1)", "55.0 (n=1)", "93.0 (n=1)"]
    assert table.loc["SSA-H"].tolist() == [
        "71.0", "20.0 (n=1)", "62.0/62.0 (n=1)", "57.0 (n=1)", "94.0 (n=1)"]
    # Avg over STS-B, RTE, synthetic: (60 + 55 + 93) / 3 = 69.33 and (62 + 57 + 94) / 3 = 71.0
    assert "leaving out CoLA (a degenerate cell in the column)" in table.attrs["caption"]
    summary = summary_table(runs).set_index(["task", "method"])["degenerate"]
    assert summary.to_dict() == {
        ("CoLA", "bert"): True, ("CoLA", "ssa-h"): False, ("STS-B", "bert"): False,
        ("STS-B", "ssa-h"): False, ("RTE", "bert"): False, ("RTE", "ssa-h"): False,
        ("synthetic", "bert"): False, ("synthetic", "ssa-h"): False}
    tests = comparisons(runs).set_index("task")["degenerate"]
    assert tests.to_dict() == {"CoLA": True, "STS-B": False, "RTE": False, "synthetic": False}


def test_no_degenerate_cell_keeps_every_task_in_avg():
    runs = frame({("CoLA", "bert"): [0.25], ("STS-B", "bert"): [0.65], ("RTE", "bert"): [0.55]})
    table = paper_table(runs)
    assert table.loc["BERT-r", "Avg"] == "48.3"            # (25 + 65 + 55) / 3
    assert "leaving out" not in table.attrs["caption"]


def test_collapsed_regression_head_flags_sts_b():
    # a constant STS-B prediction scores Pearson = Spearman = 0.0 (kit.train.metrics)
    runs = frame({("STS-B", "bert"): [0.0], ("RTE", "bert"): [0.6],
                  ("STS-B", "ssa-h"): [0.3], ("RTE", "ssa-h"): [0.5]})
    table = paper_table(runs)
    assert table.loc["BERT-r", "STS-B"] == "0.0/0.0† (n=1)"
    assert table.loc["BERT-r", "Avg"] == "60.0" and table.loc["SSA-H", "Avg"] == "50.0"


@pytest.mark.parametrize("task, scores, flagged", [
    ("CoLA", [0.0], True),                 # one seed, a constant predictor's exact 0
    ("CoLA", [0.0, 0.0, 0.0], True),       # the same score on every seed
    ("CoLA", [0.0, 0.1], False),           # one seed learned something
    ("CoLA", [-0.0041], False),            # a (bad) model, not a constant prediction
    ("STS-B", [0.0], True),
    ("RTE", [0.5271], False),              # one seed of an accuracy task: not decidable
    ("RTE", [0.5271, 0.5271], True),       # the same accuracy twice (e.g. the majority class)
    ("RTE", [0.0], False),                 # accuracy 0 is no constant predictor's mark
    ("CoLA", [], False),                   # no OK run
])
def test_degenerate_rule(task, scores, flagged):
    assert degenerate(task, scores) is flagged
