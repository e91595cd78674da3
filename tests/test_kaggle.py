"""Kaggle-style CSV tasks with k folds: fold assignment through the CSV loader, the fold knobs'
validation, a tiny k-fold fit, the per-fold / out-of-fold report, the kaggle notebook through
papermill and the shipped profiles (kaggle-stsb, guiding-rte)."""
import dataclasses
import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
import yaml

from kit import batch
from kit.config.notebook_cells import assignments
from kit.config.profiles import read_spec
from kit.results.frame import collect
from kit.results.tables import fold_tables, table_sets, writers
from kit.config.run_config import ConfigError, RunConfig
from kit.data.pipeline import load_task_data
from kit.data.readers import DataError
from kit.results.tables.paper_table import paper_table
from kit.results.tables.build import summary_table

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "tests" / "fixtures" / "stsb_pairs.csv"          # 200 real STS-B dev pairs
TRAIN_1500 = REPO / "tests" / "fixtures" / "stsb_train_1500.csv"  # 1500 real STS-B train pairs
STSB_TEST = REPO / "tests" / "fixtures" / "stsb_test_30.csv"   # first 30 GLUE STS-B test pairs
CSV = dict(task="csv", csv_path=str(PAIRS), csv_text_columns=("sentence1", "sentence2"),
           csv_target="score")


def folds_of(n_folds=5, **extra):
    """(train ids, dev ids) of every fold."""
    out = []
    for fold in range(n_folds):
        data = load_task_data(RunConfig(**{**CSV, **extra}, n_folds=n_folds, fold=fold))
        out.append((data.train.ids, data.dev["dev"].ids))
    return out


# ---------------------------------------------------------------- folds through the CSV loader

def test_folds_are_deterministic_disjoint_and_cover_the_file():
    all_ids = pd.read_csv(PAIRS, dtype=str)["id"].tolist()
    folds = folds_of()
    devs = [set(dev) for _, dev in folds]
    assert sum(map(len, devs)) == len(all_ids) == 200
    assert set().union(*devs) == set(all_ids)                     # covering
    assert all(not (a & b) for i, a in enumerate(devs) for b in devs[i + 1:])   # disjoint
    for train, dev in folds:                                      # train = every other row
        assert not set(train) & set(dev) and len(train) + len(dev) == 200
        assert len(dev) == 40
    assert folds == folds_of()                                    # deterministic
    assert folds == folds_of(seed=7)       # a property of the data: the same for every seed


def test_regression_folds_are_stratified_on_the_target():
    target = pd.read_csv(PAIRS)["score"]
    for fold in range(5):
        dev = load_task_data(RunConfig(**CSV, n_folds=5, fold=fold)).dev["dev"].labels
        assert abs(dev.mean() - target.mean()) < 0.2 and dev.min() < 0.5 and dev.max() > 4.5


def test_without_folds_the_seeded_80_20_split_is_kept():
    data = load_task_data(RunConfig(**CSV))
    assert len(data.dev["dev"]) == 40 and len(data.train) == 160
    assert data.dev["dev"].ids != load_task_data(RunConfig(**CSV, seed=1)).dev["dev"].ids


def test_max_train_examples_caps_fold_train_only():
    data = load_task_data(RunConfig(**CSV, n_folds=5, fold=2, max_train_examples=50))
    assert len(data.train) == 50 and len(data.dev["dev"]) == 40


def write_csv(tmp_path, rows, header="text,label,fold") -> Path:
    path = tmp_path / "data.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def test_a_given_fold_column_is_respected(tmp_path):
    # fold values 1..3 (sorted distinct values become folds 0..2); labels are classes
    rows = [f"row {i},{'pos' if i % 2 else 'neg'},{1 + i % 3}" for i in range(30)]
    cfg = dict(task="csv", csv_path=str(write_csv(tmp_path, rows)), csv_text_columns=("text",),
               csv_target="label", csv_regression=False, csv_fold_column="fold", n_folds=3)
    for fold in range(3):
        data = load_task_data(RunConfig(**cfg, fold=fold))
        dev_rows = sorted(int(i) for i in data.dev["dev"].ids)
        assert dev_rows == [i for i in range(30) if i % 3 == fold]
        assert len(data.train) == 20 and data.task.labels == ("neg", "pos")


