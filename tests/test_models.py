"""Tests of the single-task model and its parts: kit.methods.bert (SequenceModel, heads, target
loss), kit.methods.ssa_heads (masked softmax, SSA-H token weights, the token head, SSA loss),
kit.models.model_io (save/load) and kit.models.backbones (loading encoders, one-line errors)."""
import copy
import re
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kit.models import backbones
from kit.methods import bert as models
from kit.models.backbones import ModelError, load_backbone
from kit.methods.bert import HeadSpec, SequenceModel, load_trained, target_loss
from kit.models.model_io import save_model
from kit.methods.ssa_heads import TokenImportanceHead, hybrid_weights, masked_softmax, ssa_loss


pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_backbone("tiny")


def make_model(tiny, method, seed=0, **spec):
    torch.manual_seed(seed)
    backbone, _ = tiny
    spec = HeadSpec(num_labels=spec.pop("num_labels", 3), method=method, **spec)
    return SequenceModel(copy.deepcopy(backbone), spec).eval()


def make_batch(tokenizer, pair=False):
    a = ["a good movie", "the plot was thin and the actors were bored today", "wow"]
    b = ["it is fine", "nothing", "a very long second sentence with many words"] if pair else None
    enc = tokenizer(a, b, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    special = enc["special_tokens_mask"].bool() | (enc["attention_mask"] == 0)
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
             "special_mask": special}
    if pair:
        batch["token_type_ids"] = enc["token_type_ids"]
    return batch


# --------------------------------------------------------------------------- masked_softmax

def test_masked_softmax_property():
    rng = np.random.default_rng(0)
    for _ in range(30):
        shape = tuple(int(x) for x in rng.integers(1, 7, size=int(rng.integers(1, 4))))
        scores = torch.tensor(rng.normal(0, 5, size=shape), dtype=torch.float32)
        keep = torch.tensor(rng.random(shape) < rng.random())
        w = masked_softmax(scores, keep)
        assert w.shape == scores.shape and torch.isfinite(w).all()
        assert (w[~keep] == 0).all() and (w >= 0).all()
        sums = w.sum(-1)
        any_kept = keep.any(-1)
        torch.testing.assert_close(sums[any_kept], torch.ones_like(sums[any_kept]))
        assert (sums[~any_kept] == 0).all()
        # on kept positions it is the plain softmax of the kept scores
        flat_s, flat_k, flat_w = scores.reshape(-1, shape[-1]), keep.reshape(-1, shape[-1]), \
            w.reshape(-1, shape[-1])
        for s, k, row in zip(flat_s, flat_k, flat_w):
            if k.any():
                torch.testing.assert_close(row[k], torch.softmax(s[k], -1))


def test_masked_softmax_nothing_kept_is_zero_with_finite_gradient():
    scores = torch.randn(3, 5, requires_grad=True)
    keep = torch.zeros(3, 5, dtype=torch.bool)
    keep[1, 2:] = True
    w = masked_softmax(scores, keep)
    assert (w[0] == 0).all() and (w[2] == 0).all()
    values = torch.randn(3, 5)
    (w * values).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert (scores.grad[0] == 0).all() and (scores.grad[1, :2] == 0).all()
    assert scores.grad[1, 2:].abs().sum() > 0


def test_masked_softmax_extreme_scores_stay_finite():
    scores = torch.tensor([[1e30, -1e30, 0.0], [float("-inf"), 0.0, 1.0]], requires_grad=True)
    keep = torch.tensor([[True, True, False], [False, True, True]])
    w = masked_softmax(scores, keep)
    assert torch.isfinite(w).all()
    w[:, 1].sum().backward()
    assert torch.isfinite(scores.grad).all()


# --------------------------------------------------------------------------- hybrid weights

# One row: [CLS], three real tokens with P(important) = 0.5, 0.75, 0.2, then padding (p 0.9).
# Logits (0, log(p / (1 - p))) give exactly these p.
HAND_P = [0.5, 0.5, 0.75, 0.2, 0.9]
HAND_LOGITS = torch.tensor([[[0.0, np.log(p / (1 - p))] for p in HAND_P]], dtype=torch.float64)
HAND_REAL = torch.tensor([[False, True, True, True, False]])


