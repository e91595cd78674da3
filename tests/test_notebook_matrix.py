"""Every results and figure notebook, opened with its defaults, on the runs of each small shipped
profile alone: it shows its content (a figure notebook its figure, the results and compare
notebooks their tables naming the profile's tasks), or, exactly where the profile has nothing of
that kind (NO_RUNS), stops on the kit's one-line NoRuns - never on a Python error, and never
NoRuns where there are runs to show. The profiles are the shipped
files shrunk to the tiny model and a few dozen rows (their grids, methods, tasks and notebooks
as shipped), run by kit.batch in this worker's warm kernel; the notebooks run in it too
(papermill). The one parameter set is `profile`, the shrunk file's path: its runs' ids are not
the shipped grid's, so `profile = ""` would not find them (how "" picks a profile: the
JupyterLab test and tests/test_paths.py)."""
import contextlib
from pathlib import Path

import nbformat
import papermill
import pytest
import yaml

from kit import batch

REPO = Path(__file__).resolve().parents[1]
PROFILES = ("smoke", "tapt-smoke", "demo", "kaggle-stsb")
NOTEBOOKS = ("results", "gamma", "cost", "case_study", "label_quality", "mechanism", "compare")
# the shrink: every point's rows, epochs and model cut to test size (two epochs stay two: SSA
# labels its first examples in epoch 2)
CAPS = {"max_train_examples": 48, "synthetic_size": 64, "epochs": 2}
FIGURES = ("gamma", "cost", "case_study", "label_quality", "mechanism")
# where a profile has nothing of a notebook's kind: the NoRuns it must say (its line's start)
NO_RUNS = {
    ("tapt-smoke", "gamma"): "gamma figure: no finished runs of bert-mask, ssa-co, ssa-h here",
    ("tapt-smoke", "case_study"): "no task with checkpointed runs of bert and ssa-h (seed 0)",
    ("tapt-smoke", "label_quality"): "label quality: no SSA label statistics",
    ("tapt-smoke", "mechanism"): "mechanism benchmark: no finished runs of this task here",
    ("kaggle-stsb", "gamma"): "gamma figure: no finished runs of bert-mask, ssa-co, ssa-h here",
    ("kaggle-stsb", "cost"): "cost figure: several finished runs for method=bert, seed=0",
    ("kaggle-stsb", "case_study"): "no task with checkpointed runs of bert and ssa-h (seed 0)",
    ("kaggle-stsb", "label_quality"): "label quality: no SSA label statistics",
    ("kaggle-stsb", "mechanism"): "mechanism benchmark: no finished runs of this task here",
}


def shrink(point: dict) -> dict:
    small = {k: min(v, CAPS[k]) if k in CAPS and isinstance(v, int) and v else v
             for k, v in point.items()}
    if small.get("model") == "minilm":
        small["model"] = "tiny"
    return small


def shrunk_profile(name: str, folder: Path) -> Path:
    """params/<name>.yaml with each grid point (and task override) shrunk, under the same name:
    the runs are credited to `name`, as the shipped profile's would be."""
    spec = yaml.safe_load((REPO / "params" / f"{name}.yaml").read_text())
    grid = spec["grid"]
    spec["grid"] = [shrink(p) for p in grid] if isinstance(grid, list) else shrink(grid)
    spec["task_overrides"] = {t: shrink(o) for t, o in (spec.get("task_overrides") or {}).items()}
    spec["report"] = False
    folder.mkdir(parents=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def made_runs(name: str, root: Path, warm_kernels) -> tuple[Path, Path]:
    """(an outputs folder holding only profile `name`'s shrunk runs, the shrunk file)."""
    profile = shrunk_profile(name, root / "params")
    outputs = root / "outputs"
    with pytest.MonkeyPatch.context() as patch:       # the points run in the warm kernel
        patch.setattr(batch, "Kernels", lambda fresh=False: contextlib.nullcontext(warm_kernels))
        assert batch.run_profile(str(profile), outputs_dir=str(outputs), report=False) == 0
    return outputs, profile


def shown(notebook: Path) -> tuple[set[str], str]:
    """(the kinds of rich output an executed notebook shows, the text of its HTML outputs)."""
    outputs = [o for cell in nbformat.read(notebook, as_version=4).cells
               if cell.cell_type == "code" for o in cell.get("outputs", [])]
    kinds = {kind for o in outputs for kind in (o.get("data") or {})}
    return kinds, " ".join(str((o.get("data") or {}).get("text/html", "")) for o in outputs)


@pytest.mark.parametrize("profile", PROFILES)
def test_each_notebook_shows_the_runs_or_says_there_are_none(profile, warm_kernels, tmp_path):
    outputs, path = made_runs(profile, tmp_path, warm_kernels)
    tasks = {str(p.get("task")) for p in batch.load_profile(str(path)).points
             if p.get("task") not in (None, "csv", "multitask")}
    got = {}
    for name in NOTEBOOKS:
        parameters = {"outputs_dir": str(outputs)}
        if name != "compare":                       # compare takes the runs started last
            parameters["profile"] = str(path)
        try:
            warm_kernels.execute(REPO / "notebooks" / f"{name}.ipynb", tmp_path / f"{name}.ipynb",
                                 parameters, stderr_file=None)
        except papermill.PapermillExecutionError as err:
            got[name] = f"{err.ename}: {err.evalue}"
            continue
        kinds, html = shown(tmp_path / f"{name}.ipynb")
        if name in FIGURES:
            got[name] = "figure" if "image/png" in kinds else f"no figure ({sorted(kinds)})"
        else:
            missing = sorted(t for t in tasks if t not in html)
            got[name] = "tables" if "text/html" in kinds and not missing else (
                f"no table naming {missing}")
    want = {name: f"NoRuns: {NO_RUNS[profile, name]}" if (profile, name) in NO_RUNS
            else "figure" if name in FIGURES else "tables" for name in NOTEBOOKS}
    assert {k: v[:len(want[k])] for k, v in got.items()} == want
