"""Provenance: every run says which commit, libraries, CPU class and GPU made it, and a table
says in one line when its runs come from different environments or have too few seeds."""
import json
import platform
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

from kit import batch, runs
from kit.config import paths
from kit.train import provenance
from kit.train.accel import machine_device
from kit.results.frame import collect
from kit.results.tables import table_sets, writers
from kit.results.report import profile_outputs
from kit.config.run_config import RunConfig
from kit.train.finetune import fit
from kit.runs import run_dir_of

FIELDS = {"kit_commit", "kit_dirty", "python", "torch", "transformers", "accelerate", "datasets",
          "cpu", "threads", "gpu", "processes", "per_device"}
CPU_FIELDS = {"model", "arch", "flags", "native_bf16", "cpu_class"}


@pytest.mark.parametrize("flags, arch, want", [
    (["avx2", "avx512_f", "avx512_bf16", "amx_tile", "amx_bf16"], "x86_64", "amx"),
    (["avx2", "avx512_f", "avx512_bf16"], "x86_64", "avx512_bf16"),
    (["avx2", "avx512_f"], "x86_64", "avx512"),
    (["avx2"], "x86_64", "avx2"),
    ([], "arm64", "arm64")])
def test_cpu_class_names_the_best_matrix_instructions(flags, arch, want):
    assert provenance.cpu_class(flags, arch) == want


@pytest.fixture
def fresh_cpu_info():
    """cpu_info and cpu_model are cached per process: clear them around a test that fakes the
    CPU, so neither the fake nor a real answer leaks between tests."""
    for cached in (provenance.cpu_info, provenance.cpu_model):
        cached.cache_clear()
    yield
    for cached in (provenance.cpu_info, provenance.cpu_model):
        cached.cache_clear()


@pytest.mark.parametrize("caps, arch, flags, cls, bf16", [
    ({"avx2": True, "avx512_f": True, "avx512_bf16": True, "amx_tile": True, "amx_bf16": True,
      "sse4_2": True}, "x86_64", ["avx2", "avx512_f", "avx512_bf16", "amx_tile", "amx_bf16"],
     "amx", True),
    ({"avx2": True, "avx512_f": False}, "x86_64", ["avx2"], "avx2", False),
    ({"neon": True, "bf16": True, "sve": True, "sve_max_length": 256}, "aarch64",
     ["neon", "bf16", "sve"], "aarch64", False)])
def test_cpu_info_reads_torchs_capabilities(monkeypatch, fresh_cpu_info, caps, arch, flags, cls,
                                            bf16):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    monkeypatch.setattr(platform, "machine", lambda: arch)
    info = provenance.cpu_info()
    assert (info["arch"], info["flags"], info["cpu_class"], info["native_bf16"]) == (
        arch, flags, cls, bf16)


def test_environment_has_every_field():
    env = provenance.environment(4)
    assert set(env) == FIELDS and set(env["cpu"]) == CPU_FIELDS
    assert env["processes"] == 4 and env["threads"] == torch.get_num_threads()
    assert env["per_device"] == 1                     # no pool slot set SSA_KIT_PER_DEVICE
    assert env["python"] == platform.python_version() and env["cpu"] == provenance.cpu_info()


@pytest.mark.parametrize("value, k", [("3", 3), ("0", 1), ("x", 1)])
def test_a_run_records_the_k_points_that_shared_its_device(tmp_path, monkeypatch, value, k):
    """kit.cluster.pool starts K > 1 kernels with SSA_KIT_PER_DEVICE=K: their runs say so in
    metrics.json and its environment (a value that is no K >= 1 reads 1)."""
    monkeypatch.setenv("SSA_KIT_PER_DEVICE", value)
    cfg = RunConfig(task="synthetic", model="tiny", synthetic_size=16, epochs=1,
                    save_checkpoints=False, outputs_dir=str(tmp_path))
    fit(cfg)
    metrics = json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    assert (metrics["per_device"], metrics["environment"]["per_device"]) == (k, k)


