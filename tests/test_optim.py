"""Parameter groups: layer-wise lr decay, no-decay set, freezing, full coverage."""
import pytest
import torch
from torch import nn
from transformers import BertConfig, BertModel

from kit.train.optim import parameter_groups

LR, WD, DECAY, L = 1e-3, 0.01, 0.5, 2


class Wrapped(nn.Module):
    """The lead's layout: a `backbone` plus heads outside it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=L,
                                             num_attention_heads=4, intermediate_size=64))
        self.head = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 3))


def by_name(model):
    return {id(p): n for n, p in model.named_parameters()}


def test_layerwise_lrs_and_no_decay_set():
    model = Wrapped()
    groups = parameter_groups(model, LR, WD, layer_decay=DECAY)
    names = by_name(model)
    for group in groups:
        for p in group["params"]:
            name = names[id(p)]
            if name.startswith("backbone.embeddings."):
                want_lr = LR * DECAY ** (L + 1)
            elif name.startswith("backbone.encoder.layer."):
                i = int(name.split(".")[3])
                want_lr = LR * DECAY ** (L - i)
            else:                                                  # pooler and head
                want_lr = LR
            assert group["lr"] == pytest.approx(want_lr), name
            no_decay = name.endswith("bias") or "LayerNorm" in name or name == "head.2.weight"
            assert group["weight_decay"] == (0.0 if no_decay else WD), name
    parts = ("embeddings", "layer0", "layer1", "top")
    assert [g["name"] for g in groups] == [f"{p}/{k}" for p in parts for k in ("no_decay", "decay")]
    torch.optim.AdamW(groups)                                      # accepted as is


def test_every_trainable_parameter_exactly_once():
    model = Wrapped()
    model.head[0].bias.requires_grad_(False)                       # caller's own freezing is kept
    ids = [id(p) for g in parameter_groups(model, LR, WD, DECAY) for p in g["params"]]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters() if p.requires_grad}
    assert id(model.head[0].bias) not in ids


@pytest.mark.parametrize("n_frozen, frozen_prefixes", [
    (0, ()),
    (1, ("backbone.embeddings.",)),
    (2, ("backbone.embeddings.", "backbone.encoder.layer.0.")),
    (L + 1, ("backbone.embeddings.", "backbone.encoder.")),
])
def test_freezing_lowest_modules(n_frozen, frozen_prefixes):
    model = Wrapped()
    groups = parameter_groups(model, LR, WD, freeze_layers=n_frozen)
    in_groups = {id(p) for g in groups for p in g["params"]}
    for name, p in model.named_parameters():
        frozen = name.startswith(frozen_prefixes) if frozen_prefixes else False
        assert p.requires_grad is not frozen, name
        assert (id(p) in in_groups) is not frozen, name
    assert model.backbone.pooler.dense.weight.requires_grad


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"freeze_layers must be in 0\.\.3"):
        parameter_groups(Wrapped(), LR, WD, freeze_layers=L + 2)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="layer_decay"):
            parameter_groups(Wrapped(), LR, WD, layer_decay=bad)
    with pytest.raises(ValueError, match="backbone"):
        parameter_groups(nn.Linear(2, 2), LR, WD)


# --------------------------------------------------------------------------- every family

class _Ids:
    """Token ids a zoo config needs, without training a tokenizer."""
    pad_token_id, bos_token_id, eos_token_id, cls_token_id, sep_token_id = 0, 1, 2, 1, 2

    def __len__(self):
        return 100


class WrappedFamily(nn.Module):
    def __init__(self, family):
        super().__init__()
        from transformers import AutoModel

        from kit.models.zoo import FAMILIES
        torch.manual_seed(0)
        self.backbone = AutoModel.from_config(FAMILIES[family].config(_Ids()))
        self.head = nn.Linear(32, 2)


# family: (layer stack path, input-side prefixes (depth 0), top-side backbone prefixes)
FAMILY_LAYOUT = {
    "bert": ("encoder.layer", ("embeddings.",), ("pooler.",)),
    "roberta": ("encoder.layer", ("embeddings.",), ("pooler.",)),
    "xlm-roberta": ("encoder.layer", ("embeddings.",), ("pooler.",)),
    "electra": ("encoder.layer", ("embeddings.", "embeddings_project."), ()),
    "distilbert": ("transformer.layer", ("embeddings.",), ()),
    "deberta-v3": ("encoder.layer", ("embeddings.", "encoder.rel_embeddings.",
                                     "encoder.LayerNorm."), ()),
    "deberta-v2": ("encoder.layer", ("embeddings.", "encoder.rel_embeddings.",
                                     "encoder.LayerNorm.", "encoder.conv."), ()),
    "modernbert": ("layers", ("embeddings.",), ("final_norm.",)),
}


@pytest.mark.parametrize("family", sorted(FAMILY_LAYOUT))
def test_layerwise_lrs_every_family(family):
    stack, bottom, top = FAMILY_LAYOUT[family]
    model = WrappedFamily(family)
    lr_of = {id(p): g["lr"] for g in parameter_groups(model, LR, WD, layer_decay=DECAY)
             for p in g["params"]}
    seen = set()
    for name, p in model.backbone.named_parameters():
        if name.startswith(stack + "."):
            i = int(name[len(stack) + 1:].split(".")[0])
            want, where = LR * DECAY ** (L - i), f"layer{i}"
        elif name.startswith(bottom):
            want, where = LR * DECAY ** (L + 1), "bottom"
        else:
            assert name.startswith(top), f"{family}: {name} is in no expected part"
            want, where = LR, "top"
        assert lr_of[id(p)] == pytest.approx(want), f"{family}: {name}"
        seen.add(where)
    assert {"bottom", "layer0", f"layer{L - 1}"} <= seen
    assert lr_of[id(model.head.weight)] == LR


@pytest.mark.parametrize("family", sorted(FAMILY_LAYOUT))
def test_freezing_every_family(family):
    stack, bottom, _ = FAMILY_LAYOUT[family]
    model = WrappedFamily(family)
    parameter_groups(model, LR, WD, freeze_layers=2)          # input side + layer 0
    for name, p in model.backbone.named_parameters():
        frozen = name.startswith(bottom) or name.startswith(f"{stack}.0.")
        assert p.requires_grad is not frozen, f"{family}: {name}"


class NoStack(nn.Module):
    """A backbone whose blocks are not in an nn.ModuleList."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4))
        self.head = nn.Linear(4, 2)


