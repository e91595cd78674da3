"""`cuda_graphs: on` (kit.models.regional_compile.capture_graphs): the encoder compiled whole
with mode reduce-overhead, one CUDA graph per length bucket on a GPU. On this CPU the same
capture is traced for real (dynamo and AOTAutograd, forward and backward, training and
evaluation) with the aot_eager backend - inductor's code generation would add tens of seconds;
what the graphs gain on a GPU is measured by bench/gpu.sh (docs/benchmarks.md). The promises
checked here: no graph break, one compilation per mode whatever the buckets, the eager run's
losses and metrics, and the parameters and checkpoints of an uncompiled model."""
import numpy as np
import pytest
import torch

import kit.models.regional_compile as regional
from kit.config.run_config import ConfigError, RunConfig
from kit.train.finetune import fit

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py

# 200 synthetic rows, batches of 32: 7 steps an epoch, 2 epochs, an evaluation after each.
TINY = dict(task="synthetic", model="tiny", synthetic_size=200, epochs=2, lr=5e-3, log_every=4,
            batch_size=32, eval_batch_size=16, max_length=48, mixed_precision="no",
            save_checkpoints=False)


@pytest.fixture
def no_dropout(monkeypatch):
    """Dropout's p set to 0 in every model fit() builds: the eager and compiled runs then draw
    no random numbers and must agree to float rounding."""
    import kit.train.finetune as finetune
    build = finetune.SingleTask.__init__

    def without_dropout(self, cfg):
        build(self, cfg)
        for module in self.model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    monkeypatch.setattr(finetune.SingleTask, "__init__", without_dropout)


@pytest.mark.parametrize("changes, says", [
    (dict(length_buckets="off"), "parameter 'cuda_graphs': on replays one graph per length "
                                 "bucket; it needs length_buckets auto or on, not off"),
    (dict(compile=True), "parameter 'cuda_graphs': on compiles the whole encoder; leave compile "
                         "false (the layer-wise compilation) with it"),
])
def test_graphs_refuse_what_contradicts_them_in_one_line(changes, says):
    with pytest.raises(ConfigError) as err:
        RunConfig(cuda_graphs="on", **changes)
    assert str(err.value) == says


def test_the_captured_encoder_trains_as_eager_with_no_graph_break(tmp_path, monkeypatch,
                                                                  no_dropout):
    monkeypatch.setattr(regional, "GRAPH_BACKEND", "aot_eager")
    eager = fit(RunConfig(**TINY, length_buckets="on", outputs_dir=str(tmp_path / "eager")))
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    graphs = fit(RunConfig(**TINY, cuda_graphs="on", outputs_dir=str(tmp_path / "graphs")))
    assert (eager["cuda_graphs"], graphs["cuda_graphs"]) == ("off", "on")
    assert graphs["length_buckets"] == "on"                       # graphs imply static shapes
    assert not counters["graph_break"]
    # training and evaluation (the encoder in train and eval mode): one compilation each, with
    # dynamic shapes, however many buckets the epochs meet (3 in training, 3 in evaluation)
    assert counters["stats"]["unique_graphs"] == 2
    loss = lambda m: [e["train_loss"] for e in m["epochs"]]      # noqa: E731
    np.testing.assert_allclose(loss(graphs), loss(eager), rtol=1e-5)
    for a, b in zip(graphs["epochs"], eager["epochs"]):
        np.testing.assert_allclose([a["dev"][k] for k in sorted(a["dev"])],
                                   [b["dev"][k] for k in sorted(b["dev"])], rtol=1e-4, atol=1e-5)


def test_capture_keeps_the_parameters_and_state_dict_names(monkeypatch):
    from transformers import BertConfig, BertModel
    monkeypatch.setattr(regional, "GRAPH_BACKEND", "aot_eager")
    model = torch.nn.Module()
    model.backbone = BertModel(BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=16))
    names, params = list(model.state_dict()), [id(p) for p in model.parameters()]
    assert regional.capture_graphs(model) is model.backbone
    assert list(model.state_dict()) == names
    assert [id(p) for p in model.parameters()] == params


@pytest.mark.parametrize("requested, device, steps, eligible, want", [
    ("on", "cpu", 0, False, True), ("off", "cuda", 10**6, True, False),
    ("auto", "cuda", 4200, True, True), ("auto", "cuda", 4199, True, False),
    ("auto", "cuda", 10**6, False, False), ("auto", "cpu", 10**6, True, False),
    ("auto", "mps", 10**6, True, False)])
def test_auto_takes_graphs_where_a_gpu_measured_them_faster(requested, device, steps, eligible,
                                                           want):
    from kit.models.regional_compile import resolve_cuda_graphs
    assert resolve_cuda_graphs(requested, device, steps, eligible) is want