def test_a_finished_run_records_where_it_was_made(tmp_path):
    cfg = RunConfig(task="synthetic", model="tiny", synthetic_size=32, epochs=1,
                    save_checkpoints=False, outputs_dir=str(tmp_path))
    fit(cfg)
    env = json.loads((run_dir_of(cfg) / "metrics.json").read_text())["environment"]
    assert set(env) == FIELDS and set(env["cpu"]) == CPU_FIELDS
    assert env["processes"] == 1 and env["gpu"] == provenance.gpu_info() and env["threads"] >= 1
    assert (env["gpu"] is None) is (machine_device() == "cpu")          # None on this CPU
    assert env["torch"] == provenance.versions()["torch"]
    assert env["cpu"]["cpu_class"] == provenance.cpu_info()["cpu_class"]


def test_a_failed_run_records_where_it_failed(tmp_path):
    cfg = RunConfig(task="synthetic", model="tiny", outputs_dir=str(tmp_path))
    runs.make_run_dir(cfg)
    runs.record_failed(cfg, "RuntimeError: boom", environment=provenance.environment(2))
    record = json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    assert record["status"] == "failed" and set(record["environment"]) == FIELDS
    assert record["environment"]["processes"] == 2


def test_the_commit_is_none_outside_a_checkout(tmp_path):
    assert paths.kit_commit(tmp_path) == (None, None)


def test_runs_record_this_checkouts_commit():
    """The default is the checkout kit/ lives in (the layout move once pointed it at kit/ itself,
    and every run recorded no commit)."""
    repo = Path(__file__).resolve().parents[1]
    assert paths.PROJECT == repo
    if (repo / ".git").exists() and shutil.which("git"):
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        assert paths.kit_commit()[0] == head


@pytest.mark.parametrize("change, dirty", [(None, False), ("untracked", False), ("tracked", True)])
def test_only_tracked_changes_make_the_checkout_dirty(tmp_path, change, dirty):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t",
                               "-c", "user.email=t@t", *args], check=True, capture_output=True,
                              text=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "kit.py").write_text("a = 1\n")
    git("add", "kit.py")
    git("commit", "-q", "-m", "one")
    if change == "untracked":
        (tmp_path / "outputs").mkdir()
        (tmp_path / "outputs" / "metrics.json").write_text("{}")
    elif change == "tracked":
        (tmp_path / "kit.py").write_text("a = 2\n")
    assert paths.kit_commit(tmp_path) == (git("rev-parse", "HEAD"), dirty)


def _env(cpu_class="avx2", torch="2.13.0", gpu=None):
    return {"cpu": {"cpu_class": cpu_class}, "gpu": gpu, "torch": torch,
            "transformers": "5.24.0", "accelerate": "1.15.0"}


@pytest.mark.parametrize("envs", [
    [_env(), _env()],                   # one environment
    [None, None],                       # runs from before provenance only: nothing to compare
    [_env()],
    [_env(), {**_env(), "python": "3.12.1", "threads": 8, "kit_commit": "abc"}]])  # not compared
def test_one_environment_gives_no_warning(envs):
    assert collect.mixed_environments(list(zip("abc", envs))) is None


def test_mixed_environments_name_the_fields_and_the_runs():
    runs = [("a", _env()), ("b", _env("amx")), ("c", _env("amx", torch="2.9.0")),
            ("d", _env()), ("e", _env()), ("f", _env()), ("g", None)]
    assert collect.mixed_environments(runs) == (
        "warning: this table mixes environments: cpu_class avx2 (a, d, e and 1 more) vs amx "
        "(b, c); torch 2.13.0 (a, b, d and 2 more) vs 2.9.0 (c); no environment recorded (g)")


def test_runs_timed_k_at_once_beside_runs_alone_are_mixed():
    line = collect.mixed_environments([("a", _env()), ("b", {**_env(), "per_device": 2}),
                                       ("c", {**_env(), "per_device": 1})])
    assert line == "warning: this table mixes environments: per_device 1 (a, c) vs 2 (b)"


