"""Where relative paths point (kit.config.paths): the project's folder from the project and from
notebooks/ (where JupyterLab starts a kernel), the current folder elsewhere, $SSA_KIT_OUTPUTS for
the default outputs folder; every reader and writer goes through that rule; a notebook papermill
runs in a kernel started in notebooks/ writes where one started in the project folder does. Also
the results notebooks' defaults (kit.results.views.notebook_defaults) on hand-made run folders."""
import json
import os
import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from kit import runs
from kit.config import paths
from kit.config.paths import PROJECT
from kit.config.profiles import load_profile
from kit.config.run_config import RunConfig
from kit.results.frame.no_runs import NoRuns
from kit.results.frame import discover
from kit.results.views import notebook_defaults

NOTEBOOKS = PROJECT / "notebooks"


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(paths.OUTPUTS_ENV, raising=False)


def test_relative_paths_are_the_projects_from_inside_it_else_the_current_folders(
        monkeypatch, tmp_path, no_env):
    for inside in (PROJECT, NOTEBOOKS, PROJECT / "kit" / "config"):
        monkeypatch.chdir(inside)
        assert paths.project_path("outputs") == PROJECT / "outputs"
        assert paths.outputs_root() == PROJECT / "outputs"
        assert runs.runs_root("outputs") == PROJECT / "outputs" / "runs"
    monkeypatch.chdir(tmp_path)                    # a folder of the user's own: cwd semantics
    assert paths.project_path("outputs") == tmp_path.resolve() / "outputs"
    assert paths.outputs_root("out") == tmp_path.resolve() / "out"
    assert paths.project_path(tmp_path / "x") == tmp_path / "x"        # absolute stays
    assert paths.project_path("~/x") == Path.home() / "x"


def test_inputs_found_only_beside_the_notebook_are_taken_from_there(monkeypatch):
    monkeypatch.chdir(NOTEBOOKS)
    fixture = "tests/fixtures/stsb_pairs.csv"
    assert paths.input_path(fixture) == PROJECT / fixture
    assert paths.input_path("finetune.ipynb") == NOTEBOOKS / "finetune.ipynb"   # only here
    assert paths.input_path("../data/glue") == NOTEBOOKS / "../data/glue"      # only from here
    assert paths.input_path("missing.csv") == PROJECT / "missing.csv"          # named in errors


def test_ssa_kit_outputs_is_the_default_outputs_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(NOTEBOOKS)
    monkeypatch.setenv(paths.OUTPUTS_ENV, str(tmp_path))
    for default in ("outputs", "outputs/", "./outputs"):
        assert paths.outputs_root(default) == tmp_path
    assert paths.outputs_root("other") == PROJECT / "other"    # a folder given is that folder
    assert paths.outputs_root(tmp_path / "x") == tmp_path / "x"
    monkeypatch.setenv(paths.OUTPUTS_ENV, "elsewhere")            # relative: the project's
    assert paths.outputs_root() == PROJECT / "elsewhere"


