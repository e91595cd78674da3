"""Bad profiles and flags a user may write, each stopped by one line naming the file and what is
wrong before anything trains (docs/reference/errors.md): an empty file, a grid of no points, a
flag of the wrong kind, a key given twice, overrides for a task the grid lacks, a seed numpy
refuses."""
import pytest

from kit import batch
from kit.config.profiles import load_profile
from kit.config.run_config import ConfigError

GRID = "grid:\n  task: synthetic\n  model: tiny\n"


@pytest.mark.parametrize("text, why", [
    ("", "no grid: a profile names its runs under `grid:` (e.g. grid: {task: RTE, method: "
         "[bert, ssa-h]}); params/smoke.yaml is one"),
    ("description: x\n", "no grid: a profile names its runs under `grid:` (e.g. grid: {task: "
                         "RTE, method: [bert, ssa-h]}); params/smoke.yaml is one"),
    ("grid:\n  task: []\n", "grid parameter 'task' has no values ([]): the grid would have no "
                            "points; give it at least one"),
    ("skip_missing_tasks: maybe\n" + GRID, "`skip_missing_tasks` must be true or false, got "
                                           "'maybe'"),
    (GRID + "  lr: 1.0e-4\n  lr: 2.0e-4\n", "not valid YAML: line 5, column 3: key 'lr' given "
                                            "twice in one mapping (line 4 and line 5); keep one"),
    (GRID + "task_overrides:\n  SST-2: {lr: 1.0e-4}\n", "task_overrides names 'SST-2', which no "
                                                        "grid point has (tasks: synthetic)"),
    (GRID + "  seed: -1\n", "parameter 'seed': -1 is outside [0, 4294967295]"),
])
def test_a_bad_profile_is_one_line_naming_the_file(tmp_path, capsys, text, why):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_profile(str(path))
    assert str(err.value).startswith(f"{path}: ") and why in str(err.value)
    assert "\n" not in str(err.value)
    assert batch.main([str(path), "--outputs", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"error: {err.value}\n"
    assert not (tmp_path / "out").exists()


def test_overrides_in_another_spelling_of_a_grid_task_are_used(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("grid:\n  task: [sst2, RTE]\n  model: tiny\ntask_overrides:\n  SST-2: "
                    "{lr: 1.0e-4}\n")
    assert [p.get("lr") for p in load_profile(str(path)).points] == [1.0e-4, None]


@pytest.mark.parametrize("flag, why", [
    (["--signal-grace", "-5"], "--signal-grace must be >= 1 (seconds), got -5"),
    (["--signal-grace", "0"], "--signal-grace must be >= 1 (seconds), got 0"),
    (["--lock-wait", "-1"], "--lock-wait must be >= 0 (seconds), got -1")])
def test_a_bad_flag_is_refused_before_anything_runs(capsys, flag, why):
    with pytest.raises(SystemExit) as code:
        batch.main(["smoke", *flag])
    assert code.value.code == 2 and capsys.readouterr().err.endswith(f"error: {why}\n")