def test_classification_folds_are_stratified(tmp_path):
    rows = [f"text {i},{'a' if i < 80 else 'b'},0" for i in range(100)]   # 80 a, 20 b
    cfg = dict(task="csv", csv_path=str(write_csv(tmp_path, rows)), csv_text_columns=("text",),
               csv_target="label", csv_regression=False, n_folds=4)
    for fold in range(4):
        dev = load_task_data(RunConfig(**cfg, fold=fold)).dev["dev"]
        assert np.bincount(dev.labels, minlength=2).tolist() == [20, 5]


def test_fold_problems_name_the_file(tmp_path):
    rows = [f"t{i},{i % 2},{i % 2}" for i in range(10)]                   # 2 fold values
    path = write_csv(tmp_path, rows)
    cfg = dict(task="csv", csv_path=str(path), csv_text_columns=("text",), csv_target="label",
               csv_fold_column="fold", n_folds=3)
    with pytest.raises(DataError, match="data.csv.*3 folds"):
        load_task_data(RunConfig(**cfg))
    with pytest.raises(DataError, match="no column 'split'"):
        load_task_data(RunConfig(**{**cfg, "csv_fold_column": "split"}))


# ---------------------------------------------------------------- config

@pytest.mark.parametrize("bad, needle", [
    ({"n_folds": 1}, "n_folds"), ({"n_folds": -2}, "n_folds"),
    ({"n_folds": 5, "fold": 5}, "fold"), ({"n_folds": 5, "fold": -1}, "fold"),
    ({"fold": 1}, "fold"), ({"csv_fold_column": "fold"}, "csv_fold_column"),
    ({"n_folds": "5"}, "n_folds"), ({"fold": 1.0, "n_folds": 5}, "fold")])
def test_fold_knobs_are_validated(bad, needle):
    with pytest.raises(ConfigError, match=needle):
        RunConfig.from_dict({**CSV, **bad})


def test_folds_only_for_csv_tasks():
    with pytest.raises(ConfigError, match="n_folds.*csv"):
        RunConfig.from_dict({"task": "RTE", "n_folds": 5})


def test_fold_knobs_valid_and_in_the_run_id():
    a = RunConfig.from_dict({**CSV, "n_folds": 5, "fold": 4, "csv_fold_column": "kfold"})
    assert (a.n_folds, a.fold, a.csv_fold_column) == (5, 4, "kfold")
    ids = {RunConfig.from_dict({**CSV, "n_folds": 5, "fold": f}).run_id for f in range(5)}
    assert len(ids) == 5
    # defaults leave the ids of earlier runs alone
    assert RunConfig.from_dict({**CSV, "n_folds": 0, "fold": 0}).run_id == RunConfig(**CSV).run_id


# ---------------------------------------------------------------- a tiny k-fold fit

def test_tiny_fit_on_one_fold_of_the_csv_fixture(tmp_path):
    from kit.train.finetune import fit
    from kit.runs import run_dir_of
    cfg = RunConfig(**CSV, n_folds=5, fold=0, model="tiny", epochs=2, lr=1e-3, batch_size=16,
                    layer_decay=0.9, save_checkpoints=False, outputs_dir=str(tmp_path))
    m = fit(cfg)
    assert m["status"] == "ok"
    assert {"rmse", "mse", "pearson", "spearman"} <= set(m["best_dev"])
    assert m["best_dev"]["mse"] == pytest.approx(m["best_dev"]["rmse"] ** 2)
    dev = pd.read_csv(run_dir_of(cfg) / "predictions" / "dev.tsv", sep="\t", dtype={"index": str})
    fold0 = load_task_data(cfg).dev["dev"].ids
    assert sorted(dev["index"]) == sorted(fold0) and len(dev) == 40
    oof = fold_tables.oof_predictions([run_dir_of(cfg)])
    assert len(oof) == 40 and (oof["fold"] == 0).all()
    assert fold_tables.fold_run_dirs(cfg)[0] == run_dir_of(cfg)



def long_and_short_csv(tmp_path) -> Path:
    """40 rows of "good" (one word-piece: n words are n + 2 tokens) in folds i % 2: rows 0, 5,
    .., 35 are 20 + i words long, the rest 5 words."""
    words = [20 + i if i % 5 == 0 else 5 for i in range(40)]
    path = tmp_path / "long.csv"
    pd.DataFrame({"text": [" ".join(["good"] * n) for n in words],
                  "target": [float(i % 3) for i in range(40)],
                  "fold": [i % 2 for i in range(40)]}).to_csv(path, index=False)
    return path


