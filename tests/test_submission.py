"""GLUE submission zips from hand-made run folders: names, headers, row counts, label strings."""
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kit.results.tables import submission
from kit.results.frame.collect import load_runs
from kit.results.tables.glue_zips import build_submissions
from kit.results.tables.submission import GLUE_TEST_ROWS, SubmissionError
from kit.config.tasks import GLUE_TASKS, Split

LABELS = {"RTE": ["entailment", "not_entailment"], "CoLA": ["0", "1"],
          "MNLI": ["contradiction", "entailment", "neutral"], "WNLI": ["0", "1"]}


def make_run(root: Path, run_id: str, task: str, method="bert", seed=0, model="minilm",
             rows=None, predict=True, **config) -> Path:
    """An ok run folder; with `predict`, test predictions as the training loop writes them."""
    run_dir = root / run_id
    (run_dir / "predictions").mkdir(parents=True)
    cfg = {"task": task, "model": model, "method": method, "seed": seed, "lr": 2e-5,
           "predict_test": predict, **config}
    (run_dir / "config.json").write_text(json.dumps(cfg))
    dev = {"score": 0.7}
    (run_dir / "metrics.json").write_text(json.dumps({
        "run_id": run_id, "task": task, "model": model, "method": method, "seed": seed,
        "status": "ok", "best_dev": dev, "best_epoch": 0,
        "best_three_subset": {"mean": 0.7, "std": 0.01}}))
    (run_dir / "predictions" / "dev.tsv").write_text("index\tprediction\tlabel\n0\t1\t1\n")
    if predict:
        task_info = GLUE_TASKS[task]
        for split in task_info.test_splits:
            n = rows or 5
            if task_info.regression:
                values = [f"{(i * 0.37) % 5:.4f}" for i in range(n)]
            else:
                values = [LABELS[task][i % len(LABELS[task])] for i in range(n)]
            text = "index\tprediction\n" + "".join(f"{i}\t{v}\n" for i, v in enumerate(values))
            (run_dir / "predictions" / f"{split}.tsv").write_text(text)
    return run_dir


def read_zip(path: Path) -> dict[str, list[list[str]]]:
    with zipfile.ZipFile(path) as zf:
        return {name: [line.split("\t") for line in zf.read(name).decode().splitlines()]
                for name in zf.namelist()}


def test_zips_per_method_and_seed_with_glue_names_and_labels(tmp_path):
    runs_dir = tmp_path / "runs"
    for method in ("bert", "ssa-h"):
        for seed in (0, 1):
            for task in ("RTE", "STS-B", "MNLI", "CoLA"):
                make_run(runs_dir, f"{task}-{method}-{seed}", task, method, seed)
    make_run(runs_dir, "wnli-full", "WNLI", "bert", 0, rows=GLUE_TEST_ROWS["WNLI.tsv"])
    make_run(runs_dir, "synthetic", "synthetic", "bert", 0, predict=False)
    manifest = build_submissions(load_runs(runs_dir), tmp_path, "paper-base")

    out = tmp_path / "submissions"
    assert sorted(p.name for p in out.iterdir()) == [
        "paper-base-bert-s0.zip", "paper-base-bert-s1.zip", "paper-base-manifest.csv",
        "paper-base-ssa-h-s0.zip", "paper-base-ssa-h-s1.zip"]
    files = read_zip(out / "paper-base-bert-s0.zip")
    assert sorted(files) == ["CoLA.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "RTE.tsv", "STS-B.tsv",
                             "WNLI.tsv"]
    for name, lines in files.items():
        assert lines[0] == ["index", "prediction"], name
        assert [row[0] for row in lines[1:]] == [str(i) for i in range(len(lines) - 1)]
    assert {row[1] for row in files["RTE.tsv"][1:]} == {"entailment", "not_entailment"}
    assert {row[1] for row in files["MNLI-mm.tsv"][1:]} == {"contradiction", "entailment",
                                                             "neutral"}
    assert {row[1] for row in files["CoLA.tsv"][1:]} == {"0", "1"}
    assert all(0 <= float(row[1]) <= 5 for row in files["STS-B.tsv"][1:])
    assert len(files["WNLI.tsv"]) - 1 == 146 and len(files["RTE.tsv"]) - 1 == 5
    assert "WNLI.tsv" not in read_zip(out / "paper-base-bert-s1.zip")

    rows = manifest[manifest["zip"] == "paper-base-bert-s0.zip"].set_index("file")
    assert rows.loc["RTE.tsv", "rows"] == 5 and rows.loc["RTE.tsv", "glue_rows"] == 3000
    assert rows.loc["RTE.tsv", "note"] == "5 rows, the GLUE test set has 3000"
    assert rows.loc["WNLI.tsv", "note"] == "" and rows.loc["RTE.tsv", "run_id"] == "RTE-bert-0"
    summary = rows.loc["", "note"]
    assert "missing: SST-2.tsv, MRPC.tsv, QQP.tsv, QNLI.tsv" in summary and "AX.tsv" in summary
    assert (out / "paper-base-manifest.csv").read_text().startswith("zip,model,method,seed,file")
    assert not list(out.glob(".*"))                                      # no temp files left


