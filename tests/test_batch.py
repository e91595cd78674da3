"""Profiles: YAML typing, grid expansion, shards, skip-finished, failure records, locks, and the
smoke profile end to end through papermill (every method, tables written)."""
import json
import re
from pathlib import Path

import pytest
import yaml

from kit import batch
from kit.config.grids import point_label
from kit.config.profiles import shard
from kit.config.run_config import ConfigError, RunConfig
from kit.runs import run_dir_of
from kit.train.preflight import missing_task_files

REPO = Path(__file__).resolve().parents[1]


def write_profile(tmp_path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def test_every_shipped_profile_is_valid_and_typed():
    for path in sorted((REPO / "params").glob("*.yaml")):
        profile = batch.load_profile(str(path))
        assert profile.points, path
        for point in profile.points:
            cfg = RunConfig.from_dict(point)
            assert isinstance(cfg.lr, float) and isinstance(cfg.epochs, int), path


def test_yaml_reads_exponent_floats_as_floats(tmp_path):
    assert yaml.safe_load("lr: 1e-5")["lr"] == "1e-5"              # the plain YAML trap
    profile = batch.load_profile(str(write_profile(tmp_path, "grid:\n  lr: 1e-5\n")))
    assert profile.points[0]["lr"] == 1e-5


def test_quoted_number_is_a_one_line_error_naming_the_file_and_parameter(tmp_path):
    path = write_profile(tmp_path, "grid:\n  lr: '1e-5'\n")
    with pytest.raises(ConfigError) as err:
        batch.load_profile(str(path))
    message = str(err.value)
    assert str(path) in message and "'lr'" in message and "\n" not in message


@pytest.mark.parametrize("text,needle", [
    ("grid:\n  lrr: 0.1\n", "did you mean 'lr'"),
    ("grid:\n  task: NOPE\n  method: bert\n  epochs: 0\n", "'epochs'"),
    ("gird:\n  lr: 0.1\n", "unknown key(s) gird"),
    ("grid: [1, 2\n", "not valid YAML: line 2, column 1: expected ',' or ']'"),
    ("task: RTE\ngrid:\n  seed: 0\n", "task at the top level: run parameters go under `grid:`"),
    ("grid:\n  gamma: -1.0\n", "'gamma'"),
])
def test_bad_profiles(tmp_path, text, needle):
    with pytest.raises(ConfigError) as err:
        batch.load_profile(str(write_profile(tmp_path, text)))
    assert needle in str(err.value)


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ConfigError, match="smoke"):
        batch.load_profile("no-such-profile")


def test_grid_is_a_cartesian_product_with_task_overrides(tmp_path):
    path = write_profile(tmp_path, """
grid:
  task: [RTE, CoLA]
  method: [bert, ssa-h]
  seed: [0, 1, 2]
  lr: 1.0e-4
task_overrides:
  CoLA: {lr: 2.0e-5}
""")
    points = batch.load_profile(str(path)).points
    assert len(points) == 12
    assert {p["lr"] for p in points if p["task"] == "CoLA"} == {2e-5}
    assert {p["lr"] for p in points if p["task"] == "RTE"} == {1e-4}
    assert len({RunConfig.from_dict(p).run_id for p in points}) == 12


def test_shards_partition_the_grid():
    points = list(range(10))
    shards = [shard(points, f"{i}/3") for i in range(3)]
    assert sorted(sum(shards, [])) == points
    for bad in ("3/3", "x", "1/0"):
        with pytest.raises(ConfigError):
            shard(points, bad)


def test_missing_local_task_files_are_reported(tmp_path):
    cfg = RunConfig(task="MRPC", glue_dir=str(tmp_path))
    assert missing_task_files(cfg).startswith(             # nowhere, offline
        "MRPC: in no glue_dir / GLUE_DIR nor the project's data/glue, and the hub is unreachable")
    (tmp_path / "MRPC").mkdir()                                    # part of it: its files named
    assert f"{tmp_path / 'MRPC'}/: train.tsv (absent), dev.tsv (absent)" in missing_task_files(cfg)
    assert missing_task_files(RunConfig(task="synthetic")) is None


def test_run_lock_is_exclusive(tmp_path):
    from kit.io import FileLock
    with FileLock(tmp_path / ".lock") as first:
        assert first
        with FileLock(tmp_path / ".lock") as second:
            assert not second
    with FileLock(tmp_path / ".lock") as again:
        assert again


