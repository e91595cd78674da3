"""kit.results.frame.collect, kit.results.tables.selection, kit.results.tables.writers and
kit.results.tables.build on hand-made run folders, and the paper's numbers against the paper's
text."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kit.results.tables.paper_results import PAPER_RESULTS, PAPER_TASKS, paper_profile, paper_row
from kit.results.frame.collect import load_runs, table_notes
from kit.results.tables.selection import select_by_best_dev, select_by_three_subsets
from kit.results.tables.paper_table import paper_table
from kit.results.frame.stats import significance_mark, welch_test
from kit.results.tables.build import (budget_view, comparisons, epoch_table, runs_table,
                                       summary_table)
from kit.results.tables.table_sets import profile_tables
from kit.results.tables.writers import write_tables

# The paper's table rows, copied verbatim from its text into the project (tests read nothing
# outside the clone).
PAPER_ROWS = Path(__file__).resolve().parent / "fixtures" / "ssa-paper-table-rows.tsv"


def make_run(root: Path, run_id: str, task="RTE", method="bert", seed=0, dev=None,
             status="ok", three=(0.6, 0.02), model="minilm", per_epoch=None, history=None,
             **config) -> Path:
    """A run folder as the training loop writes it (a failed one stops after `error`)."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    cfg = {"task": task, "method": method, "seed": seed, "model": model, "lr": 2e-5,
           "batch_size": 32, "epochs": 3, "alpha": 0.7, "beta": 0.5, "gamma": 1.0, **config}
    (run_dir / "config.json").write_text(json.dumps(cfg))
    if status == "failed":
        metrics = {"run_id": run_id, "status": "failed", "error": "CUDA out of memory"}
    else:
        dev = dev or {"accuracy": 0.6, "score": 0.6}
        metrics = {"run_id": run_id, "status": "ok", "error": None, "task": task, "model": model,
                   "method": method, "seed": seed,
                   "epochs": [{"epoch": 0, "dev": dev, "train_loss": 0.6, "wall_s": 1.0}],
                   "best_epoch": 0, "best_dev": dev,
                   "best_three_subset": {"mean": three[0], "std": three[1],
                                         "subsets": [three[0]] * 3},
                   "wall_s": {"train": 10.0, "label_generation": 2.0, "eval": 1.0, "total": 13.0},
                   "train_examples_per_s": 50.0, "peak_memory_mb": 900.0, "ssa_labels": []}
        if per_epoch:      # [(dev, three subset scores)] per epoch; best by the full dev score
            metrics["epochs"] = [{"epoch": i, "dev": d, "train_loss": 0.6, "wall_s": 1.0,
                                  "three_subset": {"mean": np.mean(t), "std": np.std(t),
                                                   "subsets": t}}
                                 for i, (d, t) in enumerate(per_epoch)]
            best = max(range(len(per_epoch)), key=lambda i: (per_epoch[i][0]["score"], -i))
            metrics.update(best_epoch=best, best_dev=per_epoch[best][0],
                           last_dev=per_epoch[-1][0])
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    if history is not None:
        pd.DataFrame(history).to_csv(run_dir / "history.csv", index=False)
    return run_dir


def md_cells(text: str) -> list[list[str]]:
    """The cells of a markdown table's lines, stripped (an escaped "\\|" stays in its cell)."""
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            for line in text.splitlines() if line.startswith("|")]


def acc(value: float) -> dict:
    return {"accuracy": value, "score": value}


def pair(f1: float, accuracy: float) -> dict:
    return {"f1": f1, "accuracy": accuracy, "score": (f1 + accuracy) / 2}


def mnli(m: float, mm: float) -> dict:
    return {"accuracy": m, "accuracy_mm": mm, "score": (m + mm) / 2}


# ---------------------------------------------------------------- load_runs

def test_load_runs_ok_failed_and_missing(tmp_path):
    make_run(tmp_path, "a", seed=0, dev=acc(0.6))
    make_run(tmp_path, "b", seed=1, status="failed")
    (tmp_path / "c").mkdir()                            # still running: config only
    (tmp_path / "c" / "config.json").write_text(json.dumps({"task": "RTE", "method": "bert",
                                                            "seed": 2, "model": "minilm"}))
    (tmp_path / ".tmp").mkdir()                         # hidden folders are not runs
    df = load_runs(tmp_path).set_index("run_id")
    assert list(df.index) == ["a", "b", "c"]
    assert list(df["status"]) == ["ok", "failed", "missing"]
    assert list(df["seed"]) == [0, 1, 2]                # identity of a failed run from config
    assert (df["task"] == "RTE").all()
    assert df.loc["a", "accuracy"] == 0.6 and np.isnan(df.loc["b", "accuracy"])
    assert df.loc["b", "error"] == "CUDA out of memory"
    assert df.loc["a", "three_subset_mean"] == 0.6 and df.loc["a", "three_subset_std"] == 0.02
    assert df.loc["a", "wall_train_s"] == 10.0 and df.loc["a", "train_examples_per_s"] == 50.0
    assert df.loc["a", "lr"] == 2e-5 and df.loc["a", "gamma"] == 1.0   # config columns
    assert df.loc["a", "best_epoch"] == 0