def test_every_reader_and_writer_of_outputs_follows_the_rule(monkeypatch, tmp_path):
    """From notebooks/, with SSA_KIT_OUTPUTS: run folders, the token cache, tables, figures,
    reports and profile points; the run id keeps the config's own strings."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kit.data.token_cache import token_cache_dir
    from kit.results.tables import writers
    from kit.results.figures import plots
    from kit.results.report import page
    monkeypatch.chdir(NOTEBOOKS)
    monkeypatch.setenv(paths.OUTPUTS_ENV, str(tmp_path))
    cfg = RunConfig(task="csv", csv_path="tests/fixtures/stsb_pairs.csv",
                    csv_text_columns=("sentence1", "sentence2"), csv_target="score")
    assert cfg.outputs_dir == "outputs" and cfg.csv_path == "tests/fixtures/stsb_pairs.csv"
    assert cfg.run_id == RunConfig.from_dict({**cfg.to_dict(), "outputs_dir": str(tmp_path)}).run_id
    assert runs.run_dir_of(cfg) == tmp_path / "runs" / cfg.run_id
    assert token_cache_dir("outputs") == tmp_path / "cache" / "tokens"
    assert page.reports_root("outputs") == tmp_path / "reports"
    written = writers.write_results(pd.DataFrame({"a": [1]}), "outputs", "demo")
    assert {p.parent for p in written} == {tmp_path / "tables"}
    fig = plt.figure()
    assert plots.save_figure(fig, "outputs", "x") == tmp_path / "figures" / "x.png"
    plt.close(fig)
    point = load_profile("smoke", "outputs").points[0]
    assert point["outputs_dir"] == str(tmp_path)
    assert not list(NOTEBOOKS.glob("outputs*"))


def test_data_and_model_folders_resolve_from_notebooks(monkeypatch, no_env):
    from kit.data.csv_data import CsvSource
    from kit.data.pipeline import PROJECT_GLUE, glue_source
    from kit.models.backbones import is_hub_id, model_path
    monkeypatch.chdir(NOTEBOOKS)
    cfg = RunConfig(task="csv", csv_path="tests/fixtures/stsb_pairs.csv",
                    csv_test_path="tests/fixtures/stsb_test_30.csv",
                    csv_text_columns=("sentence1", "sentence2"), csv_target="score")
    source = CsvSource.from_config(cfg)
    assert source.path == str(PROJECT / cfg.csv_path)
    assert source.test_path == str(PROJECT / cfg.csv_test_path)
    assert glue_source("data/glue", "RTE") == PROJECT_GLUE
    assert model_path("data/glue") == str(PROJECT_GLUE)          # a local folder, by the rule
    assert model_path("bert-base-uncased") == "bert-base-uncased" and is_hub_id("org/encoder")
    assert not is_hub_id("data/glue")


# ---------------------------------------------------------------- a notebook from notebooks/

KERNEL_SETUP = """import os
os.chdir(folder)
os.environ.pop("SSA_KIT_OUTPUTS", None)
if outputs:
    os.environ["SSA_KIT_OUTPUTS"] = outputs"""


def test_a_notebook_run_in_notebooks_writes_the_projects_outputs(tmp_path, run_notebook):
    """finetune.ipynb as JupyterLab runs it: its kernel's folder is notebooks/ and its
    outputs_dir the cell's relative default, here a temp $SSA_KIT_OUTPUTS. Nothing lands in
    notebooks/; the config is the cell's (ssa-h, the tiny model) plus papermill's parameters
    (the warm kernel's input history holds earlier notebooks' cells too)."""
    setup = tmp_path / "setup.ipynb"
    nbformat.write(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell('folder = ""\noutputs = ""',
                                         metadata={"tags": ["parameters"]}),
               nbformat.v4.new_code_cell(KERNEL_SETUP)],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}}), setup)
    before = sorted(p.name for p in NOTEBOOKS.iterdir())
    out = tmp_path / "outputs"
    run_notebook(setup, tmp_path / "setup-out.ipynb", folder=str(NOTEBOOKS), outputs=str(out))
    try:
        run_notebook(NOTEBOOKS / "finetune.ipynb", tmp_path / "finetune.ipynb", synthetic_size=64,
                     epochs=1, batch_size=16, save_checkpoints=False)
    finally:
        run_notebook(setup, tmp_path / "setup-out.ipynb", folder=str(PROJECT),
                     outputs=os.environ.get(paths.OUTPUTS_ENV, ""))
    assert sorted(p.name for p in NOTEBOOKS.iterdir()) == before
    (run,) = runs.run_folders(out / "runs")
    config = json.loads(runs.config_path(run).read_text())
    assert (config["method"], config["model"], config["lr"]) == ("ssa-h", "tiny", 0.003)
    assert (config["synthetic_size"], config["epochs"], config["outputs_dir"]) == (64, 1, "outputs")
    assert json.loads(runs.metrics_path(run).read_text())["status"] == "ok"
    assert run.name == RunConfig.from_dict(config).run_id


# ---------------------------------------------------------------- the results notebooks' defaults

def _finished(out: Path, profile: str, method: str, mtime: float, checkpoint=False) -> Path:
    """A hand-made finished run of `profile`'s grid point of `method` under `out`."""
    point = next(p for p in load_profile(profile, str(out)).points if p["method"] == method)
    cfg = RunConfig.from_dict(point)
    run_dir = runs.make_run_dir(cfg)
    runs.config_path(run_dir).write_text(json.dumps(cfg.to_dict()))
    runs.metrics_path(run_dir).write_text(json.dumps({**runs.base_record(cfg), "status": "ok",
                                                      "best_dev": {"score": 0.5}}))
    os.utime(runs.metrics_path(run_dir), (mtime, mtime))
    if checkpoint:
        (runs.checkpoint_dir(run_dir) / "best").mkdir(parents=True)
        (runs.checkpoint_dir(run_dir) / "best" / "head_spec.json").write_text("{}")
    return run_dir