def test_hybrid_weights_paper_by_hand():
    """paper: softmax over the real tokens of p itself: e^p_i / sum_j e^p_j."""
    w = hybrid_weights(HAND_LOGITS, HAND_REAL, "paper", 0.3)
    z = np.exp(0.5) + np.exp(0.75) + np.exp(0.2)
    want = [0.0, np.exp(0.5) / z, np.exp(0.75) / z, np.exp(0.2) / z, 0.0]
    torch.testing.assert_close(w, torch.tensor([want], dtype=torch.float64), rtol=0, atol=1e-15)
    # no threshold: 0.2 < 0.3 keeps its weight, and any threshold gives the same weights
    torch.testing.assert_close(w, hybrid_weights(HAND_LOGITS, HAND_REAL, "paper", 0.99))


def test_hybrid_weights_code_by_hand():
    """code: p = 0.2 < 0.3 dropped; softmax over p = 0.5, 0.75 -> 1 / (1 + e^0.25), ..."""
    w = hybrid_weights(HAND_LOGITS, HAND_REAL, "code", 0.3)
    want = [0.0, 1 / (1 + np.exp(0.25)), np.exp(0.25) / (1 + np.exp(0.25)), 0.0, 0.0]
    torch.testing.assert_close(w, torch.tensor([want], dtype=torch.float64), rtol=0, atol=1e-15)


def test_hybrid_weights_logodds_by_hand():
    """logodds: w_i proportional to p_i / (1 - p_i) = 1, 3, 1/4 -> 4/17, 12/17, 1/17."""
    w = hybrid_weights(HAND_LOGITS, HAND_REAL, "logodds", 0.3)
    want = [0.0, 4 / 17, 12 / 17, 1 / 17, 0.0]
    torch.testing.assert_close(w, torch.tensor([want], dtype=torch.float64), rtol=0, atol=1e-15)


def test_hybrid_weights_unknown_weighting():
    with pytest.raises(ValueError, match="logodds"):
        hybrid_weights(HAND_LOGITS, HAND_REAL, "softmax", 0.3)


@pytest.mark.parametrize("weighting, score", [
    ("logodds", lambda logits: logits[..., 1] - logits[..., 0]),
    ("paper", lambda logits: torch.softmax(logits, -1)[..., 1]),
])
def test_hybrid_weights_softmax_of_score(weighting, score):
    rng = np.random.default_rng(1)
    for _ in range(10):
        b, t = int(rng.integers(1, 5)), int(rng.integers(2, 12))
        logits = torch.tensor(rng.normal(0, 2, size=(b, t, 2)), dtype=torch.float32)
        real = torch.tensor(rng.random((b, t)) < 0.7)
        w = hybrid_weights(logits, real, weighting, 0.3)
        assert (w[~real] == 0).all()
        for i in range(b):
            if real[i].any():
                torch.testing.assert_close(w[i, real[i]],
                                           torch.softmax(score(logits[i])[real[i]], -1))
        # the threshold plays no role outside code mode
        torch.testing.assert_close(w, hybrid_weights(logits, real, weighting, 0.99))


def test_hybrid_weights_code_mode_drops_unlikely_tokens():
    rng = np.random.default_rng(2)
    for threshold in (0.0, 0.3, 0.5, 0.8):
        logits = torch.tensor(rng.normal(0, 2, size=(4, 9, 2)), dtype=torch.float32)
        real = torch.ones(4, 9, dtype=torch.bool)
        real[:, 0] = False                  # [CLS]
        real[1, 6:] = False                 # padding
        p = torch.softmax(logits, -1)[..., 1]
        w = hybrid_weights(logits, real, "code", threshold)
        kept = real & (p >= threshold)
        assert (w[~kept] == 0).all()
        assert (w[:, 0] == 0).all() and (w[1, 6:] == 0).all()
        for i in range(4):
            if kept[i].any():
                torch.testing.assert_close(w[i, kept[i]], torch.softmax(p[i, kept[i]], -1))
            else:
                assert (w[i] == 0).all()