def test_backbone_without_layer_stack_trains_with_one_lr():
    model = NoStack()
    groups = parameter_groups(model, LR, WD)
    assert {g["name"] for g in groups} == {"top/decay", "top/no_decay"}
    assert all(g["lr"] == LR for g in groups)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    for kwargs in ({"layer_decay": 0.9}, {"freeze_layers": 1}):
        with pytest.raises(ValueError, match="Sequential: no layer stack found"):
            parameter_groups(NoStack(), LR, WD, **kwargs)


def test_a_checkpoint_of_the_per_layer_groups_is_refused_in_one_line(tmp_path, monkeypatch,
                                                                      one_thread):
    """A run killed after epoch 0 by a kit that kept one group per depth (merged_groups taken
    away), resumed by this kit's 2 merged groups: one CheckpointError naming the checkpoint
    folder and both ways on, not torch's ValueError read as a corrupt checkpoint."""
    from kit.runs import checkpoint_dir, run_dir_of
    from kit.train import loop
    from kit.train.finetune import fit
    from kit.train.checkpoint_hardware import CheckpointError
    from tests.test_faults import killed_after_epoch_0
    monkeypatch.setattr(loop, "merged_groups", lambda groups: groups)    # the older kit
    cfg = killed_after_epoch_0(tmp_path, monkeypatch)                    # (undoes both)
    folder = checkpoint_dir(run_dir_of(cfg))
    with pytest.raises(CheckpointError) as err:
        fit(cfg)
    assert str(err.value) == (
        f"{folder} was written by another version of the kit: its optimizer state has 8 "
        "parameter group(s), this kit's optimizer 2 (kit.train.optim merges the groups of equal "
        "settings, which older kits kept one per layer): finish the run with the kit version "
        "that started it, or delete that folder to restart the run from scratch")