def test_the_default_profile_is_the_demo_else_the_newest(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(NoRuns) as info:
        notebook_defaults.pick_profile(str(out))
    assert str(info.value) == (f"no finished runs of a profile under {out / 'runs'}: "
                               "`./run_all.sh` makes them, then run this notebook again")
    assert info.value._render_traceback_() == [f"NoRuns: {info.value}"]     # IPython: one line
    _finished(out, "smoke", "bert", 1000)
    _finished(out, "tapt-smoke", "bert", 3000)
    assert notebook_defaults.pick_profile(str(out)) == "tapt-smoke"             # the newest
    assert capsys.readouterr().out == (f'profile = "tapt-smoke": the newest finished runs; none '
                                       f"of demo yet (1 finished under {out}); set profile to "
                                       "show another\n")
    _finished(out, "demo", "ssa-h", 2000)
    assert notebook_defaults.pick_profile(str(out)) == "demo"                   # the main job
    assert capsys.readouterr().out.startswith('profile = "demo": the main job\'s runs (1 ')
    assert notebook_defaults.pick_profile(str(out), "smoke") == "smoke"         # as given


def test_each_figure_notebook_prefers_its_own_profile_then_the_demo_then_the_newest(
        tmp_path, capsys):
    """One rule: the notebook's own profile (gamma and cost: gamma; case_study: case-study;
    mechanism: mechanism; results and label quality: the demo), then the demo, then the
    newest; each notebook passes its name."""
    out = tmp_path / "out"
    _finished(out, "tapt-smoke", "bert", 3000)                          # the newest
    _finished(out, "demo", "ssa-h", 2000)
    _finished(out, "gamma", "bert", 1000)
    pick = notebook_defaults.pick_profile
    assert [pick(str(out), "", name) for name in ("gamma", "cost", "case_study", "mechanism",
                                                  "results", "label_quality")] == \
        ["gamma", "gamma", "demo", "demo", "demo", "demo"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith('profile = "gamma": the gamma profile\'s runs, this notebook\'s own')
    assert lines[2].startswith('profile = "demo": the main job\'s runs; none of case-study yet')
    with pytest.raises(NoRuns, match="`./run_all.sh case-study` makes them"):
        pick(str(tmp_path / "empty"), "", "case_study")
    for notebook in NOTEBOOKS.glob("*.ipynb"):
        code = "".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])
        calls = re.findall(r"pick_profile\(([^)]*)\)", code)
        assert all(call == f'outputs_dir, profile, "{notebook.stem}"' for call in calls), notebook