def test_hybrid_weights_code_mode_all_dropped_is_zero():
    logits = torch.tensor([[[5.0, -5.0], [4.0, -4.0], [0.0, 0.0]]])   # p ~ 0, 0, 0.5
    real = torch.tensor([[True, True, False]])
    w = hybrid_weights(logits, real, "code", 0.3)
    assert (w == 0).all() and torch.isfinite(w).all()
    w2 = hybrid_weights(logits, torch.ones_like(real), "code", 0.3)
    assert w2[0, 2] == 1 and w2[0, :2].sum() == 0
    # p == threshold is kept (released code: drop p < threshold)
    w3 = hybrid_weights(logits, torch.ones_like(real), "code", 0.5)
    assert w3[0, 2] == 1


# --------------------------------------------------------------------------- token head

@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("batch, length, hidden", [(1, 1, 4), (2, 7, 16), (3, 12, 32)])
def test_token_head_shapes(shared, batch, length, hidden):
    head = TokenImportanceHead(hidden, max_positions=12, shared=shared)
    out = head(torch.randn(batch, length, hidden))
    assert out.shape == (batch, length, 2)
    assert torch.isfinite(out).all()


def test_token_head_per_position_differs_from_shared():
    torch.manual_seed(0)
    x = torch.randn(1, 1, 8).expand(2, 5, 8).contiguous()     # the same vector at every position
    shared = TokenImportanceHead(8, 5, shared=True)
    out = shared(x)
    torch.testing.assert_close(out, out[:, :1].expand_as(out))
    per = TokenImportanceHead(8, 5, shared=False)
    with torch.no_grad():
        per.bias.normal_()
    out = per(x)
    assert not torch.allclose(out[:, 0], out[:, 1])
    h = per.transform(x)
    want = torch.stack([h[:, t] @ per.weight[t] + per.bias[t] for t in range(5)], 1)
    torch.testing.assert_close(out, want)


def test_token_head_gradients_reach_all_parameters():
    for shared in (True, False):
        head = TokenImportanceHead(8, 6, shared=shared)
        head(torch.randn(2, 6, 8)).square().sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())


# --------------------------------------------------------------------------- SequenceModel

@pytest.mark.parametrize("method", ["bert", "bert-mask", "ssa-co", "ssa-h"])
@pytest.mark.parametrize("num_labels, pair", [(1, False), (2, True), (3, False)])
def test_sequence_model_shapes(tiny, method, num_labels, pair):
    model = make_model(tiny, method, num_labels=num_labels)
    batch = make_batch(tiny[1], pair)
    out = model(**batch)
    b, t = batch["input_ids"].shape
    assert out["logits"].shape == (b, num_labels)
    if method in ("ssa-co", "ssa-h"):
        assert out["token_logits"].shape == (b, t, 2)
    else:
        assert out["token_logits"] is None and model.token_head is None
    if method == "ssa-h":
        w = out["token_weights"]
        assert w.shape == (b, t)
        real = batch["attention_mask"].bool() & ~batch["special_mask"]
        assert (w[~real] == 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(b))
    else:
        assert out["token_weights"] is None
    assert out["attentions"] is None


def test_hybrid_output_is_beta_mix(tiny):
    for beta in (0.0, 0.3, 0.8):
        for weighting in ("paper", "code", "logodds"):
            model = make_model(tiny, "ssa-h", beta=beta, hybrid_weighting=weighting,
                               attention_threshold=0.4)
            batch = make_batch(tiny[1], pair=True)
            out = model(**batch)
            with torch.no_grad():
                enc = model.backbone(input_ids=batch["input_ids"],
                                     attention_mask=batch["attention_mask"],
                                     token_type_ids=batch["token_type_ids"])
                tokens = enc.last_hidden_state
                token_logits = model.token_head(tokens)
                real = batch["attention_mask"].bool() & ~batch["special_mask"]
                w = hybrid_weights(token_logits, real, weighting, 0.4)
                mixed = (w.unsqueeze(-1) * tokens).sum(1)
                want = model.classifier(beta * enc.pooler_output + (1 - beta) * mixed)
            torch.testing.assert_close(out["token_weights"], w)
            torch.testing.assert_close(out["logits"], want, atol=1e-5, rtol=1e-5)


