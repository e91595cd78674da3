"""The benchmarks' own arithmetic: model FLOPs on real tokens and the matmul peak."""
import sys
from pathlib import Path

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


def test_matmul_peak_in_bf16_and_both_peaks():
    assert common.matmul_peak(size=64, seconds=0.01, dtype="bfloat16")["dtype"] == "bfloat16"
    assert set(common.peaks(seconds=0.01)) == {"float32", "bfloat16"}


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