def test_load_runs_takes_a_list_of_folders(tmp_path):
    dirs = [make_run(tmp_path, f"r{i}", seed=i) for i in range(3)]
    assert list(load_runs(dirs[:2])["run_id"]) == ["r0", "r1"]


def test_load_runs_flattens_nested_config(tmp_path):
    make_run(tmp_path, "a", ssa={"alpha": 0.9, "masks": [1, 2]})
    df = load_runs(tmp_path)
    assert df.loc[0, "ssa.alpha"] == 0.9 and "ssa.masks" not in df.columns


@pytest.mark.parametrize("name, text, why", [
    ("metrics.json", '{"status": "ok", "best_de', "corrupt JSON (Unterminated string"),
    ("metrics.json", "[1, 2]", "expected a JSON object, got list"),
    ("metrics.json", '{"status": "done"}', "status must be 'ok', 'failed' or 'preempted', got "
                                           "'done'"),
    ("config.json", "", "corrupt JSON (Expecting value")])
def test_a_damaged_run_is_a_row_of_its_own_naming_its_file(tmp_path, capsys, name, text, why):
    """A truncated or foreign record in one run folder: a row with status damaged, its error
    naming the file and what is wrong (its identity from config.json where that can be read),
    and the others go on."""
    make_run(tmp_path, "a")
    bad = make_run(tmp_path, "b", seed=1) / name
    bad.write_text(text)
    df = load_runs(tmp_path).set_index("run_id")
    assert list(df.index) == ["a", "b"] and list(df["status"]) == ["ok", "damaged"]
    assert df.loc["b", "error"].startswith(f"{bad}: {why}")
    if name == "metrics.json":                        # config.json says which cell it is in
        assert (df.loc["b", "task"], df.loc["b", "seed"]) == ("RTE", 1)
    else:
        assert pd.isna(df.loc["b", "task"]) and pd.isna(df.loc["b", "seed"])
    assert pd.isna(df.loc["b", "score"]) and capsys.readouterr().err == ""


def test_a_damaged_run_is_counted_in_its_cell_never_dropped(tmp_path):
    """3 good seeds and one truncated metrics.json: the paper layout says 3 of 4 with 1 damaged,
    the summary counts it, the notes above every table name it; the mean is the 3 good ones'."""
    for seed in range(3):
        make_run(tmp_path, f"rte-{seed}", seed=seed, dev=acc(0.60 + seed / 100))
    bad = make_run(tmp_path, "rte-3", seed=3) / "metrics.json"
    bad.write_text(bad.read_text()[:40])
    runs = load_runs(tmp_path)
    assert paper_table(runs).loc["BERT-r", "RTE"] == "61.0 ± 1.0 (n=3 of 4, 1 damaged)"
    summary = summary_table(runs).iloc[0]
    assert (summary["n_seeds"], summary["n_failed"], summary["n_missing"],
            summary["n_damaged"]) == (3, 0, 0, 1)
    assert summary["score_mean"] == pytest.approx(0.61)
    tables = profile_tables(runs)
    assert list(tables["Runs"]["status"]) == ["ok", "ok", "ok", "damaged"]
    assert [n.split(":")[0] for n in tables["Runs"].attrs["notes"]][:1] == [
        "1 damaged run (a record no run writes; counted in n, never averaged; rerunning its "
        "point retrains it)"]
    assert f"rte-3: {bad}: corrupt JSON (Unterminated string" in tables["Runs"].attrs["notes"][0]


def test_a_damaged_run_without_its_config_has_no_row_only_the_line_above(tmp_path):
    """A run whose config.json cannot be read belongs to no cell: the summary has no blank row
    for it; the line above every table names and counts it."""
    make_run(tmp_path, "rte-0", seed=0, dev=acc(0.60))
    bad = make_run(tmp_path, "rte-1", seed=1)
    (bad / "config.json").write_text("{")
    (bad / "metrics.json").write_text("{")
    runs = load_runs(tmp_path)
    assert list(runs["status"]) == ["ok", "damaged"]
    summary = summary_table(runs)
    assert list(summary["task"]) == ["RTE"] and summary.iloc[0]["n_damaged"] == 0
    assert table_notes(runs)[0].startswith("1 damaged run (") and "rte-1: " in table_notes(runs)[0]


