"""The benchmarks' own arithmetic: model FLOPs on real tokens and the matmul peak; bench/gpu.sh's
Python parts end to end on a CPU."""
import json
import sys
from pathlib import Path

import pytest
from transformers import BertConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import common  # noqa: E402


def test_training_flops_by_hand(tmp_path):
    BertConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
               num_attention_heads=2).save_pretrained(tmp_path)
    # per layer and token: 2 x (4 x 8 x 8 + 2 x 8 x 16) = 1024 FLOPs; 3 + 5 real tokens;
    # attention 4 x 8 x (3^2 + 5^2) = 1088 per layer; pooler 2 x 8 x 8 per sequence
    forward = 2 * (1024 * 8 + 1088) + 2 * 2 * 64
    assert common.training_flops(str(tmp_path), [3, 5], epochs=2) == 3 * forward * 2


def test_matmul_peak_is_a_positive_rate():
    peak = common.matmul_peak(size=64, seconds=0.01)
    assert peak["flops_per_s"] > 0 and peak["dtype"] == "float32" and peak["size"] == 64


def test_matmul_peak_in_bf16():
    assert common.matmul_peak(size=64, seconds=0.01, dtype="bfloat16")["dtype"] == "bfloat16"


@pytest.mark.parametrize("native, dtypes", [(True, {"float32", "bfloat16"}), (False, {"float32"})])
def test_peaks_take_bf16_only_where_it_is_native(monkeypatch, native, dtypes):
    """An emulated bf16 peak (AVX2) at 2048 x 2048 took minutes and bounds nothing: skipped."""
    import kit.train.accel
    monkeypatch.setattr(kit.train.accel, "cpu_has_native_bf16", lambda: native)
    got = common.peaks(seconds=0.01, size=64)
    assert set(got) == dtypes and all(v > 0 for v in got.values())


def test_the_hardware_header_names_the_cpu_class_and_bf16():
    hw = common.hardware()
    assert hw["cpu_class"] and hw["bf16"].split()[0] in ("native", "emulated")


def test_around_takes_the_mean_and_drift_of_the_peaks_before_and_after():
    got = common.around({"float32": 100.0, "bfloat16": 200.0}, {"float32": 50.0, "bfloat16": 300.0})
    assert got == {"float32": {"before": 100.0, "after": 50.0, "mean": 75.0, "drift": 0.5},
                   "bfloat16": {"before": 200.0, "after": 300.0, "mean": 250.0, "drift": 1.5}}


def test_contender_names_carry_their_precision():
    import trainer_vs_kit
    assert trainer_vs_kit.split_contender("kit@bf16") == ("kit", "bf16")
    assert trainer_vs_kit.split_contender("trainer-grouped") == ("trainer-grouped", None)


def test_ssa_cost_runs_every_point_once_per_precision_and_compares_them():
    from types import SimpleNamespace

    import ssa_cost
    args = SimpleNamespace(methods="bert,ssa-h", gammas="1.0", precisions="bf16,no")
    assert ssa_cost.run_names(args) == ["bert:bf16", "bert:no", "ssa-h@1.0:bf16", "ssa-h@1.0:no"]
    assert ssa_cost.run_names(SimpleNamespace(**{**vars(args), "precisions": ""})) == [
        "bert", "ssa-h@1.0"]
    rows = [{"run": "ssa-h@1.0:bf16", "train_examples_per_s": 30.0, "probe_forwards_per_s": 90.0,
             "total": 50.0},
            {"run": "ssa-h@1.0:no", "train_examples_per_s": 20.0, "probe_forwards_per_s": 45.0,
             "total": 80.0},
            {"run": "bert", "train_examples_per_s": 20.0, "total": 70.0}]
    assert ssa_cost.precision_ratios(rows) == [
        "- ssa-h@1.0: bf16 / no: train ex/s x1.5, probe fwd/s x2.0, total time x0.625"]


def fake_run(task, method, seed, precision, score, stats=()):
    return {"status": "ok", "profile": "bf16-parity", "task": task, "method": method, "seed": seed,
            "mixed_precision": precision, "best_dev": {"score": score}, "ssa_labels": list(stats),
            "train_examples_per_s": 20.0 if precision == "bf16" else 10.0,
            "wall_s": {"eval": 1.0 if precision == "bf16" else 4.0,
                       "label_generation": 1.0 if precision == "bf16" else 2.0}}


