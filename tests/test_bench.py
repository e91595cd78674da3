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