def test_a_run_warns_once_with_the_share_of_rows_max_length_cut(tmp_path, monkeypatch, capsys):
    """Fold 0 validates: dev is the even rows (long: 0, 10, 20, 30; the longest 30 + 22 = 52
    tokens), train the odd ones (5, 15, 25, 35; 57 tokens). One line, also when the next run
    reads the splits from the token cache; none when max_length cuts nothing."""
    from kit.data import token_cache
    from kit.train.finetune import fit
    monkeypatch.setenv("SSA_KIT_PROGRESS", "lines")
    cfg = RunConfig(task="csv", csv_path=str(long_and_short_csv(tmp_path)),
                    csv_text_columns=("text",), csv_target="target", csv_fold_column="fold",
                    n_folds=2, fold=0, model="tiny", epochs=1, batch_size=8, max_length=16,
                    save_checkpoints=False, outputs_dir=str(tmp_path / "outputs"))

    def warnings_of(c: RunConfig) -> tuple[list[str], dict]:
        capsys.readouterr()
        metrics = fit(c)
        assert metrics["status"] == "ok"
        err = capsys.readouterr().err.splitlines()
        return [line for line in err if line.startswith("warning:")], metrics.get("truncation")

    lines, counts = warnings_of(cfg)
    assert lines == ["warning: train: 4 of 20 rows (20.0%), dev: 4 of 20 rows (20.0%) truncated "
                     "to max_length 16 (longest 57 tokens)"]
    assert counts == {"train": {"rows": 20, "truncated": 4, "longest": 57},
                      "dev": {"rows": 20, "truncated": 4, "longest": 52}}
    monkeypatch.setattr(token_cache, "tokenize", lambda *a: pytest.fail("tokenized again"))
    assert warnings_of(dataclasses.replace(cfg, seed=1)) == (lines, counts)
    monkeypatch.undo()
    monkeypatch.setenv("SSA_KIT_PROGRESS", "lines")
    lines, counts = warnings_of(dataclasses.replace(cfg, max_length=64))
    assert lines == [] and counts == {"train": {"rows": 20, "truncated": 0, "longest": 57},
                                      "dev": {"rows": 20, "truncated": 0, "longest": 52}}

# ---------------------------------------------------------------- report on hand-made runs

def make_fold_run(root: Path, fold: int, preds: dict, n_folds=3, status="ok", seed=0, lr=1e-4,
                  regression=True) -> Path:
    """A k-fold run folder as fit() writes it: config.json, metrics.json, predictions/dev.tsv.
    `preds`: CSV row id -> (prediction, label)."""
    run_dir = root / f"csv-f{fold}-s{seed}-lr{lr}"
    (run_dir / "predictions").mkdir(parents=True)
    config = {**RunConfig(**CSV, n_folds=n_folds, fold=fold, seed=seed, lr=lr,
                          csv_regression=regression).to_dict(), "outputs_dir": str(root)}
    (run_dir / "config.json").write_text(json.dumps(config))
    y = np.array([p[1] for p in preds.values()])
    p = np.array([p[0] for p in preds.values()])
    if regression:
        dev = {"rmse": float(np.sqrt(np.mean((p - y) ** 2))), "mse": float(np.mean((p - y) ** 2)),
               "pearson": float(np.corrcoef(p, y)[0, 1]) if len(y) > 1 else 0.0, "spearman": 0.5}
        dev["score"] = -dev["rmse"]
        fmt = "{:.4f}".format
    else:
        dev = {"accuracy": float(np.mean(p == y)), "f1_macro": 0.5}
        dev["score"] = dev["accuracy"]
        fmt = str
    metrics = ({"status": "failed", "error": "boom", "task": "csv", "model": "minilm",
                "method": "bert", "seed": seed} if status == "failed" else
               {"status": "ok", "error": None, "task": "csv", "model": "minilm", "method": "bert",
                "seed": seed, "best_epoch": 1, "best_dev": dev,
                "best_three_subset": {"mean": dev["score"], "std": 0.0}})
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    rows = ["index\tprediction\tlabel"] + [f"{i}\t{fmt(a)}\t{fmt(b)}" for i, (a, b) in preds.items()]
    (run_dir / "predictions" / "dev.tsv").write_text("\n".join(rows) + "\n")
    return run_dir


FOLD_PREDS = [{"r0": (1.0, 1.5), "r3": (2.0, 2.0)},
              {"r1": (3.0, 4.0), "r4": (0.0, 0.5)},
              {"r2": (2.5, 2.0), "r5": (4.0, 4.5)}]