def test_parity_pairs_the_precisions_and_pools_label_stats(tmp_path):
    import json

    import parity
    probe = {"probed": 10, "variants": 8, "flipped": 2, "labelled_tokens": 30, "share_label1": 0.2}
    runs = [fake_run("RTE", "ssa-h", s, p, score, [{"epoch": 0}, probe, {**probe, "flipped": 6,
                                                                         "share_label1": 0.5,
                                                                         "labelled_tokens": 10}])
            for s, p, score in [(0, "bf16", 0.5), (0, "no", 0.6), (1, "bf16", 0.7), (1, "no", 0.6),
                                (2, "bf16", 0.9)]]                 # seed 2 has no fp32 twin
    for i, m in enumerate(runs):
        (tmp_path / "runs" / str(i)).mkdir(parents=True)
        (tmp_path / "runs" / str(i) / "metrics.json").write_text(json.dumps(m))
    points = parity.load_runs(tmp_path, "bf16-parity")
    assert sorted(points) == [("RTE", "ssa-h", 0), ("RTE", "ssa-h", 1)]
    [row] = parity.summarize(points)
    assert row["score_bf16"] == [0.5, 0.7] and row["score_fp32"] == [0.6, 0.6]
    assert row["mean_diff"] == pytest.approx(0.0)
    assert row["flip_rate_bf16"] == [0.5, 0.5]                  # (2 + 6) / 16
    assert row["share_label1_fp32"] == [pytest.approx(0.275)] * 2   # (0.2 * 30 + 0.5 * 10) / 40
    assert row["train_speed_bf16_over_fp32"] == [2.0, 2.0]
    assert row["label_gen_time_bf16_over_fp32"] == [0.5, 0.5]


def test_parity_pairs_any_factor_here_the_dropout_masks(tmp_path):
    import json

    import parity
    for i, (seed, rng, score) in enumerate([(0, "packed", 0.8), (0, "torch", 0.7),
                                            (1, "packed", 0.6), (1, "torch", 0.8),
                                            (2, "torch", 0.9)]):   # seed 2 has no packed twin
        m = {**fake_run("SST-2", "bert", seed, "no", score, []), "profile": "dropout-parity",
             "dropout_rng": rng}
        (tmp_path / "runs" / str(i)).mkdir(parents=True)
        (tmp_path / "runs" / str(i) / "metrics.json").write_text(json.dumps(m))
    points = parity.load_runs(tmp_path, "dropout-parity", "dropout_rng")
    [row] = parity.summarize(points, "dropout_rng")
    assert row["seeds"] == [0, 1]
    assert row["score_packed"] == [0.8, 0.6] and row["score_torch"] == [0.7, 0.8]
    assert row["mean_diff"] == pytest.approx(-0.05)
    assert row["train_speed_packed_over_torch"] == [1.0, 1.0]


def test_profile_wall_times_each_point_from_the_previous_result_line():
    import profile_wall
    lines = [(1.0, "profile p: 2 runs, data checked in 0.0s\n"),
             (1.0, "[1/2] task=RTE method=bert seed=0 model=minilm: started\n"),
             (6.5, "[1/2] task=RTE method=bert seed=0 model=minilm: ok 5s, ETA 0m05s\n"),
             (6.5, "[2/2] task=RTE method=ssa-h seed=0 model=minilm: started\n"),
             (8.0, "[2/2] task=RTE method=ssa-h seed=0 model=minilm: failed (x) 2s\n"),
             (9.0, "profile p: 1 ok, 0 skipped, 1 failed\n")]
    assert profile_wall.point_spans(lines) == {"task=RTE method=bert seed=0 model=minilm": 6.5,
                                               "task=RTE method=ssa-h seed=0 model=minilm": 1.5}