def test_hybrid_with_beta_one_equals_pooled_path(tiny):
    hybrid = make_model(tiny, "ssa-h", beta=1.0)
    plain = make_model(tiny, "bert", seed=1)
    missing, unexpected = plain.load_state_dict(hybrid.state_dict(), strict=False)
    assert not missing and all(k.startswith("token_head.") for k in unexpected)
    co = make_model(tiny, "ssa-co", seed=2)
    co.load_state_dict(hybrid.state_dict())
    batch = make_batch(tiny[1], pair=True)
    with torch.no_grad():
        h, p, c = hybrid(**batch), plain(**batch), co(**batch)
    torch.testing.assert_close(h["logits"], p["logits"])
    torch.testing.assert_close(h["logits"], c["logits"])
    torch.testing.assert_close(h["token_logits"], c["token_logits"])
    # and beta < 1 really changes the output
    mixed = make_model(tiny, "ssa-h", beta=0.5)
    mixed.load_state_dict(hybrid.state_dict())
    with torch.no_grad():
        assert not torch.allclose(mixed(**batch)["logits"], h["logits"])


def test_sequence_model_ignores_padding(tiny):
    """A row's logits do not depend on how far the batch pads it."""
    tok = tiny[1]
    for method in ("bert", "ssa-h"):
        model = make_model(tiny, method)
        batch = make_batch(tok, pair=False)
        alone = tok(["wow"], return_tensors="pt", return_special_tokens_mask=True)
        with torch.no_grad():
            full = model(**batch)["logits"][2]
            single = model(alone["input_ids"], alone["attention_mask"],
                           alone["special_tokens_mask"].bool())["logits"][0]
        torch.testing.assert_close(full, single, atol=1e-5, rtol=1e-4)


def test_sequence_model_dropout_only_in_train_mode(tiny):
    model = make_model(tiny, "ssa-h")
    batch = make_batch(tiny[1])
    with torch.no_grad():
        torch.testing.assert_close(model(**batch)["logits"], model(**batch)["logits"])
        model.train()
        torch.manual_seed(0)
        a = model(**batch)["logits"]
        b = model(**batch)["logits"]
    assert not torch.allclose(a, b)


def test_sequence_model_attentions(tiny):
    backbone, tok = load_backbone("tiny", eager_attention=True)
    model = SequenceModel(backbone, HeadSpec(num_labels=2)).eval()
    batch = make_batch(tok)
    out = model(**batch, output_attentions=True)
    b, t = batch["input_ids"].shape
    assert len(out["attentions"]) == 2 and out["attentions"][0].shape == (b, 2, t, t)


def test_classifier_dropout_zero_is_respected(tiny):
    backbone = copy.deepcopy(tiny[0])
    backbone.config.classifier_dropout = 0.0
    model = SequenceModel(backbone, HeadSpec(num_labels=2))
    assert model.dropout.p == 0.0


# --------------------------------------------------------------------------- losses

def test_ssa_loss_matches_cross_entropy_on_labelled():
    rng = np.random.default_rng(4)
    for _ in range(10):
        b, t = int(rng.integers(1, 5)), int(rng.integers(1, 10))
        logits = torch.tensor(rng.normal(size=(b, t, 2)), dtype=torch.float32)
        labels = torch.tensor(rng.integers(0, 2, size=(b, t)))
        labels[torch.tensor(rng.random((b, t)) < 0.5)] = -100
        labels.view(-1)[0] = 1                      # at least one labelled position
        loss = ssa_loss(logits, labels)
        keep = labels != -100
        want = F.cross_entropy(logits[keep], labels[keep])
        torch.testing.assert_close(loss, want)
        # what the ignored positions hold does not matter
        noisy = logits.clone()
        noisy[~keep] = torch.randn(int((~keep).sum()), 2) * 100
        torch.testing.assert_close(ssa_loss(noisy, labels), loss)


