"""A training step that never reads the device back, an evaluation pass that reads it once, the
attention mask in a form transformers does not inspect, merged parameter groups, static shapes
(`length_buckets`) and the loss window across a resume.

A host read (`.item()`, `.tolist()`, `.cpu()`, `bool(t)`, a boolean index ...) on a GPU waits for
every kernel queued before it; on this CPU machine it costs nothing, so the tests count the reads
themselves (tests/host_reads.py: a TorchFunctionMode that records the reading calls).
"""
import json

import numpy as np
import pytest
import torch
from host_reads import HostReads, summary

from kit.config.run_config import RunConfig
from kit.train.accel import machine_device
from kit.train.finetune import fit
from tests.test_distributed import TWO_RANKS

pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py

# 200 synthetic rows: 7 steps an epoch (the last of 8 rows), a history row every 4 steps
TINY = dict(task="synthetic", model="tiny", synthetic_size=200, epochs=2, lr=5e-3, log_every=4,
            batch_size=32, eval_batch_size=16, save_checkpoints=False)

def reads_of_a_run(monkeypatch, **config) -> tuple[HostReads, list[bool]]:
    """fit() of a tiny run under HostReads, marked at each training step ("step"), each batch of
    an inference pass ("batch") and the end of each pass ("end"); with each step, whether it
    ends a logging window."""
    import kit.train.loop as loop
    import kit.train.step as kstep
    counter, steps = HostReads(), []
    cfg = RunConfig(**{**TINY, **config})
    real_step, real_pass, real_collate = loop.train_step, loop.predict_logits, kstep.collate

    def step(*args, **kwargs):
        counter.mark("step")
        steps.append(len(steps) + 1)                     # the loop's progress.step after it
        return real_step(*args, **kwargs)

    def predict(*args, **kwargs):
        try:
            return real_pass(*args, **kwargs)
        finally:
            counter.mark("end")

    def collate(*args, **kwargs):
        counter.mark("batch")
        return real_collate(*args, **kwargs)

    def refuse(*args, **kwargs):        # a checkpoint's one read: are the weights finite
        counter.mark("checkpoint")
        real_refuse(*args, **kwargs)
        counter.mark("after checkpoint")

    real_refuse = loop.refuse_non_finite
    monkeypatch.setattr(loop, "refuse_non_finite", refuse)
    monkeypatch.setattr(loop, "train_step", step)
    monkeypatch.setattr(loop, "predict_logits", predict)
    monkeypatch.setattr(kstep, "collate", collate)
    with counter:
        metrics = fit(cfg)
    assert metrics["status"] == "ok"
    per_epoch = len(steps) // cfg.epochs               # a row at every log_every and epoch end
    return counter, [n % cfg.log_every == 0 or n % per_epoch == 0 for n in steps]


# --------------------------------------------------------------------------- host reads

@pytest.mark.parametrize("method, guide", [("bert", "task"), ("ssa-h", "task"),
                                           ("bert", "task+both")])
def test_no_read_in_a_step_one_per_window_one_per_pass(method, guide, tmp_path, monkeypatch):
    """Today's code (before this change) read 1 per step (transformers' mask check; SSA-H's
    loss up to 4), 4 per logging window and 3 per evaluation batch."""
    counter, window_end = reads_of_a_run(monkeypatch, method=method, guide_loss=guide,
                                         outputs_dir=str(tmp_path))
    seen = summary(counter, window_end)
    assert len(seen["step"]) == 9 and set(seen["step"]) == {0}     # 2 epochs x 7 steps
    assert len(seen["window"]) == 5 and set(seen["window"]) == {1}
    assert seen["batch"] and set(seen["batch"]) == {0}             # every batch of a pass ...
    assert seen["last batch"] and set(seen["last batch"]) == {1}   # ... but its one copy
    reads = [r for label, rs in counter.segments() if label == "step" for r in rs]
    assert set(reads) == {"tolist"}
    checkpoints = [rs for label, rs in counter.segments() if label == "checkpoint"]
    assert checkpoints == [["tolist"]] * 2                          # one read per epoch's end


