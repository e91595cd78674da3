"""Multi-task EmBERT / Gated-BERT: task sampling, the task-embedded attention (equal to the plain
encoder while the new parameters are zero), the length-independent gate, the staged freezing,
per-task heads and losses, a tiny fit_multitask end to end and the notebook through papermill."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kit.models.backbones import load_backbone
from kit.config.run_config import ConfigError, RunConfig
from kit.data.pipeline import encode, load_task_data
from kit.data.tensors import collate
from kit.methods.bert import target_loss
from kit.results.views.run_view import multitask_epoch_table, per_task_table
from kit.train.multitask import (TaskMixer, fit_multitask, sampling_exponent, task_probabilities,
                                 task_schedule)
from kit.methods.embert import (MultiTaskModel, MultiTaskSpec, TaskGate, adapter_parameters,
                                apply_stage, base_qkv_parameters, default_rank, gate_parameters,
                                load_multitask, masked_mean)
from kit.config.tasks import get_task
from kit.runs import run_dir_of

REPO = Path(__file__).resolve().parents[1]
MIX = dict(task="multitask", tasks=("synthetic", "synthetic-pair"), model="tiny",
           synthetic_size=64, epochs=2, lr=5e-3, batch_size=16)


# --------------------------------------------------------------------------- sampling

def test_anneal_exponent_endpoints_and_fixed_modes():
    assert sampling_exponent("anneal", 0, 25) == 1.0
    assert sampling_exponent("anneal", 24, 25) == pytest.approx(0.2)
    assert sampling_exponent("anneal", 12, 25) == pytest.approx(0.6)
    assert sampling_exponent("anneal", 0, 1) == 1.0            # one epoch: proportional
    assert sampling_exponent("prop", 3, 5) == 1.0 and sampling_exponent("sqrt", 3, 5) == 0.5
    with pytest.raises(ValueError):
        sampling_exponent("round-robin", 0, 2)


def test_probabilities_prop_sqrt_anneal():
    sizes = [100, 400, 2500]
    np.testing.assert_allclose(task_probabilities(sizes, "prop", 0, 3), [1 / 30, 4 / 30, 25 / 30])
    np.testing.assert_allclose(task_probabilities(sizes, "sqrt", 0, 3), [10 / 80, 20 / 80, 50 / 80])
    np.testing.assert_allclose(task_probabilities(sizes, "anneal", 0, 3),
                               task_probabilities(sizes, "prop", 0, 3))
    last = task_probabilities(sizes, "anneal", 2, 3)
    np.testing.assert_allclose(last, np.array(sizes) ** 0.2 / (np.array(sizes) ** 0.2).sum())
    assert last.max() / last.min() < 2.1                        # nearly uniform at the end
    np.testing.assert_allclose(task_probabilities(sizes, "round-robin", 0, 3), [1 / 3] * 3)


def test_schedule_round_robin_order_and_sampled_frequencies():
    np.testing.assert_array_equal(task_schedule([5, 9, 7], "round-robin", 0, 2, 7, seed=0),
                                  [0, 1, 2, 0, 1, 2, 0])
    np.testing.assert_array_equal(task_schedule([5, 9, 7], "round-robin", 1, 2, 7, seed=0),
                                  [1, 2, 0, 1, 2, 0, 1])         # continues across epochs
    sizes = [100, 900]
    drawn = task_schedule(sizes, "prop", 0, 1, 20000, seed=3)
    assert abs(np.mean(drawn == 1) - 0.9) < 0.01
    np.testing.assert_array_equal(drawn, task_schedule(sizes, "prop", 0, 1, 20000, seed=3))
    assert not np.array_equal(drawn, task_schedule(sizes, "prop", 0, 1, 20000, seed=4))


def test_mixer_sizes_from_data_single_task_batches_and_epoch_length():
    lengths = [np.arange(3, 13), np.arange(5, 55) % 17 + 3]    # 10 and 50 rows
    mixer = TaskMixer(lengths, batch_size=8, sampling="prop", epochs=2, seed=0)
    assert mixer.sizes == [10, 50] and mixer.n_batches == 8     # ceil(60 / 8)
    np.testing.assert_allclose(mixer.probabilities(0), [1 / 6, 5 / 6])
    plan = mixer.epoch(0)
    assert len(plan) == 8
    for t, rows in plan:
        assert 0 < len(rows) <= 8 and max(rows) < mixer.sizes[t]
    # a task's stream covers all its rows once before any row repeats
    stream = TaskMixer([np.arange(1, 21)], 4, "prop", 1, seed=1).streams[0]
    first_pass = sorted(r for _ in range(5) for r in stream.next())
    assert first_pass == list(range(20))
    assert len(TaskMixer(lengths, 8, "anneal", 2, 0, steps_per_epoch=3).epoch(0)) == 3


# --------------------------------------------------------------------------- models

def _model(method: str, names=("synthetic", "synthetic-pair"), seed: int = 0):
    torch.manual_seed(seed)
    backbone, tokenizer = load_backbone("tiny")
    tasks = [get_task(n) for n in names]
    plain = copy.deepcopy(backbone).eval()
    spec = MultiTaskSpec([t.name for t in tasks], [t.num_labels for t in tasks],
                         [t.regression for t in tasks], method)
    return MultiTaskModel(backbone, spec).eval(), plain, tokenizer


def _batch(tokenizer, texts):
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


@pytest.mark.parametrize("method", ["embert", "gated"])
def test_new_parameters_at_zero_leave_the_pretrained_encoder_unchanged(method):
    model, plain, tok = _model(method)
    ids, mask = _batch(tok, ["a short one", "a somewhat longer sentence with more words"])
    with torch.no_grad():
        ours = model.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        ref = plain(input_ids=ids, attention_mask=mask).last_hidden_state
        model(ids, mask, task=1)                                   # the hooks are active
        routed = model.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    torch.testing.assert_close(routed, ref, rtol=0, atol=0)
    with torch.no_grad():
        model.task_embeddings[0, 2, 1].normal_()                  # layer 0, V, task 1
        model.set_task(1)
        moved = model.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        model.set_task(0)                                          # task 0's vector is still 0
        other = model.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
    assert not torch.allclose(moved, ref)
    torch.testing.assert_close(other, ref, rtol=0, atol=0)


def test_task_embedding_is_added_to_the_projection():
    model, _, tok = _model("embert")
    ids, mask = _batch(tok, ["the task vector rides on every token"])
    attention = model.backbone.encoder.layer[1].attention.self
    seen = {}
    attention.query.register_forward_hook(lambda m, a, out: seen.update(h=a[0], q=out))
    with torch.no_grad():
        model.task_embeddings[1, 0, 0] = torch.arange(32.0)
        model(ids, mask, task=0)
    expected = F.linear(seen["h"], attention.query.weight, attention.query.bias)
    expected = expected + torch.arange(32.0)
    torch.testing.assert_close(seen["q"], expected)


@pytest.mark.parametrize("length", [1, 7, 128, 300])
def test_gate_any_length_sums_to_one_and_ignores_padding(length):
    torch.manual_seed(length)
    gate = TaskGate(hidden=8, n_tasks=3)
    torch.nn.init.normal_(gate.proj.weight)
    h = torch.randn(4, length, 8)
    mask = torch.ones(4, length, dtype=torch.long)
    g = gate(h, mask)
    assert g.shape == (4, 3)
    torch.testing.assert_close(g.sum(-1), torch.ones(4))
    # the same rows with 5 extra padded positions full of garbage: the same gate
    padded = torch.cat([h, 100 * torch.randn(4, 5, 8)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(4, 5, dtype=torch.long)], dim=1)
    torch.testing.assert_close(gate(padded, padded_mask), g)
    torch.testing.assert_close(masked_mean(padded, padded_mask), h.mean(1))


def test_gated_model_output_does_not_depend_on_padding():
    model, _, tok = _model("gated", names=("synthetic", "synthetic-pair", "STS-B"))
    with torch.no_grad():                                         # make every new part matter
        for p in [*adapter_parameters(model), *gate_parameters(model), model.task_embeddings]:
            p.normal_(0, 0.1)
    ids, mask = _batch(tok, ["short", "a much longer sentence than the first one is"])
    with torch.no_grad():
        alone = model(ids[:1, : int(mask[0].sum())], mask[:1, : int(mask[0].sum())], task=2)
        padded = model(ids, mask, task=2)
    assert padded["logits"].shape == (2, 1)
    torch.testing.assert_close(padded["logits"][:1], alone["logits"], atol=1e-5, rtol=1e-5)


def test_adapter_rank_scales_with_hidden_size():
    assert default_rank(768) == 204 and default_rank(384) == 102 and default_rank(32) == 8
    model, _, _ = _model("gated")
    assert model.spec.adapter_rank == 8
    assert model.gated.adapters["query"].down.shape == (2, 8, 32)


def test_staged_freezing_by_epoch():
    model, _, _ = _model("gated")
    lower = list(model.backbone.encoder.layer[0].parameters())
    stages = {}
    for epoch in range(4):
        stages[epoch] = apply_stage(model, epoch, gate_start_epoch=1, freeze_qkv_epoch=3)
        grads = lambda ps: {p.requires_grad for p in ps}          # noqa: E731
        assert grads(adapter_parameters(model)) == {True}
        assert grads(gate_parameters(model)) == {epoch >= 1}
        assert grads(base_qkv_parameters(model)) == {epoch < 3}
        assert grads(lower) == {True} and grads(model.heads.parameters()) == {True}
    assert stages == {0: "adapters", 1: "adapters+gate", 2: "adapters+gate",
                      3: "adapters+gate, qkv frozen"}
    # a parameter frozen before the stages (e.g. freeze_layers) stays frozen
    keep = {id(p) for p in model.parameters()} - {id(base_qkv_parameters(model)[0])}
    apply_stage(model, 0, 1, 3, trainable=keep)
    assert not base_qkv_parameters(model)[0].requires_grad
    embert, _, _ = _model("embert")
    assert apply_stage(embert, 5, 1, 2) == "all"
    assert all(p.requires_grad for p in embert.parameters())


def test_per_task_heads_losses_and_gradient_routing():
    model, _, tok = _model("gated", names=("synthetic", "STS-B", "MNLI"))
    assert [h.out_features for h in model.heads] == [2, 1, 3]
    model.train()
    ids, mask = _batch(tok, ["one sentence", "and another sentence"])
    out = model(ids, mask, task=1)
    labels = torch.tensor([0.5, 3.0])
    loss = target_loss(out["logits"], labels, regression=True)
    torch.testing.assert_close(loss, F.mse_loss(out["logits"][:, 0], labels))
    loss.backward()
    assert model.heads[1].weight.grad is not None
    assert model.heads[0].weight.grad is None and model.heads[2].weight.grad is None
    emb = model.task_embeddings.grad
    assert emb[:, :, 1].abs().sum() > 0 and emb[:, :, [0, 2]].abs().sum() == 0
    up = model.gated.adapters["query"].up.grad                    # own adapter only
    assert up[1].abs().sum() > 0 and up[[0, 2]].abs().sum() == 0
    logits = model(ids, mask, task=2)["logits"]
    assert logits.shape == (2, 3)
    assert target_loss(logits, torch.tensor([0, 2]), regression=False) > 0


def test_config_rules_for_multitask():
    cfg = RunConfig(**MIX, method="gated")
    assert cfg.run_id.startswith("multitask-gated-s0-")
    assert RunConfig.from_dict({**MIX, "tasks": ["RTE", "sst2"], "method": "embert"}).tasks == \
        ("RTE", "SST-2")                                   # task names are normalised
    for bad, needle in [({"method": "bert"}, "'task'"), ({"tasks": ()}, "'tasks'"),
                        ({"tasks": ("RTE", "rte")}, "twice"), ({"tasks": ("NOPE",)}, "unknown"),
                        ({"tasks": ("csv",)}, "'tasks'"), ({"sampling": "uniform"}, "'sampling'"),
                        ({"gate_start_epoch": 3, "freeze_qkv_epoch": 2}, "freeze_qkv_epoch")]:
        with pytest.raises(ConfigError, match=needle):
            RunConfig.from_dict({**MIX, "method": "embert", **bad})
    with pytest.raises(ConfigError, match="'task'"):
        RunConfig(method="embert")
    with pytest.raises(ConfigError, match="'tasks'"):
        RunConfig(task="RTE", tasks=("RTE",))


# --------------------------------------------------------------------------- end to end

def test_fit_multitask_end_to_end(tmp_path):
    """Gated (the superset: EmBERT attention + gated layer + stages); the notebook test runs
    embert."""
    method = "gated"
    cfg = RunConfig(**MIX, method=method, outputs_dir=str(tmp_path))
    m = fit_multitask(cfg)
    run = run_dir_of(cfg)
    on_disk = json.loads((run / "metrics.json").read_text())
    assert on_disk["status"] == "ok" and on_disk["run_id"] == cfg.run_id
    assert RunConfig.from_dict(json.loads((run / "config.json").read_text())) == cfg
    names = ["synthetic", "synthetic-pair"]
    assert len(m["epochs"]) == 2 and m["task_sizes"] == {n: 64 for n in names}
    assert m["steps_per_epoch"] == 8                               # 128 rows / 16
    # max_length 128 cuts none of the synthetic rows: counted per task and split, no warning
    assert {k: (v["rows"], v["truncated"]) for k, v in m["truncation"].items()} == {
        "synthetic train": (64, 0), "synthetic dev": (16, 0),
        "synthetic-pair train": (64, 0), "synthetic-pair dev": (16, 0)}
    for e in m["epochs"]:
        assert set(e["dev"]) == {*names, "score"}
        assert e["dev"]["score"] == pytest.approx(np.mean([e["dev"][n]["score"] for n in names]))
        assert sum(e["task_batches"].values()) == 8
    best = m["epochs"][m["best_epoch"]]
    assert m["best_dev"]["score"] == max(e["dev"]["score"] for e in m["epochs"])
    assert m["per_task"] == {n: best["dev"][n] for n in names}
    assert m["best_dev"]["synthetic/accuracy"] == m["per_task"]["synthetic"]["accuracy"]
    assert set(m["wall_s"]) >= {"train", "label_generation", "eval", "total"}
    assert [e["stage"] for e in m["epochs"]] == ["adapters", "adapters+gate"]
    history = (run / "history.csv").read_text().splitlines()
    assert history[0].startswith("step,epoch,wall_s,loss") and "loss_synthetic" in history[0]
    for name in names:
        dev = (run / "predictions" / name / "dev.tsv").read_text().splitlines()
        assert dev[0] == "index\tprediction\tlabel" and len(dev) == 1 + 16
    assert list(per_task_table(m).index) == names and len(multitask_epoch_table(m)) == 2
    # the best checkpoint reloads into the model that wrote the dev predictions
    model, tokenizer = load_multitask(run / "checkpoint" / "best")
    assert model.spec.tasks == names and model.spec.method == method
    split = load_task_data(RunConfig(task="synthetic-pair", synthetic_size=64)).dev["dev"]
    ex = encode(tokenizer, split, cfg.max_length, regression=False)
    batch = collate(ex, list(range(len(ex))), tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(batch["input_ids"], batch["attention_mask"],
                       token_type_ids=batch["token_type_ids"], task=1)["logits"]
    labels = get_task("synthetic-pair").labels
    written = [r.split("\t")[1] for r in
               (run / "predictions" / "synthetic-pair" / "dev.tsv").read_text().splitlines()[1:]]
    assert [labels[i] for i in logits.argmax(-1).tolist()] == written
    assert fit_multitask(cfg) == m                                  # finished: not rerun


def test_a_run_stopped_after_an_epoch_resumes_to_the_uninterrupted_metrics(tmp_path, monkeypatch):
    import kit.train.multitask as multitask
    settings = {**MIX, "method": "gated", "epochs": 3}
    straight = fit_multitask(RunConfig(**settings, outputs_dir=str(tmp_path / "straight")))
    assert straight["resumed_after_epoch"] is None

    stage = multitask.apply_stage

    def stop_at_epoch_2(model, epoch, *args):
        if epoch == 2:
            raise KeyboardInterrupt("killed")   # like a kill: nothing after epoch 1 is recorded
        return stage(model, epoch, *args)

    cfg = RunConfig(**settings, outputs_dir=str(tmp_path / "killed"))
    monkeypatch.setattr(multitask, "apply_stage", stop_at_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        fit_multitask(cfg)
    monkeypatch.setattr(multitask, "apply_stage", stage)
    resumed = fit_multitask(cfg)
    assert resumed["resumed_after_epoch"] == 1
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert strip(resumed["epochs"]) == strip(straight["epochs"])
    assert resumed["train_examples"] == straight["train_examples"]


def test_notebook_smoke_through_papermill(tmp_path, run_notebook):
    out = tmp_path / "executed.ipynb"
    run_notebook(REPO / "notebooks" / "multitask.ipynb", out, synthetic_size=64, batch_size=16,
                 outputs_dir=str(tmp_path / "outputs"))
    runs = list((tmp_path / "outputs" / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("multitask-embert-")
    assert json.loads((runs[0] / "metrics.json").read_text())["status"] == "ok"


def test_profile_points_keep_their_run_id_inside_the_notebook():
    """kit.batch names a run folder from the grid point, the notebook from its parameters cell
    plus the point: a notebook default that differs from RunConfig's and that the profile does
    not set would move the run to another folder."""
    import ast

    import nbformat

    from kit import batch
    nb = nbformat.read(str(REPO / "notebooks" / "multitask.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    defaults = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(cell.source).body}
    points = batch.load_profile("multitask").points
    assert {p["method"] for p in points} == {"embert", "gated"}
    for point in points:
        in_notebook = RunConfig.from_dict({**defaults, **point})
        assert in_notebook.run_id == RunConfig.from_dict(point).run_id
