"""The paper's outputs end to end: the smoke profile's runs (plus a small gamma grid sharing
them) give every table and figure through the notebooks, in seconds. Also the helpers the
notebooks use (profile membership, selection, results tables) on hand-made folders."""
import json
import re
from pathlib import Path

import nbformat
import pytest
import yaml

from kit import batch
from kit.results.frame import collect
from kit.results.tables import selection, table_sets, writers
from kit.results.figures import mechanism
from kit.config.run_config import RunConfig
from kit.results.tables.paper_table import paper_table_for

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = ("results", "gamma", "cost", "case_study", "label_quality", "mechanism")
NEEDS_CHECKPOINT = ("bert", "ssa-h")                   # the case study's two runs


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Smoke runs (checkpoints only where the case study needs them), then a gamma grid over
    the smoke settings whose gamma = 1.0 points are the smoke runs themselves (same run ids)."""
    import torch
    from kit.train.finetune import fit
    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # tiny models: one thread is as fast, and far faster when
    root = tmp_path_factory.mktemp("paper")     # other jobs share the cores

    out = root / "outputs"
    smoke = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    gamma = {"description": "test", "grid": {**smoke["grid"], "gamma": [1.0, 2.0]}}
    gamma_path = root / "gamma-mini.yaml"
    gamma_path.write_text(yaml.safe_dump(gamma))
    for name in ("smoke", str(gamma_path)):
        for point in batch.load_profile(name, str(out)).points:
            fit(RunConfig.from_dict({**point, "save_checkpoints": point["method"]
                                     in NEEDS_CHECKPOINT and name == "smoke"}))
    torch.set_num_threads(threads)
    return {"dir": out, "gamma": str(gamma_path)}


def output_of(nb: nbformat.NotebookNode, call: str) -> str:
    """The outputs of the code cell that makes `call` (papermill inserts a cell of its own)."""
    return "".join(str(c.outputs) for c in nb.cells if c.cell_type == "code" and call in c.source)


def execute(run_notebook, name: str, tmp_path: Path, **parameters) -> nbformat.NotebookNode:
    path = tmp_path / f"{name}.ipynb"       # (the kernel's torch has one thread: see `outputs`)
    run_notebook(REPO / "notebooks" / f"{name}.ipynb", path, **parameters)
    return nbformat.read(path, as_version=4)


def test_notebooks_are_thin_and_committed_without_outputs():
    for name in NOTEBOOKS:
        nb = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(params) == 1, name
        for line in params[0].source.splitlines()[1:]:
            assert " = " in line, (name, line)                          # plain assignments
            yaml.safe_load(line.split(" = ", 1)[1])                     # of plain literals
        for cell in nb.cells:
            assert cell.get("id"), name
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, name
                assert "def " not in cell.source and "class " not in cell.source, name


def test_results_notebook_writes_the_tables(outputs, tmp_path, run_notebook):
    out = outputs["dir"]
    nb = execute(run_notebook, "results", tmp_path, outputs_dir=str(out), profile="smoke")
    md = (out / "tables" / "smoke-results.md").read_text()
    assert "## Paper layout" in md and "## Summary over seeds" in md and "## Comparisons" in md
    for label in ("BERT-r", "BERT-mask", "SSA-Co", "SSA-H"):
        assert re.search(rf"^\| {re.escape(label)} +\|", md, re.M), label   # a row of its own
    assert "(paper)" not in md                          # smoke is no paper profile
    for table in ("paper-layout", "comparisons", "summary-over-seeds", "epoch-selection"):
        assert (out / "tables" / f"smoke-results-{table}.csv").exists()
    tex = (out / "tables" / "smoke-results.tex").read_text()
    assert "\\begin{tabular}" in tex and "\\label{tab:smoke-results-paper-layout}" in tex
    shown = "".join(str(o.get("data", {}).get("text/plain", "")) for c in nb.cells
                    if c.cell_type == "code" for o in c.outputs)
    assert "synthetic" in shown and "n=1" in shown


def test_selection_on_the_gamma_grid(outputs):
    runs = collect.collect_runs(outputs["dir"], outputs["gamma"])
    assert len(runs) == 8 and set(runs["gamma"]) == {1.0, 2.0}
    assert set(runs["profile"]) == {"smoke", "gamma-mini"}   # gamma = 1.0 runs came from smoke
    assert selection.varying_hyperparameters(runs) == ["gamma"]
    chosen = selection.select_runs(runs)
    assert len(chosen) == 4 and not chosen.duplicated(["method", "seed"]).any()
    table = selection.selection_table(runs)
    assert list(table["method"]) == ["bert", "bert-mask", "ssa-co", "ssa-h"]
    assert (table["candidates"] == 2).all() and table["three_subset_config"].str.startswith(
        "gamma=").all()
    tables = table_sets.results_tables(runs)
    assert list(tables) == ["Paper layout", "Comparisons", "Summary over seeds",
                            "Epoch selection", "Model selection"]


def test_gamma_notebook(outputs, tmp_path, run_notebook):
    out = outputs["dir"]
    execute(run_notebook, "gamma", tmp_path, outputs_dir=str(out), profile=outputs["gamma"],
            task="synthetic")
    png = out / "figures" / "gamma-gamma-mini-synthetic.png"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cost_notebook(outputs, tmp_path, run_notebook):
    execute(run_notebook, "cost", tmp_path, outputs_dir=str(outputs["dir"]), profile="smoke")
    assert (outputs["dir"] / "figures" / "cost-smoke-synthetic.png").stat().st_size > 1000


def test_label_quality_notebook(outputs, tmp_path, run_notebook):
    nb = execute(run_notebook, "label_quality", tmp_path, outputs_dir=str(outputs["dir"]),
                 profile="smoke")
    assert (outputs["dir"] / "figures" / "label_quality-smoke-synthetic.png").exists()
    assert "cue_share_label1" in output_of(nb, "figure_data.label_quality(")


def test_case_study_notebook(outputs, tmp_path, run_notebook):
    nb = execute(run_notebook, "case_study", tmp_path, outputs_dir=str(outputs["dir"]),
                 profile="smoke",
                 sentences=["a whole lot foul, freaky and funny.", "the movie works."])
    assert (outputs["dir"] / "figures" / "case_study-smoke-synthetic.png").exists()
    table = output_of(nb, "model_scores.case_study_data(")
    assert "funny" in table and "works" in table and "ssa_p_important" in table


MECHANISM_GRID = {"task": "synthetic", "model": "tiny", "synthetic_size": 48,
                  "synthetic_spurious": 0.8, "max_length": 24, "epochs": 2, "lr": 5.0e-3,
                  "batch_size": 16, "save_labels": True, "seed": [0, 1]}


def test_mechanism_notebook(tmp_path, run_notebook):
    """params/mechanism.yaml in miniature: BERT-r, SSA-H and guided BERT-r, 2 seeds, labels
    saved; the notebook writes both tables and the figure."""
    import torch
    from kit.train.finetune import fit
    profile = tmp_path / "mech-mini.yaml"
    profile.write_text(yaml.safe_dump({"description": "test", "grid": [
        {**MECHANISM_GRID, "method": ["bert", "ssa-h"]},
        {**MECHANISM_GRID, "method": "bert", "guide_loss": "task+both"}]}))
    out = tmp_path / "outputs"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                            # see `outputs`
    try:
        done = [(p, fit(RunConfig.from_dict(p)))
                    for p in batch.load_profile(str(profile), str(out)).points]
    finally:
        torch.set_num_threads(threads)
    nb = execute(run_notebook, "mechanism", tmp_path, outputs_dir=str(out), profile=str(profile))
    assert (out / "figures" / "mechanism-mech-mini.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "tables" / "mechanism-mech-mini.md").read_text()
    for row in ("BERT-r", "SSA-H", "BERT-r \\+ guiding", "SSA-H, epoch 2"):
        assert re.search(rf"^\| {row} +\|", md, re.M), row
    assert (out / "tables" / "mechanism-mech-mini-ssa-labels.csv").exists()
    assert "p_holm" in output_of(nb, 'results["Dev accuracy"]')
    records = mechanism.label_records(collect.collect_runs(out, str(profile))).set_index("seed")
    assert sorted(records.index) == [0, 1] and set(records["epoch"]) == {1}
    for point, metrics in done:          # the saved epochs hold metrics.json's statistics
        if point["method"] == "ssa-h":
            flips = metrics["ssa_labels"][0]["flip_rate"]
            assert records.loc[point["seed"], "flip_rate"] == flips
    assert records["chance_precision"].between(0, 1).all()      # the shortcut may go unmasked:
    assert records["shortcut_share_label1"].dropna().between(0, 1).all()          # NaN there


# ---------------------------------------------------------------- report helpers

def make_run(root: Path, run_id: str, profile: str, task="RTE", method="bert", seed=0,
             score=0.6, **config) -> Path:
    run_dir = root / "runs" / run_id
    run_dir.mkdir(parents=True)
    cfg = {"task": task, "model": "minilm", "method": method, "seed": seed, "lr": 2e-5,
           "profile": profile, **config}
    (run_dir / "config.json").write_text(json.dumps(cfg))
    dev = {"accuracy": score, "score": score}
    (run_dir / "metrics.json").write_text(json.dumps({
        "run_id": run_id, "status": "ok", "task": task, "model": "minilm", "method": method,
        "seed": seed, "best_dev": dev, "best_epoch": 0,
        "best_three_subset": {"mean": score, "std": 0.01}}))
    return run_dir


def test_collect_runs_by_profile_grid_or_config_field(tmp_path):
    profile = tmp_path / "mine.yaml"
    profile.write_text("grid:\n  task: RTE\n  method: [bert, ssa-h]\n  seed: 0\n")
    ids = [RunConfig.from_dict(p).run_id for p in batch.load_profile(str(profile)).points]
    make_run(tmp_path, ids[0], "someone-else", method="bert")   # ran first under another
    make_run(tmp_path, "other", "mine", method="ssa-h", seed=3)  # config says mine, grid not
    by_grid = collect.collect_runs(tmp_path, str(profile))
    assert list(by_grid["run_id"]) == [ids[0]]
    by_field = collect.collect_runs(tmp_path, "mine")            # no such params file
    assert list(by_field["run_id"]) == ["other"]
    assert len(collect.collect_runs(tmp_path)) == 2
    assert list(collect.collect_runs(tmp_path, None, method="ssa-h", model="")["run_id"]) == [
        "other"]
    assert collect.collect_runs(tmp_path / "nowhere", "mine").empty
    with pytest.raises(ValueError, match="no column 'nope'"):
        collect.collect_runs(tmp_path, nope=1)


def test_results_tables_with_the_papers_rows(tmp_path):
    for seed, (base, ssa) in enumerate([(0.60, 0.66), (0.62, 0.68), (0.61, 0.67)]):
        make_run(tmp_path, f"b{seed}", "p", method="bert", seed=seed, score=base)
        make_run(tmp_path, f"h{seed}", "p", method="ssa-h", seed=seed, score=ssa)
    runs = collect.collect_runs(tmp_path)
    assert "BERT-r (paper)" not in table_sets.results_tables(runs)["Paper layout"].index  # off
    tables = table_sets.results_tables(runs, profile="paper-small")       # a paper profile
    paper = tables["Paper layout"]
    assert list(paper.index) == ["BERT-r", "BERT-r (paper)", "BERT-r (measured - paper)",
                                 "SSA-H", "SSA-H (paper)", "SSA-H (measured - paper)"]
    assert paper.loc["SSA-H (paper)", "RTE"] == "70.3**"        # Table 2, BERT-base
    assert paper.loc["SSA-H", "RTE"].startswith("67.0**")
    assert "Model selection" not in tables                      # nothing varies
    paths = writers.write_results(tables, tmp_path, "params/p.yaml")
    assert [p.name for p in paths] == [
        "p-results.md", "p-results-paper-layout.csv", "p-results-comparisons.csv",
        "p-results-summary-over-seeds.csv", "p-results-epoch-selection.csv", "p-results.tex"]
    with pytest.raises(ValueError, match="no finished"):
        table_sets.results_tables(collect.collect_runs(tmp_path / "empty"))
    with pytest.raises(ValueError, match="unknown selection rule"):
        selection.select_runs(collect.collect_runs(tmp_path), "best")


def test_paper_table_for_model_names():
    assert paper_table_for("bert-base-uncased") == "base"
    assert paper_table_for("minilm") == "base"
    assert paper_table_for("bert-large-uncased") == "large"
    assert paper_table_for("roberta-base") == "roberta-base"
    assert paper_table_for("FacebookAI/roberta-large") == "roberta-large"


def test_paper_profiles_hold_the_papers_settings():
    # section 4.3's grid: the union over the points (each method searches the knobs it uses)
    points = batch.load_profile("paper-grid").points
    values = lambda key: sorted({p[key] for p in points if key in p})  # noqa: E731
    assert {k: values(k) for k in ("lr", "batch_size", "epochs", "alpha", "beta", "gamma",
                                   "model", "max_length")} == {
        "lr": [1e-5, 2e-5], "batch_size": [16, 32], "epochs": [2, 3, 5], "alpha": [0.7, 0.9],
        "beta": [0.2, 0.5, 0.9], "gamma": [0.6, 1.0, 2.0], "model": ["bert-base-uncased"],
        "max_length": [128]}
    ssa_h = [p for p in points if p["method"] == "ssa-h" and p["task"] == "RTE"]
    assert len(ssa_h) == 2 * 2 * 3 * 2 * 3 * 3        # the full grid for the hybrid model
    gamma = batch.load_profile("gamma").points
    assert {p.get("gamma", 1.0) for p in gamma} >= {0.6, 1.0, 2.0} and {p["task"] for p in gamma} == {
        "SST-2"}
    assert {p["max_train_examples"] for p in gamma} == {1000}
    for name, models in (("paper-large", {"bert-large-uncased"}),
                         ("roberta", {"roberta-base", "roberta-large"})):
        points = batch.load_profile(name).points
        assert {p["model"] for p in points} == models and {p["method"] for p in points} == {
            "bert", "ssa-h"} and len({p["task"] for p in points}) == 9
        assert all(p["predict_test"] and p["lr"] == 2e-5 for p in points)
    small = batch.load_profile("paper-small").points
    assert {p["task"] for p in small} == {"RTE", "CoLA", "STS-B", "MRPC"}
    assert len(small) == 4 * 4 * 5 and {p["epochs"] for p in small} == {3}
    # the CPU run behind RESULTS.md: paper-small's points, only capped in training rows
    # (and BERT-mask once more at equal optimizer steps)
    cpu = batch.load_profile("paper-small-cpu").points
    drop = ("profile", "max_train_examples", "budget")
    full = [{k: v for k, v in p.items() if k not in drop} for p in small]
    assert len(cpu) == 2 * 4 * 3 + 2 * 3 and all(
        {k: v for k, v in p.items() if k not in drop} in full for p in cpu)
    assert {p["method"] for p in cpu if p.get("budget") == "equal_steps"} == {"bert-mask"}
    assert len([p for p in gamma if p.get("budget") == "equal_steps"]) == 5 * 3


def test_one_call_figures(outputs):
    import matplotlib
    matplotlib.use("Agg")
    from kit.results.figures import plots
    out = outputs["dir"]
    for fig in (plots.gamma_figure(out, outputs["gamma"]),
                plots.cost_figure(out, "smoke", loss="loss_target"),
                plots.label_quality_figure(out, "smoke"),
                plots.case_study_figure(out, "smoke", sentences=["fine ."])):
        assert fig.axes
    matplotlib.pyplot.close("all")


@pytest.mark.parametrize("budget, steps, examples", [("epochs", 13 + 25, 400 + 800),
                                                      ("equal_steps", 13 + 13, 400 + 400)])
def test_equal_steps_budget_trains_bert_rs_steps(tmp_path, budget, steps, examples):
    """BERT-mask with gamma 1 trains 400 rows in epoch 0 (no copies yet) and 400 + 400 copies in
    epoch 1: ceil(400 / 32) + ceil(800 / 32) = 13 + 25 optimizer steps. With equal_steps its
    epoch 1 is a 400-row subsample: 13 + 13 steps, as BERT-r takes."""
    import torch
    from kit.train.finetune import fit
    from kit.runs import run_dir_of
    before = torch.get_num_threads()
    torch.set_num_threads(1)              # restored: later tests compare runs across processes
    cfg = RunConfig(task="synthetic", model="tiny", method="bert-mask", synthetic_size=400,
                    epochs=2, batch_size=32, gamma=1.0, budget=budget, save_checkpoints=False,
                    log_every=1, outputs_dir=str(tmp_path))
    try:
        metrics = fit(cfg)
    finally:
        torch.set_num_threads(before)
    history = (run_dir_of(cfg) / "history.csv").read_text().splitlines()
    assert int(history[-1].split(",")[0]) == steps == len(history) - 1   # one row per step
    assert metrics["train_examples"] == examples
    assert (RunConfig(task="synthetic", method="bert-mask").run_id
            == RunConfig(task="synthetic", method="bert-mask", budget="epochs").run_id)
