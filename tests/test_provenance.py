"""Provenance: every run says which commit, libraries, CPU class and GPU made it, and a table
says in one line when its runs come from different environments or have too few seeds."""
import json

import pandas as pd
import pytest

from kit import provenance, report, table_sets, writers
from kit.config import RunConfig
from kit.train import fit, run_dir_of


@pytest.mark.parametrize("flags, arch, want", [
    (["avx2", "avx512_f", "avx512_bf16", "amx_tile", "amx_bf16"], "x86_64", "amx"),
    (["avx2", "avx512_f", "avx512_bf16"], "x86_64", "avx512_bf16"),
    (["avx2", "avx512_f"], "x86_64", "avx512"),
    (["avx2"], "x86_64", "avx2"),
    ([], "arm64", "arm64")])
def test_cpu_class_names_the_best_matrix_instructions(flags, arch, want):
    assert provenance.cpu_class(flags, arch) == want


def test_a_finished_run_records_where_it_was_made(tmp_path):
    cfg = RunConfig(task="synthetic", model="tiny", synthetic_size=32, epochs=1,
                    save_checkpoints=False, outputs_dir=str(tmp_path))
    fit(cfg)
    env = json.loads((run_dir_of(cfg) / "metrics.json").read_text())["environment"]
    assert set(env) == {"kit_commit", "kit_dirty", "python", "torch", "transformers",
                        "accelerate", "datasets", "cpu", "threads", "gpu", "processes"}
    assert set(env["cpu"]) == {"model", "arch", "flags", "native_bf16", "cpu_class"}
    assert env["processes"] == 1 and env["gpu"] is None and env["threads"] >= 1
    assert env["torch"] == provenance.versions()["torch"]
    assert env["cpu"]["cpu_class"] == provenance.cpu_info()["cpu_class"]


def test_the_commit_is_none_outside_a_checkout(tmp_path):
    assert provenance.kit_commit(tmp_path) == (None, None)


def _env(cpu_class="avx2", torch="2.13.0", gpu=None):
    return {"cpu": {"cpu_class": cpu_class}, "gpu": gpu, "torch": torch,
            "transformers": "5.24.0", "accelerate": "1.15.0"}


def test_one_environment_gives_no_warning():
    assert report.mixed_environments([("a", _env()), ("b", _env())]) is None


def test_mixed_environments_name_the_fields_and_the_runs():
    runs = [("a", _env()), ("b", _env("amx")), ("c", _env("amx", torch="2.9.0")),
            ("d", _env()), ("e", _env()), ("f", _env()), ("g", None)]
    assert report.mixed_environments(runs) == (
        "warning: this table mixes environments: cpu_class avx2 (a, d, e and 1 more) vs amx "
        "(b, c); torch 2.13.0 (a, b, d and 2 more) vs 2.9.0 (c); no environment recorded (g)")


def test_a_gpu_run_beside_a_cpu_run_is_mixed():
    line = report.mixed_environments([("a", _env()), ("b", _env(gpu={"name": "Tesla T4"}))])
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
    assert report.table_notes(_runs(seeds)) == want


def test_the_notes_head_the_written_tables_once(tmp_path):
    runs = _runs(1)
    runs.at[0, "environment"] = _env("amx")
    tables = table_sets.with_notes({"One": runs[["method", "score"]], "Two": runs[["seed"]]},
                                   report.table_notes(runs))
    md = writers.write_tables(tables, "p", tmp_path)[0].read_text()
    assert md.startswith("> warning: this table mixes environments: cpu_class amx (bert0) vs "
                         "avx2 (ssa-h0)\n\n> 1 run (seed) per cell: ")
    assert md.count("> ") == 2 and "## One" in md