def test_tables_and_the_batch_process_never_import_torch():
    """Tables, figures and the token view's page load no torch; nor does importing a batch,
    kit.run or a SLURM task's process, which only hands points to kernels or torchrun (a
    torchrun of its own for a data-parallel point, a failure recorded outside a kernel: torch
    then). A batch imports it once as it starts, for its first line (kit.cluster.tally.
    where_line: only torch knows whether its wheel sees the GPU). In a fresh interpreter: this
    test session may have imported torch for other tests."""
    code = ("import sys, kit.results.frame.collect, kit.results.tables.selection, kit.results.tables.fold_tables, "
            "kit.results.tables.table_sets, kit.results.tables.writers, kit.results.figures.figure_data, "
            "kit.results.figures.token_view, kit.results.figures.model_scores, kit.results.views.token_html, kit.results.views.model_view, kit.batch, "
            "kit.run, kit.slurm, kit.train.preflight; sys.exit(' '.join(sorted({'torch', "
            "'transformers', 'accelerate'} & set(sys.modules))) or None)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- summary_table

def test_summary_over_seeds_with_failed_and_missing(tmp_path):
    for seed, (f1, a) in enumerate([(0.8, 0.7), (0.9, 0.8)]):
        make_run(tmp_path, f"m{seed}", task="MRPC", seed=seed, dev=pair(f1, a))
    make_run(tmp_path, "m2", task="MRPC", seed=2, status="failed")
    make_run(tmp_path, "r0", task="RTE", method="ssa-h", seed=0, dev=acc(0.7))
    out = summary_table(load_runs(tmp_path))
    assert list(out["task"]) == ["MRPC", "RTE"]
    mrpc = out.iloc[0]
    assert (mrpc["n_seeds"], mrpc["n_failed"], mrpc["n_missing"], mrpc["n_damaged"]) == (2, 1, 0, 0)
    assert mrpc["f1_mean"] == pytest.approx(0.85) and mrpc["accuracy_mean"] == pytest.approx(0.75)
    assert mrpc["f1_std"] == pytest.approx(np.std([0.8, 0.9], ddof=1))
    assert mrpc["score_mean"] == pytest.approx(0.8)
    assert np.isnan(out.iloc[1]["f1_mean"])             # RTE has no F1 column


def test_summary_refuses_mixed_configurations(tmp_path):
    make_run(tmp_path, "a", seed=0, lr=1e-5)
    make_run(tmp_path, "b", seed=0, lr=2e-5)
    df = load_runs(tmp_path)
    with pytest.raises(ValueError, match="several OK runs for one seed"):
        summary_table(df)
    assert list(summary_table(df, by=["lr"])["lr"]) == [1e-5, 2e-5]


# ---------------------------------------------------------------- paper_table

@pytest.fixture
def grid(tmp_path):
    """bert and ssa-h on MNLI, RTE, MRPC; ssa-h clearly better on RTE; one ssa-h seed missing
    on MRPC and one bert RTE run failed; bert-mask only on RTE."""
    for seed in range(3):
        make_run(tmp_path, f"bert-mnli-{seed}", task="MNLI", seed=seed,
                 dev=mnli(0.79 + seed / 100, 0.81))
        make_run(tmp_path, f"ssah-mnli-{seed}", task="MNLI", method="ssa-h", seed=seed,
                 dev=mnli(0.80 + seed / 100, 0.81))
        make_run(tmp_path, f"bert-rte-{seed}", task="RTE", seed=seed,
                 dev=acc(0.60 + seed / 100))
        make_run(tmp_path, f"ssah-rte-{seed}", task="RTE", method="ssa-h", seed=seed,
                 dev=acc(0.70 + seed / 100))
        make_run(tmp_path, f"bert-mrpc-{seed}", task="MRPC", seed=seed,
                 dev=pair(0.87 + seed / 100, 0.84))
        make_run(tmp_path, f"mask-rte-{seed}", task="RTE", method="bert-mask", seed=seed,
                 dev=acc(0.55 + seed / 100))
    make_run(tmp_path, "bert-rte-3", task="RTE", seed=3, status="failed")
    for seed in range(2):
        make_run(tmp_path, f"ssah-mrpc-{seed}", task="MRPC", method="ssa-h", seed=seed,
                 dev=pair(0.89 + seed / 100, 0.85))
    (tmp_path / "ssah-mrpc-2").mkdir()
    (tmp_path / "ssah-mrpc-2" / "config.json").write_text(json.dumps(
        {"task": "MRPC", "method": "ssa-h", "seed": 2, "model": "minilm"}))
    return load_runs(tmp_path)


def test_paper_table_layout(grid):
    table = paper_table(grid)
    assert list(table.index) == ["BERT-r", "BERT-mask", "SSA-H"]
    assert table.index.name == "Model"
    assert list(table.columns) == ["Avg", "MRPC", "MNLI", "RTE"]     # GLUE order
    bert, ssah = table.loc["BERT-r"], table.loc["SSA-H"]
    assert bert["MRPC"] == "88.0/84.0 ± 1.0/0.0 (n=3)"               # F1/acc
    assert bert["MNLI"] == "80.0/81.0 ± 1.0/0.0 (n=3)"               # m/mm
    assert bert["RTE"] == "61.0 ± 1.0 (n=3 of 4, 1 failed)"
    assert ssah["RTE"] == "71.0** ± 1.0 (n=3)"                       # Welch vs BERT-r
    assert ssah["MRPC"] == "89.5/85.0 ± 0.7/0.0 (n=2 of 3, 1 missing)"
    assert ssah["MNLI"] == "81.0/81.0 ± 1.0/0.0 (n=3)"               # mean 81 vs 80.5: p > .05
    assert bert["Avg"] == f"{np.mean([86.0, 80.5, 61.0]):.1f}"       # GLUE average of scores
    assert table.loc["BERT-mask", "MRPC"] == ""                      # not run there
    assert table.loc["BERT-mask", "RTE"] == "56.0 ± 1.0 (n=3)"       # worse: never marked
    assert table.loc["BERT-mask", "Avg"] == "n/a"


def test_paper_table_single_seed_and_all_failed(tmp_path):
    make_run(tmp_path, "a", task="CoLA", dev={"mcc": 0.4321, "accuracy": 0.8, "score": 0.4321})
    make_run(tmp_path, "b", task="SST-2", status="failed")
    table = paper_table(load_runs(tmp_path))
    assert table.loc["BERT-r", "CoLA"] == "43.2 (n=1)"
    assert table.loc["BERT-r", "SST-2"] == "n/a (n=0 of 1, 1 failed)"


def test_paper_table_with_the_papers_rows(grid):
    table = paper_table(grid, paper="base")
    assert list(table.index) == [
        "BERT-r", "BERT-r (paper)", "BERT-r (measured - paper)",
        "BERT-mask", "BERT-mask (paper)", "BERT-mask (measured - paper)",
        "SSA-H", "SSA-H (paper)", "SSA-H (measured - paper)"]
    assert table.loc["SSA-H (paper)", "RTE"] == "70.3**"
    assert table.loc["SSA-H (paper)", "MRPC"] == "89.1/85.4*"
    assert table.loc["SSA-H (measured - paper)", "RTE"] == "+0.7"
    assert table.loc["BERT-r (measured - paper)", "MNLI"] == "-4.2/-2.2"
    assert table.loc["BERT-r (paper)", "Avg"] == f"{np.mean([(87.1 + 82.8) / 2, 83.7, 69.1]):.1f}"
    # the paper's rows are test scores, the kit's dev scores: the caption says so, only there
    assert "(paper) rows: the paper's GLUE test-server scores" in table.attrs["caption"]
    assert "GLUE test-server" not in paper_table(grid).attrs["caption"]


def test_paper_table_several_models(tmp_path):
    make_run(tmp_path, "a", model="minilm")
    make_run(tmp_path, "b", model="bert-base-uncased")
    assert list(paper_table(load_runs(tmp_path)).index) == [
        "BERT-r [bert-base-uncased]", "BERT-r [minilm]"]


# ---------------------------------------------------------------- selection

def test_three_subset_rule_next_to_best_dev(tmp_path):
    # lr 2e-5 has the best dev score but unstable subsets; 1e-5 is steadier.
    for seed in range(2):
        make_run(tmp_path, f"hi-{seed}", seed=seed, lr=2e-5, dev=acc(0.70), three=(0.70, 0.08))
        make_run(tmp_path, f"lo-{seed}", seed=seed, lr=1e-5, dev=acc(0.66), three=(0.66, 0.01))
        make_run(tmp_path, f"x-{seed}", seed=seed, lr=3e-5, status="failed")
    df = load_runs(tmp_path)
    keys = ["task", "model", "method"]
    by_three = select_by_three_subsets(df, keys, ["lr"])
    by_dev = select_by_best_dev(df, keys, ["lr"])
    assert set(by_three["lr"]) == {1e-5} and len(by_three) == 2
    assert set(by_dev["lr"]) == {2e-5} and len(by_dev) == 2
    assert by_three["selection_criterion"].iloc[0] == pytest.approx(0.65)
    assert paper_table(by_three).loc["BERT-r", "RTE"] == "66.0† ± 0.0 (n=2)"    # same each seed


def test_selection_is_per_group_and_keeps_failed_seeds(tmp_path):
    make_run(tmp_path, "a0", seed=0, gamma=1.0, three=(0.6, 0.0))
    make_run(tmp_path, "a1", seed=1, gamma=1.0, status="failed")
    make_run(tmp_path, "b0", seed=0, gamma=2.0, three=(0.5, 0.0))
    make_run(tmp_path, "c0", seed=0, method="ssa-h", gamma=2.0, three=(0.7, 0.0))
    out = select_by_three_subsets(load_runs(tmp_path), ["task", "method"], ["gamma"])
    assert sorted(out["run_id"]) == ["a0", "a1", "c0"]


def test_selection_with_unset_hyper_parameters(tmp_path):
    # bert runs have no alpha (None in config.json): they still form one candidate.
    make_run(tmp_path, "a0", seed=0, alpha=None, three=(0.60, 0.01))
    make_run(tmp_path, "a1", seed=1, alpha=None, three=(0.62, 0.01))
    make_run(tmp_path, "b0", seed=0, method="ssa-co", alpha=0.7, three=(0.60, 0.01))
    make_run(tmp_path, "b1", seed=0, method="ssa-co", alpha=0.9, three=(0.70, 0.01))
    out = select_by_three_subsets(load_runs(tmp_path), ["task", "method"], ["alpha"])
    assert sorted(out["run_id"]) == ["a0", "a1", "b1"]


# ---------------------------------------------------------------- writing

def test_write_tables_md_csv_tex_without_leftovers(tmp_path, grid):
    table = paper_table(grid)
    paths = write_tables(table, "paper", tmp_path / "tables")
    assert [p.name for p in paths] == ["paper.md", "paper.csv", "paper.tex"]
    assert sorted(p.name for p in (tmp_path / "tables").iterdir()) == sorted(
        p.name for p in paths)                                       # no tmp files left
    md = md_cells(paths[0].read_text())
    assert md[0] == ["Model", "Avg", "MRPC", "MNLI", "RTE"]
    assert all(set(cell) <= {"-", ":"} and cell for cell in md[1])     # the separator row
    assert md[4][0] == "SSA-H" and md[4][4] == "71.0** ± 1.0 (n=3)"
    csv = pd.read_csv(paths[1], keep_default_na=False)
    assert list(csv["Model"]) == list(table.index) and csv.loc[2, "RTE"] == "71.0** ± 1.0 (n=3)"
    tex = paths[2].read_text()
    assert "\\begin{tabular}" in tex and "$\\pm$" in tex and "±" not in tex


def test_write_several_tables_in_one_file_set(tmp_path, grid):
    summary, paper = summary_table(grid), paper_table(grid)
    paths = write_tables({"Paper layout": paper, "Summary (seeds)": summary}, "profile", tmp_path)
    assert [p.name for p in paths] == ["profile.md", "profile-paper-layout.csv",
                                       "profile-summary-seeds.csv", "profile.tex"]
    md = (tmp_path / "profile.md").read_text()
    assert "## Paper layout\n" in md and "## Summary (seeds)\n" in md
    assert paper.attrs["caption"] in md                               # the caption under it
    csv = pd.read_csv(tmp_path / "profile-summary-seeds.csv")         # one table per CSV
    assert list(csv.columns[:3]) == ["task", "model", "method"] and len(csv) == len(summary)
    assert list(pd.read_csv(tmp_path / "profile-paper-layout.csv").columns) == [
        "Model", "Avg", "MRPC", "MNLI", "RTE"]
    tex = (tmp_path / "profile.tex").read_text()
    assert tex.count("\\begin{table}") == 2 and tex.count("\\toprule") == 2      # booktabs
    assert "\\label{tab:profile-paper-layout}" in tex and "\\label{tab:profile-summary-seeds}" in tex
    assert "\\caption{Paper layout. Dev metrics x100" in tex and "Holm-Bonferroni" in tex


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    write_tables(pd.DataFrame({"a": [1]}), "t", tmp_path)
    before = (tmp_path / "t.md").read_text()

    def crash(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        write_tables(pd.DataFrame({"a": [2]}), "t", tmp_path)
    assert (tmp_path / "t.md").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.md", "t.tex"]


def test_named_index_levels_become_columns(tmp_path):
    table = summary_table(load_runs([make_run(tmp_path, "a")])).set_index(["task", "method"])
    write_tables(table, "t", tmp_path)
    assert md_cells((tmp_path / "t.md").read_text())[0][:3] == ["task", "method", "model"]


def test_markdown_escapes_pipes_and_blanks_missing_values(tmp_path):
    table = pd.DataFrame({"x": ["a|b"], "y": [np.nan], "z": [0.123456789], "e": [None]})
    write_tables(table, "t", tmp_path)
    assert md_cells((tmp_path / "t.md").read_text())[2] == ["a\\|b", "", "0.123457", ""]


# ---------------------------------------------------------------- the paper's numbers

def test_paper_numbers_spot_checks():
    base = {row.name: row for row in PAPER_RESULTS["base"]}
    assert base["BERT-r"].values["CoLA/mcc"] == 51.8
    assert base["BERT-SSA-H"].values["MNLI/accuracy_mm"] == 84.1
    assert base["BERT-SSA-H"].values["QQP/f1"] == 71.5
    assert base["BERT-SSA-H"].values["QQP/accuracy"] == 89.3
    assert base["BERT-SSA-H"].marks["QQP"] == "**" and base["BERT-SSA-Co"].marks["QQP"] == ""
    assert base["BERT-m"].values["STS-B/spearman"] == 85.4
    assert paper_row("large", "ssa-h").values["MNLI/accuracy"] == 86.2
    assert paper_row("roberta-large", "ssa-h").avg == 84.3
    assert paper_row("roberta-base", "bert").values["RTE/accuracy"] == 73.9
    assert paper_row("large", "ssa-co") is None
    with pytest.raises(ValueError, match="roberta-base"):
        paper_row("xlnet", "bert")


def test_paper_rows_agree_with_their_printed_average():
    # The printed Avg is the GLUE average: each task's metrics averaged, then the nine tasks.
    for rows in PAPER_RESULTS.values():
        for row in rows:
            tasks = [np.mean([v for k, v in row.values.items() if k.startswith(f"{t}/")])
                     for t in PAPER_TASKS]
            assert f"{np.mean(tasks):.1f}" == f"{row.avg:.1f}", row.name


def test_paper_rows_are_verbatim_from_the_paper():
    lines = PAPER_ROWS.read_text(encoding="utf-8").splitlines()
    printed = {line.split("\t", 1)[1] for line in lines if line.count("\t") == 10}
    for rows in PAPER_RESULTS.values():
        for row in rows:
            assert row.text.replace(" | ", "\t") in printed, row.name


def test_a_multitask_run_gives_one_row_per_task(tmp_path):
    run = tmp_path / "multitask-embert-s0-abc"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"task": "multitask", "method": "embert",
                                                 "seed": 0, "model": "minilm"}))
    (run / "metrics.json").write_text(json.dumps({
        "run_id": run.name, "task": "multitask", "method": "embert", "seed": 0, "model": "minilm",
        "status": "ok", "best_dev": {"score": 0.6, "RTE/accuracy": 0.55, "SST-2/accuracy": 0.65},
        "per_task": {"RTE": {"accuracy": 0.55, "score": 0.55},
                     "SST-2": {"accuracy": 0.65, "score": 0.65}},
        "per_task_three_subset": {"RTE": {"mean": 0.54, "std": 0.02},
                                  "SST-2": {"mean": 0.66, "std": 0.01}}}))
    df = load_runs([run])
    assert list(df["task"]) == ["RTE", "SST-2"] and set(df["method"]) == {"embert"}
    assert list(df["score"]) == [0.55, 0.65] and list(df["three_subset_mean"]) == [0.54, 0.66]
    assert not any("/" in c for c in df.columns)