def test_fold_table_and_out_of_fold_score(tmp_path):
    dirs = [make_fold_run(tmp_path, f, preds) for f, preds in enumerate(FOLD_PREDS)]
    runs = collect.load_runs(dirs)
    table = fold_tables.fold_table(runs)
    assert list(table["fold"][:3]) == ["0", "1", "2"]
    assert list(table["best_epoch"][:3]) == [2, 2, 2]      # metrics.json's 1, counted from 1
    assert table["fold"].iloc[3] == "mean ± std (n=3/3)"
    rmse = runs.sort_values("fold")["rmse"]
    assert table["rmse"].iloc[3] == f"{rmse.mean():.4f} ± {rmse.std():.4f}"
    assert {"rmse", "mse", "pearson", "spearman"} <= set(table.columns)

    oof = fold_tables.oof_predictions(dirs)
    assert sorted(oof["index"]) == ["r0", "r1", "r2", "r3", "r4", "r5"]
    assert oof["config_key"].nunique() == 1 and oof["prediction"].dtype == float
    scores = fold_tables.oof_metrics(oof).iloc[0]
    p = np.array([v[0] for d in FOLD_PREDS for v in d.values()])
    y = np.array([v[1] for d in FOLD_PREDS for v in d.values()])
    assert scores["rmse"] == pytest.approx(np.sqrt(np.mean((p - y) ** 2)))
    assert scores["mse"] == pytest.approx(np.mean((p - y) ** 2))
    assert scores["pearson"] == pytest.approx(np.corrcoef(p, y)[0, 1])
    assert scores["folds"] == "3/3" and scores["complete"] and scores["rows"] == 6

    tables = table_sets.profile_tables(runs, varying=["fold"])
    assert "Paper layout (Table 2)" not in tables
    assert any(t.startswith("Folds") for t in tables) and any(t.startswith("Out-of-fold")
                                                               for t in tables)
    writers.write_tables(tables, "kaggle", tmp_path / "tables")
    assert "mean ± std (n=3/3)" in (tmp_path / "tables" / "kaggle.md").read_text()
    # folds are dev sets of their own: never averaged over as if they were seeds
    summary = summary_table(runs)
    assert len(summary) == 3 and (summary["n_seeds"] == 1).all()
    assert paper_table(runs).empty


def test_oof_of_a_fixed_epoch(tmp_path):
    dirs = [make_fold_run(tmp_path, f, preds) for f, preds in enumerate(FOLD_PREDS)]
    with pytest.raises(ValueError, match="dev_epoch1.tsv"):
        fold_tables.oof_predictions(dirs, epoch=1)
    for d in dirs:     # what a run saving every epoch's predictions adds
        (d / "predictions" / "dev_epoch1.tsv").write_text(
            (d / "predictions" / "dev.tsv").read_text())
    oof = fold_tables.oof_predictions(dirs, epoch=1)
    assert len(oof) == 6 and oof.equals(fold_tables.oof_predictions(dirs))


def test_failed_fold_and_mixed_fold_sets(tmp_path):
    dirs = [make_fold_run(tmp_path, f, preds, status="failed" if f == 1 else "ok")
            for f, preds in enumerate(FOLD_PREDS)]
    table = fold_tables.fold_table(collect.load_runs(dirs))
    assert table["fold"].iloc[-1] == "mean ± std (n=2/3)"
    assert list(table["status"][:3]) == ["ok", "failed", "ok"]
    scores = fold_tables.oof_metrics(fold_tables.oof_predictions(dirs)).iloc[0]
    assert scores["folds"] == "2/3" and not scores["complete"] and scores["rows"] == 4
    # a second lr is a second set: two OOF rows, and the fold table needs by=["lr"]
    other = [make_fold_run(tmp_path, f, preds, lr=2e-4) for f, preds in enumerate(FOLD_PREDS)]
    runs = collect.load_runs(dirs + other)
    assert len(fold_tables.oof_metrics(fold_tables.oof_predictions(dirs + other))) == 2
    with pytest.raises(ValueError, match="several OK runs for one fold"):
        fold_tables.fold_table(runs)
    assert len(fold_tables.fold_table(runs, by=["lr"])) == 8
    # one row in two folds of one set: mixed fold assignments
    bad = make_fold_run(tmp_path / "bad", 0, {"r0": (1.0, 1.5)})
    clash = make_fold_run(tmp_path / "bad", 1, {"r0": (2.0, 1.5)})
    with pytest.raises(ValueError, match="'r0'.*folds \\[0, 1\\]"):
        fold_tables.oof_predictions([bad, clash])


