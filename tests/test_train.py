"""fit(): learning, determinism, dropout discipline, the output contract, failure records, and a
real-data smoke per method (embedded model, real RTE rows) and of regression (real STS-B rows)."""
import json

import numpy as np
import pytest
import torch

from kit.config.run_config import RunConfig
from kit.train.window import NonFiniteLoss
from kit.train.finetune import fit
from kit.runs import run_dir_of

TINY = dict(task="synthetic", model="tiny", synthetic_size=400, epochs=2, lr=5e-3,
            save_checkpoints=False)


def test_tiny_model_learns_the_synthetic_task(tmp_path):
    m = fit(RunConfig(**{**TINY, "synthetic_size": 1000, "epochs": 5}, outputs_dir=str(tmp_path)))
    assert m["status"] == "ok"
    assert m["best_dev"]["accuracy"] > 0.75          # chance is 0.5


def test_same_seed_same_metrics_and_skip_finished(tmp_path):
    cfg = RunConfig(**TINY, method="ssa-h", outputs_dir=str(tmp_path / "a"))
    first = fit(cfg)
    second = fit(RunConfig(**TINY, method="ssa-h", outputs_dir=str(tmp_path / "b")))
    assert first["epochs"] == [{**e, "wall_s": f["wall_s"]} for e, f in zip(second["epochs"], first["epochs"])]
    assert first["ssa_labels"][0]["flipped"] == second["ssa_labels"][0]["flipped"]
    before = (run_dir_of(cfg) / "metrics.json").read_text()
    assert fit(cfg) == first                          # finished: not rerun, not overwritten
    assert (run_dir_of(cfg) / "metrics.json").read_text() == before


def test_dropout_on_while_training_off_while_evaluating_every_epoch(tmp_path, monkeypatch):
    """Record the mode of the backbone whenever it runs with gradients (training) or without
    (probing, evaluation)."""
    import kit.methods.bert as models
    seen = []
    original = models.SequenceModel.forward

    def spy(self, *args, **kwargs):
        seen.append((torch.is_grad_enabled(), self.training, self.backbone.training))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(models.SequenceModel, "forward", spy)
    fit(RunConfig(**{**TINY, "epochs": 3}, method="ssa-co", outputs_dir=str(tmp_path)))
    training = [s for s in seen if s[0]]
    inference = [s for s in seen if not s[0]]
    assert training and all(s[1] and s[2] for s in training)
    assert inference and not any(s[1] or s[2] for s in inference)
    # probing and evaluation happen between epochs, and training resumes with dropout on
    modes = [s[0] for s in seen]
    assert modes.index(False) < len(modes) - 1 - modes[::-1].index(True)


def test_output_contract(tmp_path):
    cfg = RunConfig(**{**TINY, "save_checkpoints": True}, method="ssa-h", outputs_dir=str(tmp_path))
    m = fit(cfg)
    run = run_dir_of(cfg)
    assert RunConfig.from_dict(json.loads((run / "config.json").read_text())) == cfg
    on_disk = json.loads((run / "metrics.json").read_text())
    for key in ("run_id", "task", "model", "method", "seed", "status", "epochs", "best_epoch",
                "best_dev", "best_three_subset", "wall_s", "train_examples_per_s",
                "peak_memory_mb", "ssa_labels"):
        assert key in on_disk, key
    assert on_disk["run_id"] == cfg.run_id == m["run_id"]
    assert set(on_disk["wall_s"]) >= {"train", "label_generation", "eval", "total"}
    history = (run / "history.csv").read_text().splitlines()
    assert history[0].startswith("step,epoch,wall_s,loss") and len(history) > 2
    assert "loss_ssa" in history[0]
    best = run / "checkpoint" / "best"            # plain-transformers layout + the kit's heads
    assert (best / "config.json").exists() and (best / "heads.safetensors").exists()
    last = sorted(p.name for p in (run / "checkpoint" / "last").iterdir())   # accelerate's state
    assert last == ["model.safetensors", "optimizer.bin", "progress.json",   # + the loop's (JSON)
                    "random_states_0.pkl"]                 # read back with weights_only=True
    dev = (run / "predictions" / "dev.tsv").read_text().splitlines()
    assert dev[0] == "index\tprediction\tlabel" and len(dev) == 1 + 100
    assert not list(run.rglob("*.tmp*"))