def test_the_gpu_benchmark_runs_end_to_end_on_a_cpu(tmp_path):
    """bench/gpu.sh --cpu-smoke's Python: a kit contender in its own process with the step probe
    (steady rate, warm-up; syncs and kernels are CUDA's: None here), the Trainer's callback path
    in this one, the grid's profile, the projection and both outputs; a contender that fails
    is one row with its error, the rest goes on."""
    import gpu_bench
    import gpu_child
    import gpu_grid
    from kit.config.profiles import load_profile
    got = gpu_bench.main(["--cpu-smoke", "--contenders", "kit,no-such", "--rounds", "1",
                          "--grid-k", "", "--out", str(tmp_path)])
    kit, bad = got["contenders"]
    assert kit["steady_examples_per_s"] > 0 and kit["warmup_s"] is not None, kit
    assert kit["syncs_per_train_step"] is None and kit["cpu_ops_per_step"] > 0
    assert kit["useful_tflops"] > 0 and "exit 1" in bad["error"]
    assert json.loads((tmp_path / "results.json").read_text())["contenders"][0]["contender"] == "kit"
    assert "| kit | 0 |" in (tmp_path / "results.md").read_text()
    trainer = gpu_child.run("trainer-grouped", {**got["settings"], "rows": 48})
    assert trainer["steady_steps_per_s"] > 0 and trainer["syncs_per_eval_batch"] is None
    profile = load_profile(str(gpu_grid.grid_profile(tmp_path, got["settings"]["model"], 32, 2,
                                                     64)))
    assert len(profile.points) == 4 and not profile.report
    grids = [{"k": 1, "wall_s": 20.0, "points_ok": 4, "train_examples_per_s": 10.0,
              "speedup_vs_k1": 1.0}, {"k": 2, "wall_s": 12.5, "speedup_vs_k1": 1.6}]
    projected = gpu_bench.projection(got["settings"], got["contenders"], grids,
                                     got["useful_flops_per_example"])
    assert projected["label"] == "PROJECTION, not a measurement" and projected["points"] == 180
    assert projected["hours_at_best_k"] == pytest.approx(projected["serial_hours"] / 1.6, abs=0.01)
    assert projected["mean_tokens"]["QQP"]["source"] == "assumed"


def _check(method, check, **values):
    base = {"parity": {"graphs_recorded": "on", "max_rel_diff": 0.001},
            "grad_accum": {"graphs_recorded": "on", "max_rel_diff": 0.001},
            "dropout": {"graphs_recorded": "on", "graph_breaks": 0,
                        "eager_dev": {"score": 0.80}, "graphed_dev": {"score": 0.81}},
            "resume": {"stopped": True, "resumed_inside_epoch": {"epoch": 1, "position": 8},
                       "straight_dev": {"score": 0.81}, "resumed_dev": {"score": 0.81}}}
    return {"method": method, "check": check, **base[check], **values}


def test_graphs_verify_proposes_a_row_only_for_a_method_that_passed_every_check_on_a_gpu():
    """bench/graphs_verify.py's verdicts: 872 dev rows give a noise of 2 x 0.024 = 0.048; bf16
    losses within 2%. ssa-h's dropout gap (0.06) is beyond noise: no row; bert's grad_accum 2
    passed: its row too; bert-mask's resume did not run: no row; on a CPU, none at all."""
    import graphs_verify
    checks = [_check("bert", c) for c in ("parity", "grad_accum", "dropout", "resume")]
    checks += [_check("ssa-h", "parity"), _check("ssa-h", "resume"),
               _check("ssa-h", "dropout", graphed_dev={"score": 0.86}),
               _check("bert-mask", "parity", max_rel_diff=0.019),
               _check("bert-mask", "dropout"),
               {"method": "bert-mask", "check": "resume", "skipped": "over the budget"}]
    got = graphs_verify.verdicts(checks, "cuda", rows=872)
    assert got["noise"] == pytest.approx(0.0479, abs=1e-4)
    assert got["verified_rows"] == [("bert", 1, 1), ("bert", 2, 1)]
    assert got["methods"]["ssa-h"]["dropout"] == ("failed: dev score differs by 0.060 (noise "
                                                  "0.048), 0 graph break(s)")
    assert got["methods"]["bert-mask"] == {"parity": "passed", "dropout": "passed",
                                           "resume": "not run: over the budget"}
    failed = graphs_verify.verdicts([_check("bert", "parity", max_rel_diff=0.03)], "cuda",
                                    rows=872)
    assert failed["methods"]["bert"]["parity"] == ("failed: losses or gradient norms differ by "
                                                   "0.03 (relative; tolerance 0.02), graphs on")
    exact = [_check("bert", c, **({"max_rel_diff": 0.0} if c in ("parity", "grad_accum")
                                  else {})) for c in ("parity", "grad_accum", "dropout", "resume")]
    on_cpu = graphs_verify.verdicts(exact, "cpu", rows=872)
    assert set(on_cpu["methods"]["bert"].values()) == {"passed"}
    assert on_cpu["verified_rows"] == []