def test_ssa_loss_needs_no_selection_and_equals_it_bit_for_bit():
    from kit.methods.ssa_heads import ssa_loss
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randn(4, 9, 2, generator=gen)
        labels = torch.randint(0, 2, (4, 9), generator=gen)
        labels[torch.rand(4, 9, generator=gen) < 0.5] = -100
        kept = labels != -100
        with HostReads() as counter:
            got = ssa_loss(logits, labels)
        assert counter.events == []
        assert torch.equal(got, torch.nn.functional.cross_entropy(logits[kept], labels[kept]))
    none = torch.randn(2, 3, 2, requires_grad=True)
    loss = ssa_loss(none, torch.full((2, 3), -100))
    loss.backward()
    assert loss.item() == 0.0 and none.grad.abs().sum().item() == 0.0


# --------------------------------------------------------------------------- attention mask

@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_4d_mask_skips_the_check_and_changes_no_output(attention):
    from kit.models.attention_mask import encoder_mask
    from kit.models.backbones import load_backbone
    backbone, _ = load_backbone("tiny", eager_attention=attention == "eager")
    backbone.eval()
    assert backbone.config._attn_implementation == attention
    ids = torch.randint(5, 100, (3, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    with torch.no_grad():
        with HostReads() as counter:
            ours = backbone(input_ids=ids, attention_mask=encoder_mask(backbone, mask))
        assert counter.events == []
        with HostReads() as counter:
            theirs = backbone(input_ids=ids, attention_mask=mask)
        assert ("read", "__bool__") in counter.events     # transformers' padding_mask.all()
    assert torch.equal(ours.last_hidden_state, theirs.last_hidden_state)


def test_families_that_read_the_mask_otherwise_get_it_as_it_was():
    from types import SimpleNamespace

    from kit.models.attention_mask import encoder_mask, takes_4d_mask
    mask = torch.ones(2, 5, dtype=torch.int64)

    def backbone(model_type, attention="sdpa"):
        config = SimpleNamespace(model_type=model_type, is_decoder=False,
                                 _attn_implementation=attention)
        return SimpleNamespace(config=config)
    for family in ("bert", "roberta", "xlm-roberta", "electra", "distilbert"):
        assert takes_4d_mask(backbone(family))
    for odd in (backbone("deberta-v2"), backbone("modernbert"),
                backbone("bert", "flash_attention_2")):
        assert encoder_mask(odd, mask) is mask


# --------------------------------------------------------------------------- parameter groups

def test_merged_groups_make_bit_identical_updates():
    """With layer_decay 1 the per-depth groups (embeddings, each layer, top; decay or not) share
    two settings: merged, fused AdamW launches per 2 groups, and every weight moves exactly as
    before, through the lr schedule's warm-up and decay."""
    from kit.methods.bert import HeadSpec, SequenceModel
    from kit.models.backbones import load_backbone
    from kit.train.optim import LinearSchedule, merged_groups, parameter_groups

    def trained(merge: bool, layer_decay: float) -> tuple[list[torch.Tensor], int]:
        torch.manual_seed(0)
        model = SequenceModel(load_backbone("tiny")[0], HeadSpec(num_labels=2, method="ssa-h"))
        groups = parameter_groups(model, 1e-3, 0.01, layer_decay)
        optimizer = torch.optim.AdamW(merged_groups(groups) if merge else groups, lr=1e-3,
                                      fused=True)
        schedule = LinearSchedule(optimizer, 0.25)
        gen = torch.Generator().manual_seed(1)
        for step in range(6):
            schedule.set_progress(step / 6)
            ids = torch.randint(5, 100, (4, 8), generator=gen)
            out = model(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))
            (out["logits"].square().mean() + out["token_logits"].square().mean()).backward()
            optimizer.step()
            optimizer.zero_grad()
        return [p.detach().clone() for p in model.parameters()], len(optimizer.param_groups)

    per_layer, n_per_layer = trained(False, 1.0)
    merged, n_merged = trained(True, 1.0)
    assert (n_per_layer, n_merged) == (8, 2)      # tiny: embeddings, 2 layers, top; x decay
    assert all(torch.equal(a, b) for a, b in zip(per_layer, merged))
    assert trained(True, 0.9)[1] == 8             # layer decay: every depth its own lr


# --------------------------------------------------------------------------- the loss window

def test_a_resumed_window_is_on_the_device_of_the_steps_it_joins():
    """A mid-epoch checkpoint keeps the window's losses as floats; resumed, they join the next
    steps' device tensors. They were host tensors before, which torch.stack refuses beside CUDA
    ones; the meta device stands in for a GPU here."""
    from kit.train.window import LossWindow
    window = LossWindow(torch.device("meta"))
    window.restore([[0.5, 0.25], [0.75, 0.5]], [0, 0])
    window.add({"loss": torch.empty((), device="meta"),
                "loss_target": torch.empty((), device="meta")}, 0)
    assert {row.device.type for row in window.rows} == {"meta"}
    assert torch.stack(window.rows).shape == (3, 2)


def test_the_window_names_the_step_that_went_non_finite():
    from kit.train.window import LossWindow, NonFiniteLoss, check_finite

    class One:
        num_processes = 1
    window = LossWindow(torch.device("cpu"))
    for loss in (0.5, float("inf"), 0.25):
        window.add({"loss": torch.tensor(loss), "loss_ssa": torch.tensor(0.125)}, 0)
    with HostReads() as counter:
        means, rows, tasks = window.read(One())
    assert [name for _, name in counter.events] == ["tolist"]
    assert rows == [[0.5, 0.125], [float("inf"), 0.125], [0.25, 0.125]] and tasks == [0, 0, 0]
    with pytest.raises(NonFiniteLoss, match="^non-finite loss at epoch 2 step 12: "
                                            "loss=inf, loss_ssa=0.125$"):
        check_finite(rows, ["loss", "loss_ssa"], 2, 13)


# --------------------------------------------------------------------------- static shapes

def shapes_and_metrics(monkeypatch, tmp_path, no_dropout=False, **config) -> tuple[dict, dict]:
    """fit() of a tiny run, with the [rows, length] shapes its model met, training and not."""
    import kit.methods.bert as models
    import kit.train.finetune as finetune
    seen = {True: set(), False: set()}
    forward, build = models.SequenceModel.forward, finetune.SingleTask.__init__

    def spy(self, input_ids, *args, **kwargs):
        seen[torch.is_grad_enabled()].add(tuple(input_ids.shape))
        return forward(self, input_ids, *args, **kwargs)

    def without_dropout(self, cfg):
        build(self, cfg)
        for module in self.model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0

    with monkeypatch.context() as patch:
        patch.setattr(models.SequenceModel, "forward", spy)
        if no_dropout:
            patch.setattr(finetune.SingleTask, "__init__", without_dropout)
        metrics = fit(RunConfig(**{**TINY, **config}, outputs_dir=str(tmp_path)))
    assert metrics["status"] == "ok"
    return seen, metrics


def test_buckets_make_an_epoch_meet_a_few_shapes(glue_dir, tmp_path, monkeypatch):
    from kit.data.pipeline import StaticShape
    buckets = StaticShape(64).buckets()
    assert buckets == [16, 32, 48, 64]
    sst2 = dict(task="SST-2", glue_dir=str(glue_dir), max_train_examples=300, max_length=64,
                epochs=1)
    off, metrics = shapes_and_metrics(monkeypatch, tmp_path / "off", **sst2)
    on, bucketed = shapes_and_metrics(monkeypatch, tmp_path / "on", length_buckets="on", **sst2)
    # today: 10 training shapes in 10 steps (the last 12 rows), 38 in the dev set's 55 batches
    assert len(off[True]) == 10 and (12, 4) in off[True] and len(off[False]) == 38
    assert on[True] == {(32, 16), (32, 32), (32, 64)}             # every batch 32 rows
    assert on[False] == {(16, length) for length in buckets}
    assert (metrics["length_buckets"], bucketed["length_buckets"]) == ("off", "on")
    assert bucketed["train_examples"] == metrics["train_examples"] == 300   # real rows only


@pytest.mark.parametrize("changes", [dict(method="ssa-h", guide_loss="task+both"),
                                     dict(task="STS-B", max_train_examples=90, epochs=1,
                                          max_length=32)])
def test_padded_batches_give_the_losses_and_metrics_of_unpadded_ones(changes, glue_dir, tmp_path,
                                                                     monkeypatch):
    """Padding rows weigh 0 in every loss term (target, SSA, attention guiding; regression too:
    STS-B's 90 rows at batch 32 end on a batch of 26 and 6 rows of weight 0) and padding
    positions are masked: without dropout, whose masks would differ with the shapes, the runs
    agree to float rounding. In fp32: bf16 autocast rounds each matmul's inputs to 8 mantissa
    bits, so two shapes' sums part by ~5e-5 relative there (the other-class lane saw it), which
    says nothing about the padding. The dev predictions are compared themselves: a correlation
    of a barely trained model's near-constant predictions magnifies their rounding."""
    from kit.runs import read_dev_predictions, run_dir_of
    changes = {**changes, "mixed_precision": "no"}
    _, plain = shapes_and_metrics(monkeypatch, tmp_path / "off", no_dropout=True, **changes)
    seen, padded = shapes_and_metrics(monkeypatch, tmp_path / "on", no_dropout=True,
                                      length_buckets="on", **changes)
    assert len({rows for rows, _ in seen[True]}) == 1
    if changes.get("task") == "STS-B":           # the last batch: 26 rows, 6 of weight 0
        assert {rows for rows, _ in seen[True]} == {32} and padded["train_examples"] == 90
    history = lambda m: [e["train_loss"] for e in m["epochs"]]     # noqa: E731
    np.testing.assert_allclose(history(padded), history(plain), rtol=1e-5)
    a, b = (read_dev_predictions(run_dir_of(RunConfig(**{**TINY, **changes, **extra},
                                                      outputs_dir=str(tmp_path / where))))
            for where, extra in (("on", {"length_buckets": "on"}), ("off", {})))
    if changes.get("task") == "STS-B":
        np.testing.assert_allclose(a["prediction"].astype(float), b["prediction"].astype(float),
                                   rtol=1e-4, atol=1e-5)
    else:
        assert a["prediction"].tolist() == b["prediction"].tolist()
    for x, y in zip(padded["epochs"], plain["epochs"]):
        assert x["dev"].keys() == y["dev"].keys()
        np.testing.assert_allclose([x["dev"][k] for k in x["dev"]],
                                   [y["dev"][k] for k in y["dev"]], rtol=1e-4, atol=1e-4)


@TWO_RANKS
def test_static_shapes_on_two_processes_give_the_one_process_predictions(tmp_path):
    """length_buckets on 2 processes (gloo, torchrun): each rank pads its slice of a batch to
    the bucket and to half the rows; evaluation gathers both slices and drops their padding
    rows. With a learning rate too small to move the weights, the dev predictions and metrics
    are the 1-process run's exactly, the counts too (89 rows: a short last batch of 9, sliced
    5 and 4). In the other-class lane (test_distributed.py is not); fp32, so that the two
    shapes' sums agree under either class."""
    from kit.runs import read_dev_predictions, run_dir_of
    from tests.test_distributed import torchrun
    cfg = RunConfig(task="synthetic", model="tiny", synthetic_size=89, epochs=1, lr=1e-12,
                    batch_size=16, eval_batch_size=16, length_buckets="on", report_to=("none",),
                    mixed_precision="no", save_checkpoints=False, outputs_dir=str(tmp_path / "two"))
    two = torchrun(cfg, tmp_path)
    one = fit(RunConfig(**{**cfg.to_dict(), "outputs_dir": str(tmp_path / "one")}))
    assert (two["processes"], one["processes"]) == (2, 1)
    assert two["length_buckets"] == one["length_buckets"] == "on"
    assert two["train_examples"] == one["train_examples"] == 89
    assert two["epochs"][0]["dev"] == one["epochs"][0]["dev"]
    preds = [read_dev_predictions(run_dir_of(RunConfig(**{**cfg.to_dict(), "outputs_dir": d})))
             for d in (str(tmp_path / "two"), str(tmp_path / "one"))]
    assert preds[0].equals(preds[1]) and len(preds[0]) > 0


def test_a_static_shape_pads_lengths_to_a_bucket_and_rows_with_weight_0():
    from kit.data.pipeline import IGNORE, Examples, StaticShape
    from kit.data.tensors import collate
    rows = [np.arange(1, n + 1) for n in (3, 17, 5)]
    ex = Examples(rows, None, [np.zeros(len(r), bool) for r in rows], np.array([1, 0, 1]),
                  ssa_labels=[np.ones(len(r), np.int64) for r in rows])
    batch = collate(ex, [2, 0], 0, StaticShape(max_length=40, rows=4))
    assert batch["input_ids"].shape == (4, 16)                      # 5 tokens: bucket 16
    assert batch["weight"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert batch["input_ids"][2].tolist() == batch["input_ids"][0].tolist()   # copies of row 2
    assert batch["labels"].tolist() == [1, 1, 1, 1] and batch["rows"].tolist() == [2, 0]
    assert batch["ssa_labels"][:, 0].tolist() == [1, 1, IGNORE, IGNORE]   # no labels on copies
    assert batch["ssa_labels"][0].tolist() == [1] * 5 + [IGNORE] * 11
    assert collate(ex, [1], 0, StaticShape(max_length=40, rows=1))["input_ids"].shape == (1, 32)
    assert StaticShape(max_length=40).buckets() == [16, 32, 40]


def test_a_bucketed_run_killed_inside_a_window_resumes_to_the_uninterrupted_run(
        tmp_path, monkeypatch, comparable):
    """A checkpoint every 3 steps, a history row every 4: the run is killed at step 11, after
    the checkpoint of step 9 kept one step of an unread window; resumed, that step's losses
    join the window on the device and every row, metric and weight equals the straight run's."""
    from kit.runs import checkpoint_dir, run_dir_of
    from kit.train.window import LossWindow
    from tests.test_faults import Killed, dies_at_step
    settings = dict(TINY, method="ssa-h", length_buckets="on", checkpoint_steps=3)
    straight = fit(RunConfig(**settings, outputs_dir=str(tmp_path / "straight")))
    cfg = RunConfig(**settings, outputs_dir=str(tmp_path / "killed"))
    with monkeypatch.context() as patch:
        dies_at_step(patch, 11)
        with pytest.raises(Killed):
            fit(cfg)
    last = checkpoint_dir(run_dir_of(cfg)) / "last"
    state = json.loads((last / "progress.json").read_text())
    assert state["step"] == 9 and len(state["window"]) == 1     # step 9: after the row of 8
    restored, restore = [], LossWindow.restore

    def spy(self, rows, tasks):
        restore(self, rows, tasks)
        restored.append({row.device.type for row in self.rows})
    monkeypatch.setattr(LossWindow, "restore", spy)
    resumed = fit(cfg)
    assert restored == [{machine_device()}]                   # the run's device, GPU or CPU
    assert comparable(resumed) == comparable(straight)

    def history(outputs: str) -> list[list[str]]:                 # without wall_s
        text = (run_dir_of(RunConfig(**settings, outputs_dir=outputs)) / "history.csv").read_text()
        return [row[:2] + row[3:] for row in (line.split(",") for line in text.splitlines())]
    assert history(str(tmp_path / "killed")) == history(str(tmp_path / "straight"))