def test_non_finite_loss_stops_with_a_failure_record(tmp_path, monkeypatch):
    import kit.train.finetune as train
    monkeypatch.setattr(train, "target_loss", lambda *a: torch.tensor(float("nan"), requires_grad=True))
    cfg = RunConfig(**TINY, outputs_dir=str(tmp_path))
    with pytest.raises(NonFiniteLoss, match="epoch 0 step 1:"):
        fit(cfg)
    record = json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("NonFiniteLoss")


def test_ssa_labels_find_the_cue_tokens_with_the_embedded_model(tmp_path, monkeypatch):
    """Issue 3's bar: on the synthetic task the share of label 1 on true cue tokens is at least
    3x the share on distractors (paper rule, default knobs, the real pretrained model). The bar
    was set in fp32 on this seed: bf16 autocast gives 2.99x here, 3.54x / 3.20x on seeds 1-2,
    as fp32 does (docs/benchmarks.md, "bf16 parity"), so the test pins fp32."""
    import kit.train.finetune as finetune
    build_epoch, drawn = finetune.build_epoch, []

    class LabelsDrawn(Exception):
        pass

    # The run stops once epoch 2's labels are drawn: training on them checks nothing here
    # (17 s of an AVX2 core).
    def labels_then_stop(*args, **kwargs):
        epoch_set, stats = build_epoch(*args, **kwargs)
        if stats is not None:
            drawn.append(stats)
            raise LabelsDrawn
        return epoch_set, stats

    monkeypatch.setattr(finetune, "build_epoch", labels_then_stop)
    cfg = RunConfig(task="synthetic", model="minilm", method="ssa-co", synthetic_size=600,
                    epochs=2, lr=1e-4, save_checkpoints=False, outputs_dir=str(tmp_path),
                    mixed_precision="no")
    with pytest.raises(LabelsDrawn):
        fit(cfg)
    [stats] = drawn
    assert stats["epoch"] == 1 and stats["kept"] > 500
    assert stats["cue_share_label1"] >= 3 * stats["distractor_share_label1"]


@pytest.mark.parametrize("method", ["bert", "bert-mask", "ssa-co", "ssa-h"])
def test_real_glue_smoke_per_method(method, glue_dir, tmp_path):
    # WNLI (sentence pairs, the smallest real GLUE dev set: 71 rows), max_length 32 and one
    # epoch (the SSA models probe the pretrained model before it: ssa_start_epoch 0): every
    # method end to end on real rows, full dev. RTE's dev set (277 rows) cost ~9 s a pass on one
    # thread of a 2-core AVX2 CPU (fp32); RTE runs end to end in test_predict.py
    m = fit(RunConfig(task="WNLI", model="minilm", method=method, glue_dir=str(glue_dir),
                      max_train_examples=48, epochs=1, ssa_start_epoch=0, max_length=32,
                      lr=1e-4, save_checkpoints=False, outputs_dir=str(tmp_path)))
    assert m["status"] == "ok" and 0 <= m["best_dev"]["accuracy"] <= 1
    assert len(m["epochs"]) == 1
    if method.startswith("ssa"):
        assert m["ssa_labels"][0]["probed"] == 48


def test_real_stsb_regression_ssa_h(glue_dir, tmp_path):
    """The regression path on real rows: every dev and test pair scored (the RTE smokes run the
    embedded model; here the tiny one: 2,879 pairs through minilm cost ~50 s on one AVX2 thread)."""
    cfg = RunConfig(task="STS-B", model="tiny", method="ssa-h", glue_dir=str(glue_dir),
                    max_train_examples=48, epochs=1, ssa_start_epoch=0, max_length=32, lr=1e-4,
                    predict_test=True, save_checkpoints=False, outputs_dir=str(tmp_path))
    m = fit(cfg)
    assert m["ssa_labels"][0]["probed"] == 48
    assert set(m["best_dev"]) >= {"pearson", "spearman", "score"}
    assert np.isfinite(m["best_dev"]["pearson"])
    test = (run_dir_of(cfg) / "predictions" / "test.tsv").read_text().splitlines()
    assert test[0] == "index\tprediction" and len(test) == 1 + 1379


def test_epoch_predictions_for_out_of_fold_tables(tmp_path):
    cfg = RunConfig(**TINY, save_epoch_predictions=True, outputs_dir=str(tmp_path))
    fit(cfg)
    for epoch in range(2):
        rows = (run_dir_of(cfg) / "predictions" / f"dev_epoch{epoch}.tsv").read_text().splitlines()
        assert rows[0] == "index\tprediction\tlabel" and len(rows) == 101