# ---------------------------------------------------------------- statistics a reviewer checks

def test_holm_across_the_table_removes_marks_the_raw_tests_give(tmp_path):
    # Three tasks, each SSA-H 3 points above BERT-r with sd 1 over 3 seeds: Welch t = 3.674,
    # df = 4, raw p = 0.0213 each ("*" uncorrected). Holm over the m = 3 comparisons: the
    # smallest p x 3 = 0.064, and the others may not fall below it: no mark survives.
    for task, metric in (("CoLA", "mcc"), ("SST-2", "accuracy"), ("RTE", "accuracy")):
        for seed in range(3):
            for method, base in (("bert", 0.60), ("ssa-h", 0.63)):
                value = base + seed / 100
                make_run(tmp_path, f"{task}-{method}-{seed}", task=task, method=method,
                         seed=seed, dev={metric: value, "score": value})
    runs = load_runs(tmp_path)
    tests = comparisons(runs)
    raw = welch_test([0.63, 0.64, 0.65], [0.60, 0.61, 0.62])
    assert raw == pytest.approx(0.02131, abs=1e-5) and significance_mark(raw) == "*"
    assert list(tests["task"]) == ["CoLA", "SST-2", "RTE"] and set(tests["method"]) == {"ssa-h"}
    assert tests["p"].tolist() == pytest.approx([raw] * 3)
    assert tests["p_holm"].tolist() == pytest.approx([3 * raw] * 3)
    assert tests["diff"].tolist() == pytest.approx([3.0] * 3) and (tests["mark"] == "").all()
    table = paper_table(runs)
    assert table.loc["SSA-H", "RTE"] == "64.0 ± 1.0 (n=3)"                    # no mark
    assert "Holm-Bonferroni-corrected across the table's 3 comparisons" in table.attrs["caption"]
    assert "the task score" in table.attrs["caption"]
    # with two of the three tasks, Holm gives 2 x 0.0213 = 0.043: marked
    two = paper_table(runs[runs["task"] != "CoLA"])
    assert two.loc["SSA-H", "RTE"] == "64.0* ± 1.0 (n=3)"


