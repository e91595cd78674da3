"""Every batch says where it trains: its first line names the device (a GPU by name), the
precision `mixed_precision: auto` resolves to there, the processes a run takes and K, and which
points replay CUDA graphs and why."""
import pytest
import torch

from kit import batch
from kit.cluster import tally
from kit.train import accel

from tests.test_batch import write_profile

POINT = {"task": "synthetic", "model": "tiny"}


@pytest.mark.parametrize("machine, asked, processes, k, line", [
    ("cpu-bf16", ["auto"], 1, 1, "on cpu, bf16 (auto), one point at a time"),
    ("cpu", ["auto", "bf16"], 1, 3, "on cpu, fp32 (auto), bf16, 3 points at once"),
    ("a100", ["auto"], 4, 1, "on cuda (NVIDIA A100-SXM4-80GB), bf16 (auto), 4 processes a run, "
                             "one point at a time"),
    ("t4", ["auto", "no"], 1, 2, "on cuda (Tesla T4), fp16 (auto), fp32, 2 points at once")])
def test_the_where_line(monkeypatch, machine, asked, processes, k, line):
    gpu = {"a100": "NVIDIA A100-SXM4-80GB", "t4": "Tesla T4"}.get(machine)
    monkeypatch.setattr(accel, "machine_device", lambda: "cuda" if gpu else "cpu")
    monkeypatch.setattr(accel, "cuda_has_native_bf16", lambda: machine == "a100")
    monkeypatch.setattr(accel, "cpu_has_native_bf16", lambda: machine == "cpu-bf16")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: gpu)
    points = [{**POINT, "mixed_precision": a} for a in asked]
    assert tally.where_line(points, k, processes) == line


def test_a_batchs_first_line_says_where_it_trains(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(accel, "machine_device", lambda: "cpu")
    monkeypatch.setattr(accel, "cpu_has_native_bf16", lambda: False)
    path = write_profile(tmp_path, "report: false\ngrid:\n  task: synthetic\n  model: tiny\n")
    monkeypatch.setattr(batch, "execute", lambda *a: ("ok", ""))
    monkeypatch.setattr(batch.profile_outputs, "write", lambda *a, **k: None)
    assert batch.main([str(path), "--outputs", str(tmp_path / "out")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("profile p: 1 runs, data checked in ")
    assert first.endswith("s; on cpu, fp32 (auto), one point at a time; CUDA graphs: 0 of 1 "
                          "points (CUDA graphs need a CUDA GPU; this run trains on cpu)")


def test_the_first_line_says_which_points_replay_cuda_graphs_and_why(monkeypatch):
    """On a GPU (pretended), `auto` stays eager where no GPU run verified the combination, an
    explicit `on` replays, and the reasons are grouped with their counts."""
    monkeypatch.setattr(accel, "machine_device", lambda: "cuda")
    points = [{**POINT, "method": "ssa-h"}, {**POINT, "method": "ssa-h", "seed": 1},
              {**POINT, "cuda_graphs": "on"}]
    assert tally.graphs_line(points, 2) == (
        "CUDA graphs: 1 of 3 points (2: no GPU run has verified graphs for ssa-h at grad_accum 1 "
        "on 2 process(es) (kit.models.regional_compile.VERIFIED); 1: cuda_graphs: on was asked)")