def test_ssa_loss_zero_with_graph_when_nothing_labelled():
    logits = torch.randn(2, 4, 2, requires_grad=True)
    loss = ssa_loss(logits, torch.full((2, 4), -100))
    assert loss.item() == 0.0 and loss.requires_grad and loss.dim() == 0
    loss.backward()
    assert (logits.grad == 0).all()


def test_target_loss():
    logits = torch.tensor([[0.5], [2.0], [-1.0]])
    labels = torch.tensor([1.0, 2.0, 0.0])
    loss = target_loss(logits, labels, regression=True)
    torch.testing.assert_close(loss, torch.tensor((0.25 + 0 + 1) / 3))
    assert loss.dtype == torch.float32
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    labels = torch.tensor([0, 2])
    loss = target_loss(logits, labels, regression=False)
    want = -(torch.log_softmax(logits, -1)[[0, 1], [0, 2]]).mean()
    torch.testing.assert_close(loss, want)
    # low precision logits are scored in float32
    assert target_loss(logits.half(), labels, regression=False).dtype == torch.float32


# --------------------------------------------------------------------------- save / load

@pytest.mark.parametrize("method, share", [("bert", True), ("ssa-h", True), ("ssa-co", False)])
def test_save_and_load_round_trip(tiny, tmp_path, method, share):
    model = make_model(tiny, method, num_labels=2, beta=0.3, hybrid_weighting="code",
                       share_weight=share, max_length=32)
    with torch.no_grad():                       # make the heads differ from a fresh init
        model.classifier.bias.normal_()
    save_model(model, tiny[1], tmp_path / "run")
    # heads.safetensors holds only what a transformers head has no place for (the SSA heads)
    assert (tmp_path / "run" / "heads.safetensors").is_file() == (method != "bert")
    loaded, tok = load_trained(tmp_path / "run")
    assert not loaded.training and loaded.spec == model.spec
    batch = make_batch(tok, pair=True)
    with torch.no_grad():
        a, b = model(**batch), loaded(**batch)
    torch.testing.assert_close(a["logits"], b["logits"], rtol=0, atol=0)
    if method != "bert":
        torch.testing.assert_close(a["token_logits"], b["token_logits"], rtol=0, atol=0)
    want = model.state_dict()
    got = loaded.state_dict()
    assert set(want) == set(got)
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert tok("a good movie")["input_ids"] == tiny[1]("a good movie")["input_ids"]


# --------------------------------------------------------------------------- load_backbone