def test_smoke_profile_end_to_end_then_skip_and_retry(tmp_path, glue_dir, capsys,
                                                      batch_kernel, kernel_starts):
    """All four methods through papermill; a failing point is recorded, takes its kernel with
    it and the batch goes on in a new one; a rerun skips finished runs and retries only the
    failed one. The failing point comes first (one point: each failure costs a kernel start,
    ~10 s on a 2-core AVX2 CPU)."""
    outputs = tmp_path / "out"
    # a model folder with a config and no weights: it passes pre-flight, and fails to load
    broken = tmp_path / "no-weights"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert"}')
    smoke = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    failing = {**smoke["grid"], "task": "RTE", "method": "ssa-h", "model": str(broken)}
    profile = write_profile(tmp_path, yaml.safe_dump({**smoke, "grid": [failing, smoke["grid"]]}))
    points = batch.load_profile(str(profile), str(outputs)).points
    assert len(points) == 5 and points[0]["task"] == "RTE"

    assert batch.run_profile(str(profile), outputs_dir=str(outputs), report=False) == 1
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert "4 ok, 0 skipped, 1 failed" in summary
    assert len(kernel_starts) == 1         # the four points after the failure: one new kernel
    for point in points:
        run = run_dir_of(RunConfig.from_dict(point))
        record = json.loads((run / "metrics.json").read_text())
        if point["task"] == "RTE":
            assert record["status"] == "failed" and str(broken) in record["error"]
        else:
            assert record["status"] == "ok"
            assert (run / "notebook.ipynb").exists()            # the executed copy
    tables = outputs / "tables"
    assert (tables / "p.md").exists() and (tables / "p.tex").exists()
    assert list(tables.glob("p-*.csv"))                   # one CSV per table
    md = (tables / "p.md").read_text()
    assert "SSA-H" in md and "failed" in md

    assert batch.run_profile(str(profile), outputs_dir=str(outputs), report=False) == 1
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert "0 ok, 4 skipped, 1 failed" in summary


WARM_GRID = """
grid:
  - &point
    task: synthetic
    model: tiny
    synthetic_size: 200
    epochs: 2
    lr: 5.0e-3
    method: ssa-h
  - {<<: *point, method: bert, mixed_precision: "no"}
  - {<<: *point, method: bert-mask, predict_test: false}
"""


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items()
                if k not in ("wall_s", "train_examples_per_s", "peak_memory_mb", "finished_at")}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


@pytest.fixture
def kernel_starts(monkeypatch, warm_kernels) -> list:
    """The kernels kit.cluster.kernels starts from here on, one entry each (this worker's warm kernel
    already running: whichever test comes first does not count its start)."""
    from kit.cluster import kernels
    warm_kernels.start()
    starts, start = [], kernels._Manager.start_kernel

    async def counted(self, **kwargs):
        starts.append(kwargs)
        return await start(self, **kwargs)

    monkeypatch.setattr(kernels._Manager, "start_kernel", counted)
    return starts


def test_a_warm_kernel_gives_a_fresh_kernels_results(tmp_path, monkeypatch, batch_kernel,
                                                     kernel_starts):
    """A point run after others in a warm kernel (BERT-mask after SSA-H and fp32, in this test
    worker's kernel, which has run whatever tests ran before) gives bit for bit the results of
    a fresh kernel. Only that point is rerun fresh: the others ran first in their kernel. (A
    failed point taking its kernel with it: the smoke test above.)"""
    warm = write_profile(tmp_path, WARM_GRID)
    assert batch.run_profile(str(warm), outputs_dir=str(tmp_path / "warm"), report=False) == 0
    assert kernel_starts == []                 # all three in the warm kernel
    fresh = tmp_path / "fresh" / "p.yaml"             # the same profile name, the warm point
    fresh.parent.mkdir()
    fresh.write_text(yaml.safe_dump({"grid": yaml.safe_load(WARM_GRID)["grid"][-1]}))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")        # the warm kernel's threads: the same sums
    assert batch.run_profile(str(fresh), outputs_dir=str(tmp_path / "fresh"),
                             fresh_kernels=True, report=False) == 0
    assert len(kernel_starts) == 1             # a fresh kernel for its one point
    fresh_runs = list((tmp_path / "fresh" / "runs").iterdir())
    assert len(fresh_runs) == 1 and fresh_runs[0].name.startswith("synthetic-bert-mask")
    for run in fresh_runs:
        other = tmp_path / "warm" / "runs" / run.name
        a, b = (json.loads((d / "metrics.json").read_text()) for d in (run, other))
        assert a["status"] == "ok" and _without_timings(a) == _without_timings(b)
        for path in run.rglob("*.tsv"):
            assert path.read_bytes() == (other / path.relative_to(run)).read_bytes()
        strip = [line.split(",")[:2] + line.split(",")[3:]
                 for line in (run / "history.csv").read_text().splitlines()]
        assert strip == [line.split(",")[:2] + line.split(",")[3:]
                         for line in (other / "history.csv").read_text().splitlines()]
        assert (other / "notebook.ipynb").exists()