def test_exact_permutation_test_option(tmp_path):
    # 3 vs 3 seeds, completely separated: p = 2/20 = 0.1, the smallest 3 vs 3 can give
    for seed in range(3):
        make_run(tmp_path, f"b{seed}", seed=seed, dev=acc(0.60 + seed / 100))
        make_run(tmp_path, f"h{seed}", method="ssa-h", seed=seed, dev=acc(0.70 + seed / 100))
    runs = load_runs(tmp_path)
    tests = comparisons(runs, test="permutation")
    assert tests["p"].tolist() == pytest.approx([0.1]) and tests["mark"].tolist() == [""]
    table = paper_table(runs, test="permutation")
    assert table.loc["SSA-H", "RTE"] == "71.0 ± 1.0 (n=3)"
    assert "exact permutation test" in table.attrs["caption"]
    assert paper_table(runs).loc["SSA-H", "RTE"] == "71.0** ± 1.0 (n=3)"       # Welch
    with pytest.raises(ValueError, match="permutation"):
        comparisons(runs, test="bootstrap")


def test_degenerate_cells_are_flagged_and_left_out_of_avg(tmp_path):
    # CoLA: BERT-r predicts the majority class on every seed (MCC 0.0 each time)
    for seed in range(3):
        make_run(tmp_path, f"cb{seed}", task="CoLA", seed=seed, dev={"mcc": 0.0, "score": 0.0})
        make_run(tmp_path, f"ch{seed}", task="CoLA", method="ssa-h", seed=seed,
                 dev={"mcc": 0.1 * seed, "score": 0.1 * seed})
        make_run(tmp_path, f"rb{seed}", seed=seed, dev=acc(0.60 + seed / 100))
        make_run(tmp_path, f"rh{seed}", method="ssa-h", seed=seed, dev=acc(0.62 + seed / 100))
    runs = load_runs(tmp_path)
    table = paper_table(runs)
    assert table.loc["BERT-r", "CoLA"] == "0.0† ± 0.0 (n=3)"
    assert table.loc["SSA-H", "CoLA"] == "10.0 ± 10.0 (n=3)"
    # CoLA has a degenerate cell: every row's Avg is over RTE alone
    assert table.loc["BERT-r", "Avg"] == "61.0" and table.loc["SSA-H", "Avg"] == "63.0"
    assert "leaving out CoLA" in table.attrs["caption"]
    tests = comparisons(runs).set_index("task")
    assert tests.loc["CoLA", "degenerate"] and not tests.loc["RTE", "degenerate"]
    summary = summary_table(runs).set_index("task")
    assert summary.loc["CoLA"].set_index("method")["degenerate"].to_dict() == {
        "bert": True, "ssa-h": False}