def test_oof_classification(tmp_path):
    preds = [{"a": ("pos", "pos"), "b": ("neg", "pos")}, {"c": ("neg", "neg"), "d": ("pos", "pos")}]
    dirs = [make_fold_run(tmp_path, f, p, n_folds=2, regression=False) for f, p in enumerate(preds)]
    scores = fold_tables.oof_metrics(fold_tables.oof_predictions(dirs)).iloc[0]
    assert scores["accuracy"] == 0.75 and scores["complete"]


def make_glue_run(root: Path, run_id: str, seed: int, accuracy: float, guide_loss: str):
    (root / run_id).mkdir(parents=True)
    config = RunConfig(task="RTE", seed=seed, guide_loss=guide_loss).to_dict()
    (root / run_id / "config.json").write_text(json.dumps(config))
    dev = {"accuracy": accuracy, "score": accuracy}
    (root / run_id / "metrics.json").write_text(json.dumps({
        "status": "ok", "task": "RTE", "model": "minilm", "method": "bert", "seed": seed,
        "best_epoch": 0, "best_dev": dev, "best_three_subset": {"mean": accuracy, "std": 0.0}}))


def test_profile_tables_group_on_varying_knobs(tmp_path):
    for seed in range(2):
        make_glue_run(tmp_path, f"t{seed}", seed, 0.6 + seed / 100, "task")
        make_glue_run(tmp_path, f"b{seed}", seed, 0.7 + seed / 100, "task+both")
    runs = collect.load_runs(tmp_path)
    tables = table_sets.profile_tables(runs, varying=["guide_loss", "seed"])
    summary = tables["Summary (mean ± std over seeds)"].set_index("guide_loss")
    assert summary.loc["task+both", "accuracy_mean"] == pytest.approx(0.705)
    assert (summary["n_seeds"] == 2).all() and "Paper layout (Table 2)" not in tables
    # knobs that do not change results, or that are set per task, are no grouping axes
    plain = collect.load_runs([tmp_path / "t0", tmp_path / "t1"])
    assert "Paper layout (Table 2)" in table_sets.profile_tables(
        plain.assign(glue_dir=["a", "b"]), varying=["glue_dir", "seed"])
    beta = plain.assign(task=["RTE", "WNLI"], beta=[0.5, 0.9])
    assert "Paper layout (Table 2)" in table_sets.profile_tables(beta, varying=["task", "beta"])


# ---------------------------------------------------------------- notebook and profiles

NOTEBOOK = REPO / "notebooks" / "kaggle_csv.ipynb"


def test_kaggle_notebook_is_thin_and_clean():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and nb.cells[0].cell_type == "markdown"
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert all(c.get("id") for c in nb.cells)
    assert not any(line.lstrip().startswith(("def ", "class ")) for c in code
                   for line in c.source.splitlines())
    names = [line.split("=")[0].strip() for line in tagged[0].source.splitlines()
             if "=" in line and not line.startswith("#")]
    # RunConfig fields, once each, and all_folds, the one name the notebook keeps for itself
    # (tests/test_run.py checks the cell's names and defaults)
    assert len(names) == len(set(names))
    assert set(names) - set(RunConfig.__dataclass_fields__) == {"all_folds"}


def test_kaggle_notebook_through_papermill(tmp_path, run_notebook):
    out = tmp_path / "executed.ipynb"
    run_notebook(NOTEBOOK, out, outputs_dir=str(tmp_path / "outputs"), csv_path=str(PAIRS))
    runs = list((tmp_path / "outputs" / "runs").iterdir())
    assert len(runs) == 1
    metrics = json.loads((runs[0] / "metrics.json").read_text())
    assert metrics["status"] == "ok" and "rmse" in metrics["best_dev"]
    text = out.read_text()
    assert "mean ± std (n=1/5)" in text and "1/5" in text
    # the default test file: fold 0's submission, and the fold average of the one finished fold
    test_ids = pd.read_csv(STSB_TEST, dtype=str)["id"].tolist()
    fold0 = pd.read_csv(runs[0] / "submission.csv", dtype={"id": str})
    assert fold0["id"].tolist() == test_ids and list(fold0.columns) == ["id", "score"]
    averaged = pd.read_csv(tmp_path / "outputs" / "submissions" / f"{runs[0].name}-folds.csv",
                           dtype={"id": str})
    pd.testing.assert_frame_equal(averaged, fold0)


