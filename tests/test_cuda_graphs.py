"""`cuda_graphs: on` (kit.models.regional_compile.capture_graphs): the encoder compiled whole
with mode reduce-overhead, one CUDA graph per length bucket on a GPU. On this CPU the same
capture is traced for real (dynamo and AOTAutograd, forward and backward, training and
evaluation) with the aot_eager backend - inductor's code generation would add tens of seconds;
what the graphs gain on a GPU is measured by bench/gpu.sh (docs/benchmarks.md). The promises
checked here: no graph break, one compilation per mode whatever the buckets, the eager run's
losses and metrics, and the parameters and checkpoints of an uncompiled model; and with dropout
on, the compiled step trains (no graph break, one compilation per mode, a falling loss) and
evaluates as the uncompiled model. What `cuda_graphs` resolves to and records:
test_graph_resolution.py."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import kit.models.regional_compile as regional
from kit.config.run_config import ConfigError, RunConfig
from kit.runs import read_config, run_dir_of
from kit.train.finetune import fit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import graphs_verify  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py

# 200 synthetic rows, batches of 32: 7 steps an epoch, 2 epochs, an evaluation after each.
TINY = dict(task="synthetic", model="tiny", synthetic_size=200, epochs=2, lr=5e-3, log_every=4,
            batch_size=32, eval_batch_size=16, max_length=48, mixed_precision="no",
            save_checkpoints=False)


@pytest.fixture
def no_dropout():
    """Dropout's p set to 0 in every model fit() builds: the eager and compiled runs then draw
    no random numbers and must agree to float rounding (bench/graphs_verify.py's parity, which
    a GPU runs, does the same)."""
    with graphs_verify.without_dropout():
        yield


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
    recorded = [read_config(run_dir_of(RunConfig(**TINY, **changes,
                                                  outputs_dir=str(tmp_path / where))))["resolved"]
                for where, changes in (("eager", {"length_buckets": "on"}),
                                       ("graphs", {"cuda_graphs": "on"}))]
    assert recorded == [{"cuda_graphs": "off", "length_buckets": "on", "cuda_graphs_reason":
                         "CUDA graphs need a CUDA GPU; this run trains on cpu"},
                        {"cuda_graphs": "on", "length_buckets": "on",
                         "cuda_graphs_reason": "cuda_graphs: on was asked"}]
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


def step_batch(job, rows) -> dict:
    """A training batch of `rows` as the loop collates it under graphs: padded to its length
    bucket and to 8 rows (kit.data.pipeline.StaticShape), the keys the job reads. Not 16 rows:
    a first batch of 16 x 16 makes dynamo guard on rows == length (duck sizing) and compile
    once more when they differ."""
    from kit.data.pipeline import StaticShape
    from kit.data.tensors import collate
    batch = collate(job.train, rows, job.pad_id, StaticShape(job.cfg.max_length, 8))
    return {k: v for k, v in batch.items() if k in (*job.inputs, "weight")}


def logits(model, batch: dict) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 special_mask=batch.get("special_mask"))["logits"]


def test_the_captured_step_trains_with_dropout_on(tmp_path, monkeypatch):
    """The step as `cuda_graphs: on` compiles it, dropout ON (the tiny BERT's p = 0.1) and SSA-H's
    heads: no graph break, one compilation for training and one for evaluation over two length
    buckets, dropout drawn afresh at each call, the loss finite and falling on the batches it
    trains on, and evaluation (dropout off) equal to the uncompiled model's. aot_eager, not
    inductor: inductor's CPU code generation took ~200 s for this model here (measured), so
    this checks the capture (dynamo, AOTAutograd, the graphs' inputs and outputs), not
    inductor's kernels or its philox random numbers, which a GPU run must compare."""
    import copy
    from kit.train.finetune import SingleTask
    monkeypatch.setattr(regional, "GRAPH_BACKEND", "aot_eager")
    torch.manual_seed(0)
    job = SingleTask(RunConfig(**{**TINY, "synthetic_size": 64}, synthetic_distractors=12,
                               method="ssa-h", outputs_dir=str(tmp_path)))   # lengths 12-19
    model = job.model
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    regional.capture_graphs(model)
    order = np.argsort(job.train.lengths, kind="stable")
    batches = [step_batch(job, list(order[:8])), step_batch(job, list(order[-8:]))]
    assert [b["input_ids"].shape[1] for b in batches] == [16, 32]        # two buckets
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    losses = []
    for i in range(8):
        loss = job.loss_terms(model, batches[i % 2], 0)["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert np.isfinite(losses).all() and max(losses[-2:]) < min(losses[:2])
    # dropout draws new numbers at every call (a graph's random numbers are its inputs)
    assert not torch.equal(*(job.loss_terms(model, batches[0], 0)["loss"] for _ in "ab"))
    eager.load_state_dict(model.state_dict())
    model.eval()
    eager.eval()
    with torch.no_grad():
        for batch in batches:
            torch.testing.assert_close(logits(model, batch), logits(eager, batch))
    assert not counters["graph_break"]
    # training and evaluation: one compilation each, with dynamic shapes, whatever the buckets
    assert counters["stats"]["unique_graphs"] == 2