def test_main_reports_bad_profiles_in_one_line(capsys):
    assert batch.main(["no-such-profile"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown profile") and "\n" not in err


def test_a_list_of_grids_is_their_union_without_duplicates(tmp_path):
    path = write_profile(tmp_path, """
grid:
  - &base
    task: RTE
    method: bert
    seed: [0, 1]
  - <<: *base
    method: [bert, ssa-h]
    gamma: [0.6, 1.0]
""")
    points = batch.load_profile(str(path)).points
    # bert x 2 seeds, then (bert, ssa-h) x 2 gammas x 2 seeds; bert at the default gamma 1.0 is
    # the first grid's run again and is dropped
    assert len(points) == 2 + 8 - 2
    assert len({RunConfig.from_dict(p).run_id for p in points}) == len(points)


def test_notebook_defaults_do_not_leak_into_the_run(tmp_path, batch_kernel):
    """The grid sets neither lr nor synthetic_size, whose finetune.ipynb defaults (a smoke run)
    differ from RunConfig's: the notebook must still train exactly the runner's config (on
    its first 64 rows: what is trained does not matter here)."""
    path = write_profile(tmp_path, "grid:\n  model: tiny\n  epochs: 1\n  max_train_examples: 64\n")
    outputs = tmp_path / "out"
    assert batch.run_profile(str(path), outputs_dir=str(outputs), report=False) == 0
    cfg = RunConfig.from_dict(batch.load_profile(str(path), str(outputs)).points[0])
    record = json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    assert record["status"] == "ok" and record["run_id"] == cfg.run_id
    assert len(list((outputs / "runs").iterdir())) == 1


# ---------------------------------------------------------------- pre-flight: before any kernel

@pytest.fixture
def no_kernels(monkeypatch):
    """Fail the test if a notebook kernel would start."""
    import papermill

    def refuse(*args, **kwargs):
        raise AssertionError("a notebook kernel was started")

    monkeypatch.setattr(papermill, "execute_notebook", refuse)


def test_a_bad_data_file_stops_the_batch_before_any_kernel(tmp_path, glue_dir, capsys, no_kernels):
    bad = tmp_path / "glue" / "RTE"
    bad.mkdir(parents=True)
    for split in ("train", "dev"):
        (bad / f"{split}.tsv").write_text((glue_dir / "RTE" / f"{split}.tsv").read_text())
    lines = (bad / "dev.tsv").read_text().splitlines()
    lines[5] = lines[5].replace("\tnot_entailment", "\tmaybe").replace("\tentailment", "\tmaybe")
    (bad / "dev.tsv").write_text("\n".join(lines) + "\n")
    path = write_profile(tmp_path, f"grid:\n  task: [synthetic, RTE]\n  model: tiny\n"
                                   f"  glue_dir: {tmp_path / 'glue'}\n")
    assert batch.main([str(path), "--outputs", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    assert "RTE/dev.tsv: line 6" in err and "maybe" in err
    assert not (tmp_path / "out" / "runs").exists()          # nothing ran, nothing was written


def test_a_glue_dir_typo_is_an_error_even_when_skipping_missing_tasks(tmp_path, capsys, no_kernels):
    path = write_profile(tmp_path, "skip_missing_tasks: true\ngrid:\n  task: [RTE, CoLA]\n"
                                   "  glue_dir: /no/such/glue\n")
    assert batch.main([str(path), "--outputs", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "glue_dir=/no/such/glue: no such folder" in err and "\n" not in err


def test_glue_dir_env_typo_is_an_error(tmp_path, capsys, monkeypatch, no_kernels):
    monkeypatch.setenv("GLUE_DIR", "/no/such/env/glue")
    path = write_profile(tmp_path, "skip_missing_tasks: true\ngrid:\n  task: RTE\n")
    assert batch.main([str(path), "--outputs", str(tmp_path / "out")]) == 2
    assert "GLUE_DIR=/no/such/env/glue: no such folder" in capsys.readouterr().err


def test_a_task_found_nowhere_is_skipped_or_stops_the_batch(tmp_path, capsys, batch_kernel):
    """MRPC is not in the project's copy and the hub is unreachable (HF_HUB_OFFLINE=1)."""
    text = "grid:\n  task: [synthetic, MRPC]\n  model: tiny\n  synthetic_size: 64\n  epochs: 1\n"
    path = write_profile(tmp_path, text)
    assert batch.main([str(path), "--outputs", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "MRPC: in no glue_dir / GLUE_DIR nor the project's data/glue" in err
    assert "unreachable" in err and "./run_all.sh fetch MRPC on a networked machine" in err
    path.write_text("skip_missing_tasks: true\n" + text)
    assert batch.main([str(path), "--outputs", str(tmp_path / "out"), "--no-report"]) == 0
    out = capsys.readouterr().out
    assert "task=MRPC method=bert seed=0 model=tiny: absent (MRPC: in no glue_dir" in out
    assert "1 ok, 0 skipped, 0 failed, 1 absent" in out


def test_every_task_of_the_demo_profile_is_in_the_project(no_kernels):
    profile = batch.load_profile("demo")
    assert batch.preflight(profile, profile.points) == {}   # nothing absent, nothing bad


def test_glue_files_resolve_parameter_then_env_then_project_then_hub(tmp_path, monkeypatch):
    from kit.data.pipeline import PROJECT_GLUE, glue_source
    monkeypatch.delenv("GLUE_DIR", raising=False)
    assert glue_source("", "RTE") == PROJECT_GLUE
    assert glue_source("", "MRPC") == "hub"                  # not in the project's copy
    assert glue_source("hub", "RTE") == "hub"
    monkeypatch.setenv("GLUE_DIR", str(tmp_path))
    assert glue_source("", "RTE") == PROJECT_GLUE            # GLUE_DIR does not hold RTE
    for folder in (tmp_path, tmp_path / "other"):                 # train and dev: a run's files
        (folder / "RTE").mkdir(parents=True)
        for split in ("train", "dev"):
            (folder / "RTE" / f"{split}.tsv").write_text("x\n")
    assert glue_source("", "RTE") == tmp_path
    assert glue_source(str(tmp_path / "other"), "RTE") == tmp_path / "other"


def test_nothing_in_the_project_reads_the_shared_folder_beside_the_clone():
    """A user's clone has nothing beside it: code, tests, profiles, notebooks, CI must not read
    the shared folder next to this checkout."""
    needles = ["../" + "shared", "parents[2] / " + '"shared"', "shared/" + "glue",
               "shared/" + "reference"]
    roots = [REPO / d for d in ("kit", "tests", "params", "notebooks", "bench", ".ci")]
    files = [f for r in roots for f in r.rglob("*") if f.is_file() and f.suffix in
             (".py", ".yaml", ".ipynb", ".sh", ".cfg", ".toml", "") and "__pycache__" not in f.parts]
    files += [REPO / "run_all.sh", REPO / "pyproject.toml"]
    hits = [f"{f.relative_to(REPO)}: {n}" for f in files for n in needles
            if n in f.read_text(errors="replace")]
    assert not hits


def test_log_progress_lines_are_whole_lines(monkeypatch):
    import io
    from kit.train import progress
    out = io.StringIO()
    bar = progress.LineBar(range(5), desc="epoch 0/1 train", file=out, mininterval=0, delay=0,
                           miniters=1)
    for _ in bar:
        bar.set_postfix(loss="0.5000", refresh=False)
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and out.getvalue().endswith("\n")
    assert lines[0].startswith("epoch 0/1 train:   0% 0/5")
    assert lines[-1].startswith("epoch 0/1 train: 100% 5/5") and lines[-1].endswith("loss=0.5000")


def test_warm_kernels_start_with_the_environment_they_are_given(tmp_path, run_notebook):
    """kit.cluster.kernels.Kernels(env=...) (the notebook tests' shared kernel: one torch thread);
    papermill starts fresh kernels itself, so env with fresh=True is refused."""
    import nbformat
    from kit.cluster.kernels import Kernels
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os, torch; print(os.environ['OMP_NUM_THREADS'], torch.get_num_threads())")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "env.ipynb")
    run_notebook(tmp_path / "env.ipynb", tmp_path / "out.ipynb")
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert out.cells[-1].outputs[0]["text"] == "1 1\n"
    with pytest.raises(ValueError, match="warm kernels only"):
        Kernels(fresh=True, env={"OMP_NUM_THREADS": "1"})


def test_a_notebook_with_nothing_to_show_keeps_its_kernel_any_other_error_replaces_it(
        tmp_path, warm_kernels):
    """NoRuns (a results notebook's "nothing to show", raised before any work) leaves the warm
    kernel running, reset for the next notebook; any other error takes the kernel with it."""
    import nbformat
    import papermill

    def run(code: str) -> str:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        nbformat.write(nb, tmp_path / "in.ipynb")
        warm_kernels.execute(tmp_path / "in.ipynb", tmp_path / "out.ipynb", {}, stderr_file=None)
        return nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[0].outputs[-1]["text"]

    pid = run("import os; print(os.getpid())")
    for error in ("from kit.results.frame.no_runs import NoRuns; raise NoRuns('none here')",
                  "raise ValueError('broken')"):
        with pytest.raises(papermill.PapermillExecutionError):
            run(f"leftover = 1\n{error}")
        if "NoRuns" in error:      # the same kernel, its namespace reset
            same = run("import os; print(os.getpid(), 'leftover' in dir())")
            assert same == f"{pid.strip()} False\n"
    assert run("import os; print(os.getpid())") != pid


# ------------------------------------------------ a scheduler's signal at any moment of a batch

TINY = {"task": "synthetic", "model": "tiny", "method": "bert", "synthetic_size": 200,
        "epochs": 2, "lr": 5.0e-3, "batch_size": 16, "report_to": ["none"]}


def tiny_profile(tmp_path, seeds=(0,)) -> Path:
    return write_profile(tmp_path, yaml.safe_dump({"report": False, "grid": [
        {**TINY, "seed": seed} for seed in seeds]}))


@pytest.fixture
def signal_in_cell(monkeypatch):
    """`signal_in_cell(event, needle, delay, signum)`: SIGUSR1 (or `signum`) to this process
    (the batch's) when papermill starts ("start") or has completed ("complete") the first cell
    whose source holds `needle` (the injected parameters: "injected-parameters"), `delay` s
    later: the moments between two cells (the kernel idle) and inside one."""
    import os
    import signal
    import threading

    from papermill.engines import NotebookExecutionManager
    armed = {}

    def hook(name):
        original = getattr(NotebookExecutionManager, name)

        def wrapped(self, cell, *args, **kwargs):
            result = original(self, cell, *args, **kwargs)
            needle = armed.get(name)
            if needle and (needle in cell.source or needle in cell.metadata.get("tags", [])):
                del armed[name]
                threading.Timer(armed.pop("delay"), os.kill,
                                (os.getpid(), armed.pop("signum"))).start()
            return result
        monkeypatch.setattr(NotebookExecutionManager, name, wrapped)

    hook("cell_start")
    hook("cell_complete")
    return lambda event, needle, delay=0.0, signum=signal.SIGUSR1: armed.update(
        {f"cell_{event}": needle, "delay": delay, "signum": signum})


def record_of(path, outputs, i=0) -> dict:
    cfg = RunConfig.from_dict(batch.load_profile(str(path), str(outputs)).points[i])
    metrics = run_dir_of(cfg) / "metrics.json"
    return json.loads(metrics.read_text()) if metrics.exists() else {}


def test_a_signal_between_cells_reaches_the_run_and_its_record_names_it(
        tmp_path, capsys, batch_kernel, signal_in_cell):
    """SIGUSR1 to the batch right after the parameters cell, while the kernel is idle (a kernel
    ignores a signal then): it reaches fit() in the next cell, whose run stops with a checkpoint
    and records SIGUSR1, the signal the batch got (tests/test_preemption.py resumes such runs)."""
    profile, outputs = tiny_profile(tmp_path), tmp_path / "out"
    signal_in_cell("complete", "injected-parameters")
    assert batch.run_profile(str(profile), outputs_dir=str(outputs)) == 75
    assert "stopped by SIGUSR1: 1 run(s) preempted with a checkpoint" in capsys.readouterr().out
    record = record_of(profile, outputs)
    assert record["status"] == "preempted" and record["preempted"]["signal"] == "SIGUSR1"
    assert record["preempted"]["checkpoint"] and record["preempted"]["step"] >= 1


def test_a_signal_after_fit_leaves_the_finished_run_and_its_notebook(
        tmp_path, capsys, batch_kernel, signal_in_cell):
    """SIGUSR1 while the cells after fit() run (its plot): the run has finished, so it stays ok
    with its executed notebook, whole; the batch starts no next point and says so."""
    profile, outputs = tiny_profile(tmp_path, seeds=(0, 1)), tmp_path / "out"
    signal_in_cell("start", "plot_loss(run_dir_of", delay=0.05)
    assert batch.run_profile(str(profile), outputs_dir=str(outputs)) == 75
    out = capsys.readouterr().out
    assert "stopped by SIGUSR1: 0 run(s) preempted with a checkpoint, 1 not started; 1 ok" in out
    assert record_of(profile, outputs, 0)["status"] == "ok" and not record_of(profile, outputs, 1)
    cfg = RunConfig.from_dict(batch.load_profile(str(profile), str(outputs)).points[0])
    cells = json.loads((run_dir_of(cfg) / "notebook.ipynb").read_text())["cells"]
    assert not [o for c in cells for o in c.get("outputs", []) if o["output_type"] == "error"]


@pytest.mark.parametrize("moment", ["the kernel starts", "the point is handed over"])
def test_a_signal_before_the_point_trains_stops_the_batch_with_nothing_lost(
        tmp_path, capsys, monkeypatch, batch_kernel, warm_kernels, moment):
    """SIGUSR1 while the point's kernel starts, or between the batch's look at the signals and
    its handing the point over: the point does not train (it would run on into the hard limit)
    and the batch, which did nothing this start, exits 3 (not 75: a requeue would do the same)
    and keeps its kernel."""
    import os
    import signal
    profile, outputs = tiny_profile(tmp_path), tmp_path / "out"

    def signalled(original):
        def call(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGUSR1)
            return original(*args, **kwargs)
        return call

    if moment == "the kernel starts":
        monkeypatch.setattr(warm_kernels, "_warm", signalled(warm_kernels._warm))
    else:
        from kit.cluster import point
        monkeypatch.setattr(point, "make_run_dir", signalled(point.make_run_dir))
    assert batch.run_profile(str(profile), outputs_dir=str(outputs)) == 3
    out = capsys.readouterr().out
    assert "stopped (not started)" in out
    assert "stopped by SIGUSR1: no progress in this start: no point finished; a rerun would " \
           "stop the same way; 0 ok, 0 failed (exit 3)" in out
    assert record_of(profile, outputs) == {}
    assert warm_kernels._manager is not None          # no cell was cut: the kernel stays


def test_a_point_another_batch_holds_is_waited_for_then_one_line_and_exit_1(tmp_path, capsys):
    """The batch lock of a point held (another batch runs it, or a lock a dead node left on a
    filesystem without cluster-wide flock): the batch waits --lock-wait, then says so in one
    line naming the lock and exits 1 (not 0 with the point counted as skipped)."""
    from kit.io import FileLock
    profile, outputs = tiny_profile(tmp_path), tmp_path / "out"
    cfg = RunConfig.from_dict(batch.load_profile(str(profile), str(outputs)).points[0])
    lock = run_dir_of(cfg) / ".batch.lock"
    with FileLock(lock):
        assert batch.run_profile(str(profile), outputs_dir=str(outputs), lock_wait_s=0.5) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].endswith(": held (running in another batch): waited for at the end")
    assert lines[-1] == (f"profile p: 1 point(s) held by another batch for 0s (--lock-wait), not "
                         f"run here; rerun once it has ended (docs/cluster.md): {lock}")


def test_only_the_shard_that_finishes_the_grid_builds_the_report(tmp_path, capsys, monkeypatch,
                                                                 no_kernels):
    """Shards of an array: the one that ends first leaves the report (its grid is not finished);
    the last one builds it, once."""
    from kit import io as kio, runs
    profile, outputs = tiny_profile(tmp_path, seeds=(0, 1)), tmp_path / "out"
    write_profile(tmp_path, profile.read_text().replace("report: false", "report: true"))

    def finish(profile, point, *args):       # a point "trained": its ok record
        cfg = RunConfig.from_dict(point)
        kio.write_json(runs.metrics_path(runs.make_run_dir(cfg)), {"status": "ok"})
        return "ok", ""

    monkeypatch.setattr(batch, "execute", finish)
    monkeypatch.setattr(batch.profile_outputs, "write", lambda *args, **kwargs: [])
    monkeypatch.setattr(batch, "build_report", lambda *args: "report: BUILT")
    assert batch.run_profile(str(profile), "0/2", outputs_dir=str(outputs)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "report: left to the shard that finishes the grid (1 of 2 point(s) not finished)")
    assert batch.run_profile(str(profile), "1/2", outputs_dir=str(outputs)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "report: BUILT"


# ------------------------------------------------ torchrun's grace follows --signal-grace

def test_torchrun_gets_the_grace_and_the_signal_the_batch_got(tmp_path, monkeypatch):
    """The command the batch builds for --processes N: torchrun's shutdown timeout is the grace
    (its own is 30 s, whatever SLURM allows) and it passes SIGUSR1 on (it would die of it)."""
    from kit.cluster import torchrun
    assert torchrun.torchrun_knows("--shutdown-timeout")        # the pinned torch has both
    seen = []
    from kit.cluster import point
    monkeypatch.setattr(point, "run_torchrun", lambda cmd, env: seen.append(cmd) or (0, []))
    point = batch.load_profile(str(tiny_profile(tmp_path)), str(tmp_path / "out")).points[0]
    assert batch.execute(batch.load_profile("smoke"), point, processes=2, grace_s=300) == (
        "ok", "")
    cmd = seen[0]
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert "--shutdown-timeout=300" in cmd
    assert "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in cmd
    assert cmd[-3:-1] == ["-m", "kit.train.finetune"]


WORKER = """import os, pathlib, signal, sys, time
out, rank = pathlib.Path(sys.argv[1]), os.environ["RANK"]
def stop(signum, frame):           # a run's checkpoint on a signal: 4 s of writing
    (out / f"signal{rank}").write_text(signal.Signals(signum).name)
    time.sleep(4)
    (out / f"written{rank}").write_text("")
    sys.exit(75)
signal.signal(signal.SIGUSR1, stop)
signal.signal(signal.SIGTERM, stop)
(out / f"ready{rank}").write_text("")
while True:
    time.sleep(0.05)
"""


def test_torchrun_gives_its_workers_the_grace_not_its_own_30s(tmp_path):
    """Two stand-in workers under the batch's torchrun command, grace 1 s: the batch's SIGUSR1
    reaches both as SIGUSR1, and torchrun kills them 1 s later, in the middle of their 4 s
    checkpoint. So the grace reaches torchrun (its default, 30 s, would let them finish);
    with --signal-grace above a write's time, a write finishes (docs/cluster.md)."""
    import os
    import signal
    import threading
    import time

    from kit.cluster import signals, torchrun
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    cmd = torchrun.torchrun_command([str(worker), str(tmp_path)], 2, grace_s=1)
    sent = []

    def signal_once_ready():
        while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
            time.sleep(0.05)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=signal_once_ready, daemon=True).start()
    with signals.forwarding_signals():
        code, _ = torchrun.run_torchrun(cmd, {**os.environ, "OMP_NUM_THREADS": "1"})
    assert code != 0 and sent
    assert [(tmp_path / f"signal{r}").read_text() for r in (0, 1)] == ["SIGUSR1", "SIGUSR1"]
    assert not list(tmp_path.glob("written*"))     # cut after 1 s, not 30


def test_the_signal_thread_waits_between_resends_in_every_batch_of_a_process(monkeypatch):
    """The forwarding thread wakes on a signal, then every RESEND_S until the point settles. Its
    wake-up event is consumed: left set (after a signal, or by the end of an earlier batch in the
    same process) it made the thread spin a core, and, holding the GIL, slowed the batch's own
    work (a smoke report's tables took 7 s instead of 0.2 s). Counted: the thread's waits."""
    import os
    import signal
    import threading
    import time

    from kit.cluster import signals
    forward, waits = signals.Forwarder(), []
    real_wait = threading.Event.wait
    monkeypatch.setattr(forward._wake, "wait", lambda timeout=None: (
        waits.append(1), real_wait(forward._wake, timeout))[1], raising=False)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        for _ in range(2):                                # two batches in one process
            waits.clear()
            sent = []
            with forward, forward.point(sent.append, settled=lambda: len(sent) >= 2):
                started = time.monotonic()
                os.kill(os.getpid(), signal.SIGUSR1)
                time.sleep(5 * signals.RESEND_S)
                slept = time.monotonic() - started       # longer than asked on a busy machine
                received = forward.received               # (forgotten when the batch ends)
            assert received == "SIGUSR1"
            assert sent == ["SIGUSR1"] * 2        # at once, again after RESEND_S, then settled
            # one wait a RESEND_S (+ the first and the wake-up); a spinning thread: thousands
            assert len(waits) <= slept / signals.RESEND_S + 3, f"{len(waits)} waits in {slept:.1f} s"
    finally:
        signal.signal(signal.SIGUSR1, previous)


# ------------------------------------------------ nothing hidden: a notebook's own failures

def notebook_with(tmp_path, before: str = "", after: str = "") -> Path:
    """notebooks/finetune.ipynb's parameters cell and fit() cell, with a cell of code `before`
    between them and one `after` fit()'s."""
    import nbformat
    nb = nbformat.read(REPO / "notebooks" / "finetune.ipynb", as_version=4)
    parameters = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    fit_cell = next(c for c in nb.cells if "fit(config)" in c.source)
    extra = lambda code: [nbformat.v4.new_code_cell(code)] if code else []   # noqa: E731
    nb.cells = [parameters, *extra(before), fit_cell, *extra(after)]
    path = tmp_path / "notebook.ipynb"
    nbformat.write(nb, path)
    return path


def with_notebook(monkeypatch, notebook: Path) -> None:
    """The batch runs its profile's points through `notebook` (a test's own)."""
    import dataclasses
    load = batch.load_profile
    monkeypatch.setattr(batch, "load_profile", lambda *args: dataclasses.replace(
        load(*args), notebook=notebook))


def test_a_notebook_that_fails_after_fit_is_its_own_outcome_and_exit_1(
        tmp_path, capsys, monkeypatch, batch_kernel):
    """A cell after fit() raises (a plot, a prediction): the point is `notebook failed`, named
    in the summary and the exit status (1); its finished run stays, with the notebook that
    shows the error, and the next batch skips it (never rerun, never deleted)."""
    profile, outputs = tiny_profile(tmp_path), tmp_path / "out"
    with_notebook(monkeypatch, notebook_with(tmp_path, after='raise ValueError("the plot failed")'))
    assert batch.run_profile(str(profile), outputs_dir=str(outputs)) == 1
    lines = capsys.readouterr().out.splitlines()
    cfg = RunConfig.from_dict(batch.load_profile(str(profile), str(outputs)).points[0])
    label = point_label(cfg.to_dict())
    notebook = run_dir_of(cfg) / "notebook.ipynb"
    assert re.fullmatch(rf"\[1/1\] {re.escape(label)}: notebook failed \(the run finished ok; "
                        r"ValueError: the plot failed\) \d+s", lines[2])
    assert re.fullmatch(r"profile p: 0 ok, 0 skipped, 0 failed, 0 absent \(task files missing\), "
                        r"1 notebook failed after its run finished in \d+s", lines[-2])
    assert lines[-1] == (f"profile p: 1 finished run(s) whose notebook failed after training "
                         f"(the runs are kept; the error is in the notebook): {notebook}")
    assert record_of(profile, outputs)["status"] == "ok"
    errors = [o for c in json.loads(notebook.read_text())["cells"] for o in c.get("outputs", [])
              if o["output_type"] == "error"]
    assert [(e["ename"], e["evalue"]) for e in errors] == [("ValueError", "the plot failed")]
    inode = (run_dir_of(cfg) / "metrics.json").stat().st_ino
    assert batch.run_profile(str(profile), outputs_dir=str(outputs)) == 0
    assert ": skipped (finished earlier)" in capsys.readouterr().out
    assert (run_dir_of(cfg) / "metrics.json").stat().st_ino == inode


def test_a_kernel_that_cannot_start_is_one_failed_point_and_the_batch_goes_on(
        tmp_path, capsys, monkeypatch, batch_kernel, warm_kernels):
    """The first point's kernel dies while it starts: that point fails in one line (no record:
    it never ran) and the next point runs in the kernel started after it."""
    profile, outputs = tiny_profile(tmp_path, seeds=(0, 1)), tmp_path / "out"
    start, starts = warm_kernels.start, []

    def dies_once():
        starts.append(1)
        if len(starts) == 1:
            raise RuntimeError("Kernel died before replying to kernel_info")
        start()

    monkeypatch.setattr(warm_kernels, "start", dies_once)
    assert batch.run_profile(str(profile), outputs_dir=str(outputs)) == 1
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"\[1/2\] .*: failed \(the kernel did not start: RuntimeError: Kernel died "
                        r"before replying to kernel_info\) 0s, ETA .*", lines[2])
    assert re.fullmatch(r"\[2/2\] .*: ok \d+s", lines[4])
    assert "profile p: 1 ok, 0 skipped, 1 failed" in lines[-1]
    assert record_of(profile, outputs, 0) == {} and record_of(profile, outputs, 1)["status"] == "ok"


def test_ctrl_c_in_a_cell_before_fit_reaches_fit_as_the_other_signals_do(
        tmp_path, capsys, monkeypatch, batch_kernel, signal_in_cell):
    """SIGINT (Ctrl-C) to the batch while a cell before fit() runs: the kernel ignores it there,
    as SIGUSR1 and SIGTERM, so the cell is not cut; passed on again, it reaches fit(), which
    stops with a checkpoint and records SIGINT: exit 75, as for the scheduler's signals."""
    import signal
    profile, outputs = tiny_profile(tmp_path), tmp_path / "out"
    with_notebook(monkeypatch, notebook_with(tmp_path, before="import time\ntime.sleep(1.5)"))
    signal_in_cell("start", "time.sleep", delay=0.3, signum=signal.SIGINT)
    assert batch.run_profile(str(profile), outputs_dir=str(outputs)) == 75
    assert "stopped by SIGINT: 1 run(s) preempted with a checkpoint" in capsys.readouterr().out
    record = record_of(profile, outputs)
    assert record["status"] == "preempted" and record["preempted"]["signal"] == "SIGINT"


def test_a_corrupt_record_reads_as_none_wherever_only_the_runs_end_is_asked(tmp_path):
    """One helper (kit.runs.readable_metrics) for every reader that asks how a run ended and
    tolerates a corrupt metrics.json: it is no finished run, no record of the grid, a point the
    grid has left, and tables name the file (kit.results.frame.collect)."""
    from kit import runs
    from kit.cluster import tally
    point = batch.load_profile(str(tiny_profile(tmp_path)), str(tmp_path / "out")).points[0]
    cfg = RunConfig.from_dict(point)
    runs.metrics_path(runs.make_run_dir(cfg)).write_text('{"status": "ok", ')    # cut short
    assert runs.readable_metrics(run_dir_of(cfg)) is None and runs.finished_metrics(cfg) is None
    assert tally.records([point]) == {} and tally.unfinished([point]) == 1
    assert batch.resume_first([point]) == [point]
    with pytest.raises(ValueError, match="metrics.json"):
        runs.read_metrics(run_dir_of(cfg))


def test_a_batchs_signal_is_forgotten_when_the_batch_ends():
    """A point run later in the same process outside a batch (kit.cluster.point.execute, as
    tests and notebooks call it) must not find the last batch's signal and call itself stopped
    (it did: test_dead_kernel_is_recorded_as_failed failed after a signal test in its worker)."""
    import signal

    from kit.cluster.signals import FORWARD
    previous = signal.getsignal(signal.SIGUSR1)
    with FORWARD as forward:
        forward(signal.SIGUSR1, None)                 # the handler, as the signal calls it
        assert forward.received == "SIGUSR1"
    assert FORWARD.received is None
    assert signal.getsignal(signal.SIGUSR1) == previous