def test_the_kaggle_pages_five_folds_in_one_run_all(tmp_path, run_notebook):
    """docs/kaggle.md's JupyterLab step: `all_folds = True`, Run All. Five fold runs of the
    notebook's config, and the submission where the page says: the mean of the five folds'
    submission.csv under outputs/submissions/<fold-0 run id>-folds.csv, the test file's ids in
    its order."""
    outputs = tmp_path / "outputs"
    out = tmp_path / "executed.ipynb"
    run_notebook(NOTEBOOK, out, outputs_dir=str(outputs), all_folds=True)
    made = sorted((outputs / "runs").iterdir())
    configs = [json.loads((d / "config.json").read_text()) for d in made]
    assert sorted(c["fold"] for c in configs) == [0, 1, 2, 3, 4]
    assert all(json.loads((d / "metrics.json").read_text())["status"] == "ok" for d in made)
    fold0 = next(d for d, c in zip(made, configs) if c["fold"] == 0)
    page = (REPO / "docs" / "kaggle.md").read_text()
    assert "outputs/submissions/<fold-0 run id>-folds.csv" in page and "all_folds = True" in page
    submission = pd.read_csv(outputs / "submissions" / f"{fold0.name}-folds.csv", dtype={"id": str})
    folds = [pd.read_csv(d / "submission.csv", dtype={"id": str}) for d in made]
    assert submission["id"].tolist() == pd.read_csv(STSB_TEST, dtype=str)["id"].tolist()
    np.testing.assert_allclose(submission["score"], sum(f["score"] for f in folds) / 5)
    assert "mean ± std (n=5/5)" in out.read_text()


def test_shipped_kaggle_and_guiding_profiles():
    kaggle = batch.load_profile("kaggle-stsb")
    assert [p["fold"] for p in kaggle.points] == [0, 1, 2, 3, 4]
    assert kaggle.notebook == NOTEBOOK
    cfgs = [RunConfig.from_dict(p) for p in kaggle.points]
    assert all(c.n_folds == 5 and c.model == "minilm" and c.csv_regression for c in cfgs)
    assert (REPO / cfgs[0].csv_path).resolve() == TRAIN_1500
    assert TRAIN_1500.stat().st_size < 300_000
    frame = pd.read_csv(TRAIN_1500)
    assert len(frame) == 1500 and frame["id"].is_unique
    assert frame["score"].between(0, 5).all()
    guiding = batch.load_profile("guiding-rte")
    grid = {(p["guide_loss"], p["seed"]) for p in guiding.points}
    assert grid == {(g, s) for g in ("task", "task+both") for s in (0, 1, 2)}
    assert all(p["task"] == "RTE" and p["model"] == "minilm" for p in guiding.points)


def notebook_cell() -> dict:
    """The RunConfig fields the notebook's parameters cell sets, and their values (all_folds,
    the notebook's own name, left out)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    return {k: v for k, v in assignments(cell.source, {}).items() if k != "all_folds"}


# the batch sets outputs_dir (--outputs); every other parameter of the cell is a profile's to set
BATCH_SETS = {"outputs_dir"}


def test_the_kaggle_pages_profile_is_the_notebooks_five_fold_runs(tmp_path):
    """docs/kaggle.md: its profile is "the same five runs" as its notebook cell with
    `all_folds = True`. The notebook's runs are its parameters cell with the page's values
    over it, one per fold (the notebook's `dataclasses.replace(config, fold=f)`); the profile's
    are its points. A parameter the template leaves out takes RunConfig's default (batch_size
    32, layer_decay 1.0) where the notebook's cell has its own (16, 0.9): other run ids."""
    page = (REPO / "docs" / "kaggle.md").read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", page, re.S)
    cell = next(b for lang, b in blocks if lang == "python" and "all_folds = True" in b)
    template = next(b for lang, b in blocks if lang == "yaml" and "notebook: kaggle_csv" in b)
    params = {**notebook_cell(), **assignments(cell, {})}
    params.pop("all_folds")
    config = RunConfig.from_dict(params)
    notebook_ids = [dataclasses.replace(config, fold=f).run_id for f in range(config.n_folds)]
    (tmp_path / "my-task.yaml").write_text(template)
    profile = batch.load_profile(str(tmp_path / "my-task.yaml"))
    assert [RunConfig.from_dict(p).run_id for p in profile.points] == notebook_ids
    assert set(notebook_cell()) - BATCH_SETS <= set(yaml.safe_load(template)["grid"])