def test_epoch_views_last_and_heldout(tmp_path):
    # epoch 0: full dev 0.70, subsets (0.60, 0.75, 0.75); epoch 1: full dev 0.66, subsets
    # (0.70, 0.64, 0.64). Best on the full dev set: epoch 0 (0.70, reported on the same rows).
    # Held out: subset 1 picks epoch 1 (0.70 > 0.60), reported on subsets 2-3: 0.64. Last: 0.66.
    per_epoch = [(acc(0.70), [0.60, 0.75, 0.75]), (acc(0.66), [0.70, 0.64, 0.64])]
    for seed in range(2):
        make_run(tmp_path, f"b{seed}", seed=seed, per_epoch=per_epoch)
    runs = load_runs(tmp_path)
    assert runs["heldout_epoch"].tolist() == [1, 1]
    assert runs["heldout_score"].tolist() == pytest.approx([0.64, 0.64])
    assert runs["last_score"].tolist() == [0.66, 0.66] and runs["score"].tolist() == [0.70] * 2
    assert paper_table(runs).loc["BERT-r", "RTE"] == "70.0† ± 0.0 (n=2)"
    last = paper_table(runs, epoch="last")
    assert last.loc["BERT-r", "RTE"] == "66.0† ± 0.0 (n=2)"
    assert "last epoch (no selection on dev)" in last.attrs["caption"]
    held = paper_table(runs, epoch="heldout")
    assert held.loc["BERT-r", "RTE"] == "64.0† ± 0.0 (n=2)"
    assert "chosen on dev subset 1 of 3" in held.attrs["caption"]
    views = epoch_table(runs)
    assert views.loc[0, ["best", "last", "heldout"]].tolist() == [
        "70.0 ± 0.0", "66.0 ± 0.0", "64.0 ± 0.0"]
    with pytest.raises(ValueError, match="heldout"):
        paper_table(runs, epoch="first")
    make_run(tmp_path, "b2", seed=2, dev=acc(0.7))        # recorded no per-epoch subsets
    held = paper_table(load_runs(tmp_path), epoch="heldout")
    assert held.loc["BERT-r", "RTE"] == "64.0† ± 0.0 (n=2 of 3, 1 missing)"