def test_a_grid_finished_under_another_profiles_name_is_found(tmp_path, capsys):
    """Runs are credited to a profile by run id, as the tables count them: gamma's grid points
    that config.json credits to another profile (which ran them first) are gamma's."""
    out = tmp_path / "out"
    run_dir = _finished(out, "gamma", "bert", 1000)
    config = json.loads(runs.config_path(run_dir).read_text())
    runs.config_path(run_dir).write_text(json.dumps({**config, "profile": "smoke"}))
    assert set(discover.finished_profiles(str(out), ["gamma"])) == {"gamma"}
    assert notebook_defaults.pick_profile(str(out), "", "gamma") == "gamma"
    assert capsys.readouterr().out.startswith('profile = "gamma": the gamma profile\'s runs')


def test_a_run_moved_away_while_profiles_are_scanned_is_skipped(tmp_path, monkeypatch):
    """A rerun sets a finished run aside while a notebook scans: its metrics.json, read a moment
    ago, is gone when its time is asked; the scan goes on without it."""
    out = tmp_path / "out"
    _finished(out, "demo", "ssa-h", 2000)
    gone = _finished(out, "demo", "bert", 3000)
    for reader in [r for r in ("readable_metrics", "read_metrics") if hasattr(runs, r)]:
        def moved_after_reading(run_dir, read=getattr(runs, reader)):
            record = read(run_dir)
            if Path(run_dir) == gone:
                runs.metrics_path(gone).unlink(missing_ok=True)
            return record
        monkeypatch.setattr(discover.runs, reader, moved_after_reading)
    assert discover.finished_profiles(str(out)) == {"demo": 2000}


def test_a_figure_task_is_the_runs_one_task_else_synthetic(tmp_path, capsys):
    frame = pd.DataFrame({"task": ["SST-2", "SST-2"], "status": ["ok", "failed"]})
    assert notebook_defaults.pick_figure_task(frame, "") == "SST-2"
    assert notebook_defaults.pick_figure_task(frame, "CoLA") == "CoLA"
    several = pd.DataFrame({"task": ["SST-2", "synthetic", "CoLA"], "status": ["ok"] * 3})
    assert notebook_defaults.pick_figure_task(several, "") == "synthetic"
    assert capsys.readouterr().out == 'task = "synthetic" (also: CoLA, SST-2)\n'
    with pytest.raises(NoRuns):
        notebook_defaults.pick_figure_task(frame.assign(status="failed"), "")


def test_the_case_study_task_is_sst2_when_it_has_checkpoints(tmp_path, capsys):
    from kit.results.frame.collect import collect_runs
    out = tmp_path / "out"
    for method in ("bert", "ssa-h"):
        _finished(out, "smoke", method, 1000, checkpoint=True)          # synthetic
    frame = collect_runs(str(out))
    assert notebook_defaults.pick_task(frame, "", ["bert", "ssa-h"], 0) == "synthetic"
    assert capsys.readouterr().out == 'task = "synthetic": checkpointed runs of bert and ssa-h\n'
    assert notebook_defaults.pick_task(frame, "CoLA", ["bert", "ssa-h"]) == "CoLA"
    sst2 = frame.assign(task="SST-2")
    assert notebook_defaults.pick_task(pd.concat([frame, sst2]), "", ["bert", "ssa-h"]) == "SST-2"
    assert capsys.readouterr().out == ('task = "SST-2": checkpointed runs of bert and ssa-h '
                                       "(also: synthetic)\n")
    with pytest.raises(NoRuns, match="no task with checkpointed runs of bert "
                                                       "and ssa-co"):
        notebook_defaults.pick_task(frame, "", ["bert", "ssa-co"])
    assert notebook_defaults.present_methods(frame, ["bert", "bert-mask", "ssa-h"], "cost") == \
        ["bert", "ssa-h"]
    assert capsys.readouterr().out == "cost: no finished runs of bert-mask here; shown without them\n"
    with pytest.raises(NoRuns, match="no finished runs of ssa-co here"):
        notebook_defaults.present_methods(frame, ["ssa-co"], "gamma figure")