def test_the_kaggle_profile_sets_every_parameter_of_the_notebooks_cell():
    """params/kaggle-stsb.yaml says so: the notebook's cell set to a point's values gives that
    point's run id (a parameter the profile left out would keep the cell's value there, the
    test file stsb_test_30.csv say, and RunConfig's default in the batch)."""
    cell = notebook_cell()
    profile = batch.load_profile("kaggle-stsb")
    assert ([RunConfig.from_dict({**cell, **point}).run_id for point in profile.points]
            == [RunConfig.from_dict(point).run_id for point in profile.points])
    assert set(cell) - BATCH_SETS <= set(read_spec(profile.path)["grid"])


# ---------------------------------------------------------------- test file -> submission.csv

def write_sentiment(tmp_path) -> tuple[Path, Path, list[str]]:
    """A small classification CSV (class names as targets) and a test CSV whose ids are
    neither sorted nor numbers, one text holding a comma."""
    words = {"positive": ["good", "great", "fine"], "negative": ["bad", "awful", "poor"]}
    rows = [f"{i},the film was {words[label][i % 3]} today,{label}"
            for i, label in enumerate(["positive", "negative"] * 30)]
    train = tmp_path / "train.csv"
    train.write_text("id,review,sentiment\n" + "\n".join(rows) + "\n")
    ids = ["q-17", "a3", "0009", "zz", "b,1"]
    texts = ["so good", "awful, really", "the film was great", "bad bad", "fine"]
    test = tmp_path / "test.csv"
    pd.DataFrame({"review": texts, "key": ids}).to_csv(test, index=False)
    return train, test, ids


def sentiment_cfg(tmp_path, **extra) -> RunConfig:
    train, test, _ = write_sentiment(tmp_path)
    return RunConfig.from_dict({
        "task": "csv", "csv_path": str(train), "csv_text_columns": "review",
        "csv_target": "sentiment", "csv_regression": False, "csv_test_path": str(test),
        "csv_id_column": "key", "model": "tiny", "epochs": 2, "lr": 1e-3, "batch_size": 16,
        "outputs_dir": str(tmp_path / "out"), **extra})


def test_csv_test_file_gives_submission_with_ids_in_order_and_class_names(tmp_path):
    from kit.train.finetune import fit
    from kit.runs import run_dir_of
    cfg = sentiment_cfg(tmp_path)
    assert fit(cfg)["status"] == "ok"
    sub = pd.read_csv(run_dir_of(cfg) / "submission.csv", dtype=str, keep_default_na=False)
    _, _, ids = write_sentiment(tmp_path)
    assert list(sub.columns) == ["key", "sentiment"]
    assert sub["key"].tolist() == ids                              # the test file's order
    assert set(sub["sentiment"]) <= {"negative", "positive"}
    test_tsv = pd.read_csv(run_dir_of(cfg) / "predictions" / "test.tsv", sep="\t", dtype=str,
                           keep_default_na=False)
    assert test_tsv["prediction"].tolist() == sub["sentiment"].tolist()
    # without save_checkpoints the best epoch's checkpoint is written all the same, read back
    # for the submission, then removed with checkpoint/: the same submission
    unkept = dataclasses.replace(cfg, save_checkpoints=False, outputs_dir=str(tmp_path / "o2"))
    fit(unkept)
    assert (run_dir_of(unkept) / "submission.csv").read_text() == \
        (run_dir_of(cfg) / "submission.csv").read_text()
    assert not (run_dir_of(unkept) / "checkpoint").exists()


def test_test_file_problems_are_one_line(tmp_path):
    train, test, _ = write_sentiment(tmp_path)
    cfg = sentiment_cfg(tmp_path)
    with pytest.raises(DataError, match="test.csv: no column 'id'"):
        load_task_data(dataclasses.replace(cfg, csv_id_column="id"))
    test.write_text("review,key\nfine,a\ngood,b\nbad,a\n")
    with pytest.raises(DataError, match=r"test.csv: line 4: duplicate id 'a' in column 'key'"):
        load_task_data(cfg)
    with pytest.raises(DataError, match="csv_metric 'f1'.*3 classes: use f1_macro"):
        train.write_text("id,review,sentiment\n" + "\n".join(
            f"{i},text {i},{'abc'[i % 3]}" for i in range(30)) + "\n")
        load_task_data(dataclasses.replace(cfg, csv_metric="f1"))


@pytest.mark.parametrize("metric, pick", [("rmse", np.argmin), ("pearson", np.argmax),
                                          ("spearman", np.argmax)])