@pytest.mark.parametrize("name", ["no-such-model-xyz", "nobody/no-such-model-at-all"])
def test_load_backbone_bogus_name(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as info:
        load_backbone(name)
    msg = str(info.value)
    assert repr(name) in msg and "\n" not in msg
    assert "HF_HUB_OFFLINE=1 is set" in msg and "hub is unreachable" in msg and "minilm" in msg


def test_hub_id_offline_without_hf_hub_offline_fails_fast(monkeypatch):
    """No HF_HUB_OFFLINE, no network: the reachability check (the GLUE reader's) answers
    first; only the local cache is tried, so the error comes in seconds and says why."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    why = "cannot connect to huggingface.co:443 ([Errno -3] Temporary failure in name resolution)"
    calls = []
    monkeypatch.setattr("kit.data.hub.hub_unreachable", lambda: calls.append(1) or why)
    started = time.perf_counter()
    with pytest.raises(ModelError) as info:
        load_backbone("nobody/no-such-model-at-all")
    assert time.perf_counter() - started < 10 and calls == [1]
    assert str(info.value) == (
        f"model 'nobody/no-such-model-at-all': the hub is unreachable ({why}) and the model is "
        "not in the local cache; use a local Hugging Face folder, a classic bert_config.json "
        "folder or the embedded `minilm`")


def test_hub_id_reachable_hub_failure_names_the_cause(monkeypatch):
    monkeypatch.setattr("kit.data.hub.hub_unreachable", lambda: None)
    with pytest.raises(ModelError) as info:     # the test process is still offline underneath
        load_backbone("nobody/no-such-model-at-all")
    msg = str(info.value)
    assert msg.startswith("model 'nobody/no-such-model-at-all' did not load from the hub (")
    assert "Error" in msg.split("(", 1)[1] and "\n" not in msg


def test_local_folder_never_asks_the_hub(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr("kit.data.hub.hub_unreachable", lambda: pytest.fail("hub checked"))
    tiny[0].save_pretrained(tmp_path)
    tiny[1].save_pretrained(tmp_path)
    backbone, _ = load_backbone(str(tmp_path))
    assert backbone.config.hidden_size == 32


@pytest.mark.parametrize("name", ["outputs/zoo/no-such-family", "./no-such-folder", "/no/such"])
def test_missing_local_folder_is_not_looked_up_on_the_hub(name, monkeypatch):
    monkeypatch.setattr("kit.data.hub.hub_unreachable", lambda: pytest.fail("hub checked"))
    with pytest.raises(ModelError, match=rf"^model folder {re.escape(repr(name))} does not exist "):
        load_backbone(name)


def test_load_backbone_folder_without_weights(tiny, tmp_path):
    tiny[0].config.save_pretrained(tmp_path)          # config.json only
    with pytest.raises(ModelError) as info:
        load_backbone(str(tmp_path))
    msg = str(info.value)
    assert msg.startswith(f"model folder {str(tmp_path)!r} has no loadable Hugging Face model (")
    assert "OSError: " in msg and "\n" not in msg     # the cause, first line only


def test_load_backbone_empty_folder(tmp_path):
    with pytest.raises(ModelError) as info:
        load_backbone(str(tmp_path))
    assert repr(str(tmp_path)) in str(info.value) and "\n" not in str(info.value)


def test_attention_choice_is_asked_of_transformers(tiny):
    """SDPA for BERT (supported), eager when maps are needed."""
    assert tiny[0].config._attn_implementation == "sdpa"
    assert load_backbone("tiny", eager_attention=True)[0].config._attn_implementation == "eager"


def test_no_attention_maps_is_one_line_model_error(tiny):
    model = make_model(tiny, "bert")                 # SDPA returns no maps
    with pytest.raises(ModelError, match=r"^BertModel returned no attention maps \(attention "
                                         r"implementation 'sdpa'\); attention guiding"):
        model(**make_batch(tiny[1]), output_attentions=True)


class _Config:
    """A stand-in config with only the attributes a test names."""

    def __init__(self, **values):
        self.__dict__.update(values)


@pytest.mark.parametrize("values, want", [
    ({"classifier_dropout": None, "hidden_dropout_prob": 0.1, "layer_norm_eps": 1e-12,
      "initializer_range": 0.02}, (0.1, 0.02, 1e-12)),                          # BERT
    ({"dropout": 0.1, "seq_classif_dropout": 0.2, "initializer_range": 0.03},
     (0.2, 0.03, 1e-12)),                                                      # DistilBERT
    ({"classifier_dropout": 0.0, "mlp_dropout": 0.1, "norm_eps": 1e-5,
      "initializer_range": 0.02}, (0.0, 0.02, 1e-5)),                           # ModernBERT
    ({"hidden_dropout": 0.05, "layer_norm_epsilon": 1e-6, "init_std": 0.01},
     (0.05, 0.01, 1e-6)),
    ({}, (0.1, 0.02, 1e-12)),                                                  # defaults
])
def test_head_settings_adapter(values, want):
    got = models.head_settings(_Config(**values))
    assert (got["dropout"], got["initializer_range"], got["norm_eps"]) == want


def test_tiny_backbone_is_small_and_uses_embedded_vocab(tiny):
    backbone, tok = tiny
    assert backbone.config.hidden_size == 32 and backbone.config.num_hidden_layers == 2
    assert backbone.config.vocab_size == tok.vocab_size
    assert backbones.embedded_model_dir().is_dir()