def test_several_models_name_their_zips(tmp_path):
    for model in ("roberta-base", "roberta-large"):
        make_run(tmp_path / "runs", f"rte-{model}", "RTE", "ssa-h", 0, model=model)
    manifest = build_submissions(load_runs(tmp_path / "runs"), tmp_path, "roberta")
    assert sorted(set(manifest["zip"])) == ["roberta-roberta-base-ssa-h-s0.zip",
                                            "roberta-roberta-large-ssa-h-s0.zip"]


def test_strict_row_counts_and_mixed_configurations(tmp_path):
    make_run(tmp_path / "runs", "a", "RTE", lr=2e-5)
    runs = load_runs(tmp_path / "runs")
    with pytest.raises(SubmissionError, match="3000"):
        build_submissions(runs, tmp_path, "p", strict=True)
    make_run(tmp_path / "runs", "b", "RTE", lr=1e-5)
    with pytest.raises(SubmissionError, match="select one configuration"):
        build_submissions(load_runs(tmp_path / "runs"), tmp_path, "p")


def test_no_test_predictions_no_zip(tmp_path):
    make_run(tmp_path / "runs", "a", "RTE", predict=False)
    manifest = build_submissions(load_runs(tmp_path / "runs"), tmp_path, "p")
    assert manifest.empty and not (tmp_path / "submissions").exists()


@pytest.mark.parametrize("task,text,needle", [
    ("RTE", "index\tprediction\n0\tentailment\n1\tcontradiction\n", "contradiction"),
    ("RTE", "idx\tlabel\n0\tentailment\n", "header"),
    ("CoLA", "index\tprediction\n0\t1\n0\t0\n", "duplicate index '0'"),
    ("STS-B", "index\tprediction\n0\t3.2\n1\tnan\n", "finite numbers"),
    ("SST-2", "index\tprediction\n0\t1\textra\n", "line 2 has 3 fields"),
    ("SST-2", "", "empty file"),
])
def test_bad_prediction_files_are_named(tmp_path, task, text, needle):
    path = tmp_path / "test.tsv"
    path.write_text(text)
    with pytest.raises(SubmissionError) as err:
        submission.read_test_predictions(path, task)
    assert needle in str(err.value) and str(path) in str(err.value)


def test_the_training_loops_test_files_are_accepted(tmp_path):
    """What the training loop (kit.runs) writes for test splits (label strings, STS-B floats) reads back."""
    from kit.runs import predictions_dir, write_test_predictions
    for task, preds in (("MNLI", np.array([0, 1, 2])), ("STS-B", np.array([0.5, 4.25, 3.0])),
                        ("QNLI", np.array([1, 0, 1]))):
        info = GLUE_TASKS[task]
        split = Split(["a"] * 3, ["b"] * 3, None, ["7", "8", "9"], "fixture")
        write_test_predictions(predictions_dir(tmp_path), info, info.test_splits[0], split, preds)
        frame = submission.read_test_predictions(
            tmp_path / "predictions" / f"{info.test_splits[0]}.tsv", task)
        assert list(frame["index"]) == ["7", "8", "9"]
        if task == "MNLI":
            assert list(frame["prediction"]) == ["contradiction", "entailment", "neutral"]
        if task == "QNLI":
            assert list(frame["prediction"]) == ["not_entailment", "entailment", "not_entailment"]


def test_a_multitask_run_fills_one_zip_with_each_tasks_predictions(tmp_path):
    run = tmp_path / "runs" / "multitask-embert-s0-abc"
    for task in ("RTE", "CoLA"):
        (run / "predictions" / task).mkdir(parents=True)
        labels = LABELS[task]
        (run / "predictions" / task / "test.tsv").write_text(
            "index\tprediction\n" + "".join(f"{i}\t{labels[i % 2]}\n" for i in range(4)))
    (run / "config.json").write_text(json.dumps({"task": "multitask", "method": "embert",
                                                 "seed": 0, "model": "minilm"}))
    (run / "metrics.json").write_text(json.dumps({
        "run_id": run.name, "task": "multitask", "method": "embert", "seed": 0,
        "model": "minilm", "status": "ok", "best_dev": {"score": 0.6},
        "per_task": {"RTE": {"score": 0.55}, "CoLA": {"score": 0.1}}}))
    manifest = build_submissions(load_runs(tmp_path / "runs"), tmp_path, "multitask")
    files = read_zip(tmp_path / "submissions" / "multitask-embert-s0.zip")
    assert set(files) == {"RTE.tsv", "CoLA.tsv"} and files["CoLA.tsv"][1] == ["0", "0"]
    assert set(manifest["task"]) == {"RTE", "CoLA", ""}