def test_runs_table_keeps_the_fields_that_vary(tmp_path):
    for seed in range(2):
        make_run(tmp_path, f"b{seed}", seed=seed, dev=acc(0.6 + seed / 10), lr=1e-4)
    table = runs_table(load_runs(tmp_path))
    assert list(table.columns[:6]) == ["run_id", "task", "method", "seed", "status", "score"]
    assert "accuracy" in table.columns and "three_subset_mean" not in table.columns
    assert not {"lr", "gamma", "run_dir", "model"} & set(table.columns)


def test_target_loss_is_read_from_the_history(tmp_path):
    make_run(tmp_path, "b", history={"step": [1, 2], "loss": [0.7, 0.5]})
    make_run(tmp_path, "h", method="ssa-h", history={
        "step": [1, 2], "loss": [0.49, 0.45], "loss_target": [0.7, 0.55], "loss_ssa": [0, 0.35]})
    make_run(tmp_path, "x")
    runs = load_runs(tmp_path).set_index("run_id")
    assert runs["train_loss_target"].tolist()[:2] == [0.5, 0.55]
    assert np.isnan(runs.loc["x", "train_loss_target"])


def test_budget_view_uses_a_methods_default_runs_where_it_has_none(tmp_path):
    for seed in range(2):
        make_run(tmp_path, f"b{seed}", seed=seed)
        make_run(tmp_path, f"m{seed}", method="bert-mask", seed=seed)
        make_run(tmp_path, f"e{seed}", method="bert-mask", seed=seed, budget="equal_steps")
    make_run(tmp_path, "c0", task="CoLA", method="bert-mask", seed=0)    # no equal_steps run
    runs = load_runs(tmp_path)
    assert sorted(budget_view(runs, "equal_steps")["run_id"]) == ["b0", "b1", "c0", "e0", "e1"]
    assert sorted(budget_view(runs, "epochs")["run_id"]) == ["b0", "b1", "c0", "m0", "m1"]


def test_tex_captions_are_escaped(tmp_path, grid):
    write_tables({"Comparisons": comparisons(grid)}, "t", tmp_path)
    tex = (tmp_path / "t.tex").read_text()
    assert "p\\_holm: Holm-Bonferroni across these 4 comparisons" in tex
    assert "\\label{tab:t-comparisons}" in tex


def test_paper_profiles_get_the_papers_rows_by_default():
    assert paper_profile("paper-small") and paper_profile("params/paper-small-cpu.yaml")
    assert paper_profile("roberta") and not paper_profile("glue-small")
    assert not paper_profile("smoke") and not paper_profile(None) and not paper_profile("")