def test_ssa_h_with_both_attention_guiding_losses(tmp_path):
    cfg = RunConfig(**TINY, method="ssa-h", guide_loss="task+both", outputs_dir=str(tmp_path))
    m = fit(cfg)
    header = (run_dir_of(cfg) / "history.csv").read_text().splitlines()[0].split(",")
    assert m["status"] == "ok"
    assert {"loss", "loss_target", "loss_ssa", "loss_pd", "loss_md"} <= set(header)


@pytest.mark.parametrize("poison", ["loss", "weights"])
def test_a_run_diverging_between_two_checkpoints_keeps_a_finite_last_and_resumes_from_it(
        tmp_path, monkeypatch, poison):
    """A checkpoint every step, the window read every 50: step 4 goes non-finite (its loss, or
    only the weights its update wrote). The run stops naming step 4 (1-based, as history.csv),
    `last` keeps step 3's finite state, and the rerun resumes there and ends ok."""
    import kit.train.finetune as finetune
    from safetensors.torch import load_file
    cfg = RunConfig(task="synthetic", model="tiny", synthetic_size=96, batch_size=16, epochs=1,
                    lr=5e-3, checkpoint_steps=1, log_every=50, outputs_dir=str(tmp_path))
    calls, real = [], finetune.target_loss

    def diverging(*a):
        calls.append(1)
        loss = real(*a)
        if len(calls) == 4 and poison == "loss":
            return loss * float("nan")
        return loss

    def poisoned_step(*a, **k):
        out = train_step(*a, **k)
        if len(calls) == 4 and poison == "weights":
            with torch.no_grad():
                next(a[1].parameters()).fill_(float("inf"))
        return out
    from kit.train import loop
    train_step = loop.train_step
    monkeypatch.setattr(finetune, "target_loss", diverging)
    monkeypatch.setattr(loop, "train_step", poisoned_step)
    with pytest.raises(NonFiniteLoss) as err:
        fit(cfg)
    where = {"loss": "non-finite loss at epoch 0 step 4: loss=nan",
             "weights": "non-finite weights after epoch 0 step 4"}[poison]
    assert str(err.value).startswith(where)
    assert str(err.value).endswith("; checkpoint/last keeps the last finite state")
    last = run_dir_of(cfg) / "checkpoint" / "last"
    assert json.loads((last / "progress.json").read_text())["step"] == 3
    assert all(torch.isfinite(t).all() for t in load_file(last / "model.safetensors").values())
    monkeypatch.setattr(finetune, "target_loss", real)
    monkeypatch.setattr(loop, "train_step", train_step)
    m = fit(cfg)
    assert m["status"] == "ok" and m["resumed_inside_epoch"] == {"epoch": 0, "position": 3}


def poison_last_epoch(monkeypatch) -> None:
    """fit()'s weights go non-finite as its last epoch's training ends, every logged loss
    finite: the epoch's evaluation would see weights that predict one class everywhere."""
    from kit.train import loop
    real = loop.train_epoch

    def poisoned(r, epoch, work):
        seconds = real(r, epoch, work)
        if epoch == r.cfg.epochs - 1:
            with torch.no_grad():
                next(r.unwrapped.parameters()).fill_(float("inf"))
        return seconds
    monkeypatch.setattr(loop, "train_epoch", poisoned)


def test_no_dev_predictions_from_non_finite_weights(tmp_path, monkeypatch):
    """Epoch 1's weights go non-finite after its last (finite) loss: the run fails before that
    epoch's evaluation writes anything, so dev.tsv stays epoch 0's and no dev_epoch1.tsv is
    written from weights that predict one class everywhere."""
    cfg = RunConfig(**{**TINY, "synthetic_size": 96}, save_epoch_predictions=True,
                    outputs_dir=str(tmp_path))
    poison_last_epoch(monkeypatch)
    with pytest.raises(NonFiniteLoss, match="^non-finite weights after epoch 1 step 6;"):
        fit(cfg)
    predictions = run_dir_of(cfg) / "predictions"
    assert sorted(p.name for p in predictions.iterdir()) == ["dev.tsv", "dev_epoch0.tsv"]
    assert (predictions / "dev.tsv").read_bytes() == (predictions / "dev_epoch0.tsv").read_bytes()
    record = json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("NonFiniteLoss")