def test_csv_metric_selects_the_best_epoch_in_its_direction(tmp_path, metric, pick):
    from kit.train.finetune import fit
    cfg = RunConfig(**CSV, csv_metric=metric, model="tiny", epochs=3, lr=1e-3, batch_size=32,
                    max_train_examples=80, save_checkpoints=False, outputs_dir=str(tmp_path))
    m = fit(cfg)
    values = [e["dev"][metric] for e in m["epochs"]]
    assert m["best_epoch"] == m["epochs"][int(pick(values))]["epoch"]
    assert m["best_dev"]["score"] == pytest.approx(-values[int(pick(values))] if metric == "rmse"
                                                   else values[int(pick(values))])


def make_submission_run(root: Path, fold: int, ids, preds, regression=True, status="ok") -> Path:
    run = root / "runs" / f"csv-bert-s0-f{fold}"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({
        "fold": fold, "n_folds": 3, "csv_id_column": "id", "csv_target": "y",
        "csv_regression": regression}))
    (run / "metrics.json").write_text(json.dumps({"status": status}))
    pd.DataFrame({"id": ids, "y": preds}).to_csv(run / "submission.csv", index=False)
    return run


def test_fold_submissions_average_regression_and_vote_classification(tmp_path):
    from kit.results.tables.submission import average_fold_submissions
    ids = ["7", "03", "x"]
    runs = [make_submission_run(tmp_path / "r", f, ids, p) for f, p in
            enumerate([[1.0, 2.0, 4.0], [2.0, 2.5, 0.0], [3.0, 0.5, 2.0]])]
    out = average_fold_submissions(runs)
    assert out["id"].tolist() == ids and out["y"].tolist() == [2.0, 5.0 / 3, 2.0]
    assert out.attrs["folds"] == [0, 1, 2]
    written = Path(out.attrs["path"])
    assert written == tmp_path / "r" / "submissions" / "csv-bert-s0-f0-folds.csv"
    assert pd.read_csv(written, dtype={"id": str})["id"].tolist() == ids
    # a failed fold is left out
    (runs[2] / "metrics.json").write_text(json.dumps({"status": "failed"}))
    assert average_fold_submissions(runs)["y"].tolist() == [1.5, 2.25, 2.0]
    # classification: the most common class, ties to the first class in sorted order
    votes = [make_submission_run(tmp_path / "c", f, ids, p, regression=False) for f, p in
             enumerate([["neg", "pos", "pos"], ["pos", "pos", "neg"], ["neg", "mid", "mid"]])]
    assert average_fold_submissions(votes)["y"].tolist() == ["neg", "pos", "mid"]


def test_fold_submissions_with_other_ids_are_refused(tmp_path):
    from kit.results.tables.submission import SubmissionError, average_fold_submissions
    a = make_submission_run(tmp_path, 0, ["1", "2"], [1.0, 2.0])
    b = make_submission_run(tmp_path, 1, ["2", "1"], [1.0, 2.0])
    with pytest.raises(SubmissionError, match="f1/submission.csv: other ids"):
        average_fold_submissions([a, b])
    with pytest.raises(SubmissionError, match="no finished run"):
        average_fold_submissions([tmp_path / "runs" / "nothing"])


def test_k_fold_runs_with_a_test_file_average_into_one_submission(tmp_path):
    """Two real fold runs of a tiny model on the STS-B fixture, then the CommonLit average."""
    from kit.results.tables.submission import average_fold_submissions
    from kit.train.finetune import fit
    from kit.runs import run_dir_of
    test = tmp_path / "test.csv"
    pd.read_csv(PAIRS).drop(columns="score").iloc[:12].to_csv(test, index=False)
    cfg = RunConfig(**CSV, csv_test_path=str(test), n_folds=2, model="tiny", epochs=1, lr=1e-3,
                    max_train_examples=40, save_checkpoints=False, outputs_dir=str(tmp_path))
    fits = [fit(dataclasses.replace(cfg, fold=f)) for f in range(2)]
    assert all(m["status"] == "ok" for m in fits)
    dirs = fold_tables.fold_run_dirs(cfg)
    folds = [pd.read_csv(d / "submission.csv", dtype={"id": str}) for d in dirs]
    out = average_fold_submissions(dirs)
    assert out["id"].tolist() == pd.read_csv(test, dtype=str)["id"].tolist() == folds[0]["id"].tolist()
    np.testing.assert_allclose(out["score"], (folds[0]["score"] + folds[1]["score"]) / 2)
    assert Path(out.attrs["path"]).parent == tmp_path / "submissions"
    assert run_dir_of(cfg) == dirs[0]
