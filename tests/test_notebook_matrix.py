"""Every results and figure notebook, opened with its defaults, on the runs of each small shipped
profile alone: it shows what it can, or stops on the kit's one-line NoRuns (nothing of that kind
to show, and the command that makes it) - never on a Python error. The profiles are the shipped
files shrunk to the tiny model and a few dozen rows (their grids, methods, tasks and notebooks
as shipped), run by kit.batch in this worker's warm kernel; the notebooks run in it too
(papermill). The one parameter set is `profile`, the shrunk file's path: its runs' ids are not
the shipped grid's, so `profile = ""` would not find them (how "" picks a profile: the
JupyterLab test and tests/test_paths.py)."""
import contextlib
from pathlib import Path

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


@pytest.mark.parametrize("profile", PROFILES)
def test_each_notebook_shows_the_runs_or_says_there_are_none(profile, warm_kernels, tmp_path):
    outputs, path = made_runs(profile, tmp_path, warm_kernels)
    errors = {}
    for name in NOTEBOOKS:
        parameters = {"outputs_dir": str(outputs)}
        if name != "compare":                       # compare takes the runs started last
            parameters["profile"] = str(path)
        try:
            warm_kernels.execute(REPO / "notebooks" / f"{name}.ipynb", tmp_path / f"{name}.ipynb",
                                 parameters, stderr_file=None)
        except papermill.PapermillExecutionError as err:
            if err.ename != "NoRuns":
                errors[name] = f"{err.ename}: {err.evalue}"
    assert errors == {}