def test_a_gpu_run_beside_a_cpu_run_is_mixed():
    line = collect.mixed_environments([("a", _env()), ("b", _env(gpu={"name": "Tesla T4"}))])
    assert line.endswith("gpu none (a) vs Tesla T4 (b)")


def _runs(seeds: int, envs=None) -> pd.DataFrame:
    rows = [{"run_id": f"{m}{s}", "task": "RTE", "model": "minilm", "method": m, "seed": s,
             "status": "ok", "score": 0.5 + s / 100, "environment": _env()}
            for m in ("bert", "ssa-h") for s in range(seeds)]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seeds, want", [
    (1, ["1 run (seed) per cell: differences between methods are not evidence (at least 3 "
         "seeds per cell are)"]),
    (2, ["2 runs (seeds) per cell: differences between methods are not evidence (at least 3 "
         "seeds per cell are)"]),
    (3, [])])
def test_tables_with_fewer_than_three_seeds_per_cell_say_so(seeds, want):
    assert collect.table_notes(_runs(seeds)) == want


def test_the_notes_head_the_written_tables_once(tmp_path):
    runs = _runs(1)
    runs.at[0, "environment"] = _env("amx")
    tables = table_sets.with_notes({"One": runs[["method", "score"]], "Two": runs[["seed"]]},
                                   collect.table_notes(runs))
    md = writers.write_tables(tables, "p", tmp_path)[0].read_text()
    assert md.startswith("> warning: this table mixes environments: cpu_class amx (bert0) vs "
                         "avx2 (ssa-h0)\n\n> 1 run (seed) per cell: ")
    assert md.count("> ") == 2 and "## One" in md


def test_a_one_seed_profile_says_so_above_its_printed_and_written_tables(tmp_path, capsys):
    """The demo's shape (two methods, seed 0) through kit.results.report.profile_outputs, with the
    tiny model."""
    path = tmp_path / "one-seed.yaml"
    path.write_text("grid:\n  task: synthetic\n  model: tiny\n  method: [bert, ssa-h]\n"
                    "  seed: 0\n  synthetic_size: 32\n  epochs: 1\n  save_checkpoints: false\n")
    profile = batch.load_profile(str(path), str(tmp_path))
    for point in profile.points:
        fit(RunConfig.from_dict(point))
    paths = profile_outputs.write(profile, str(tmp_path), show=True)
    note = ("1 run (seed) per cell: differences between methods are not evidence (at least 3 "
            "seeds per cell are)")
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith("Paper layout (Table 2) - one-seed") and printed[2] == note
    assert paths[0].read_text().startswith(f"> {note}\n\n## Paper layout")


def test_figures_come_from_the_profile_file_and_nothing_to_draw_is_one_line(tmp_path, capsys):
    """A YAML named like a shipped profile (demo.yaml) draws from its own runs, not from
    params/demo.yaml's; a figure with nothing to draw (no SSA run) is one line, the tables
    stand."""
    grid = "  task: synthetic\n  model: tiny\n  seed: 0\n  synthetic_size: 32\n  epochs: 2\n" \
           "  save_checkpoints: false\nfigures: [label-quality]\n"
    own = tmp_path / "mine" / "demo.yaml"
    own.parent.mkdir()
    own.write_text("grid:\n  method: [bert, ssa-h]\n" + grid)
    bare = tmp_path / "bare.yaml"
    bare.write_text("grid:\n  method: bert\n" + grid)
    drawn = {}
    for path in (own, bare):
        profile = batch.load_profile(str(path), str(tmp_path))
        for point in profile.points:
            fit(RunConfig.from_dict(point))
        drawn[path.stem] = profile_outputs.write(profile, str(tmp_path))
    assert drawn["demo"][-1] == tmp_path / "figures" / "demo-label-quality.png"
    assert drawn["bare"] and all(p.parent.name == "tables" for p in drawn["bare"])
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("figure label-quality: not drawn (label quality: ")
