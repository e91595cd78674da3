"""Every encoder family through every single-task method, offline.

Tiny random encoders of each family (kit.models.zoo: hidden 32, 2 layers) with real tokenizers of each
kind built here - WordPiece (the embedded vocabulary), byte-level BPE and SentencePiece-style
Unigram trained on the project's GLUE text - saved as local Hugging Face folders, then run as a
user would: `RunConfig(model=<folder>)` -> kit.train.finetune.fit. One family (DeBERTa-v3: Unigram, no
SDPA, no pooler) also goes through papermill, like a profile's run.
"""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from kit.models import zoo
from kit.models.backbones import load_backbone
from kit.config.run_config import RunConfig
from kit.data.pipeline import encode
from kit.methods.bert_mask import masked_copies, ratio_masks, real_tokens
from kit.data.synthetic import generate
from kit.train.finetune import fit
from kit.runs import run_dir_of

REPO = Path(__file__).resolve().parents[1]
FAMILIES = sorted(zoo.FAMILIES)
# families whose model class has no SDPA path: transformers falls back to eager for them
EAGER_ONLY = {"deberta-v2", "deberta-v3"}
# a pooler (dense + tanh) in the base model: its output is the sentence representation
POOLER = {"bert", "roberta", "xlm-roberta"}


pytestmark = pytest.mark.usefixtures("one_thread")      # conftest.py


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    return zoo.build_zoo(tmp_path_factory.mktemp("zoo"))


def small(folder: Path, outputs: Path, **changes) -> RunConfig:
    """The grid's smallest useful run: 64 synthetic rows, one epoch, SSA from epoch 0."""
    params = dict(task="synthetic", model=str(folder), method="bert", synthetic_size=64,
                  epochs=1, max_length=32, batch_size=16, eval_batch_size=64, lr=1e-3,
                  ssa_start_epoch=0, save_checkpoints=False, outputs_dir=str(outputs))
    return RunConfig.from_dict({**params, **changes})


# --------------------------------------------------------------------------- folders

@pytest.mark.parametrize("family", FAMILIES)
def test_folder_loads_with_plain_transformers_and_the_kit(folders, family):
    from transformers import AutoModel, AutoTokenizer
    folder = folders[family]
    plain = AutoModel.from_pretrained(folder)
    backbone, tokenizer = load_backbone(str(folder))
    assert type(backbone) is type(plain)
    assert backbone.config._attn_implementation == ("eager" if family in EAGER_ONLY else "sdpa")
    assert load_backbone(str(folder), eager_attention=True)[0].config._attn_implementation == "eager"
    assert len(AutoTokenizer.from_pretrained(folder)) == len(tokenizer) == backbone.config.vocab_size
    ids = tokenizer("the movie was good")["input_ids"]
    assert tokenizer.unk_token_id not in ids              # the GLUE-trained vocab covers it


@pytest.mark.parametrize("family", FAMILIES)
def test_special_tokens_and_mask_token_of_each_tokenizer(folders, family):
    """Pairs get the family's own frame, the special-tokens mask marks exactly those
    positions, segment ids only where the tokenizer makes them, and SSA masking writes the
    tokenizer's own mask token on real tokens only."""
    _, tokenizer = load_backbone(str(folders[family]))
    split = generate(True, 8, "train")
    ex = encode(tokenizer, split, 32, regression=False)
    first = tokenizer.convert_ids_to_tokens(ex.input_ids[0].tolist())
    n_special = int(ex.special[0].sum())
    if tokenizer.cls_token == "<s>":        # RoBERTa / XLM-R: <s> A </s></s> B </s>
        assert first[0] == "<s>" and first[-1] == "</s>" and n_special == 4
        assert first.count("</s>") == 3 and ex.token_type_ids is None
    else:
        assert first[0] == "[CLS]" and first[-1] == "[SEP]" and n_special == 3
    assert [t for t, s in zip(first, ex.special[0]) if s] == [
        t for t in first if t in tokenizer.all_special_tokens]
    no_types = family in ("roberta", "xlm-roberta", "distilbert", "modernbert")
    assert (ex.token_type_ids is None) == no_types
    masks = ratio_masks(real_tokens(ex), 0.5, np.random.default_rng(0))
    copies = masked_copies(ex, masks, tokenizer.mask_token_id)
    for row in range(len(ex)):
        n = len(ex.input_ids[row])
        changed = copies.input_ids[row] != ex.input_ids[row]
        assert (copies.input_ids[row][changed] == tokenizer.mask_token_id).all()
        assert not (changed & ex.special[row]).any() and changed.sum() == masks[row, :n].sum()
    # the synthetic task's importance lands on the two colour words of each pair
    for row, importance in enumerate(ex.importance):
        words = tokenizer.convert_ids_to_tokens(ex.input_ids[row][importance == 1].tolist())
        colours = [w for i, w in enumerate(split.text_a[row].split(" ") + split.text_b[row].split(" "))
                   if split.importance[row][i]]
        assert "".join(words).replace("Ġ", "").replace("▁", "").replace("#", "") == "".join(colours)


# --------------------------------------------------------------------------- family x method

METHODS = {   # name: RunConfig changes
    "bert-mask": {"method": "bert-mask"},
    "ssa-co": {"method": "ssa-co"},
    "ssa-h": {"method": "ssa-h"},
    "ssa-h-code-pair": {"method": "ssa-h", "label_rule": "code", "task": "synthetic-pair"},
    "bert-guided": {"guide_loss": "task+both", "layer_decay": 0.9, "freeze_layers": 1},
}


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", FAMILIES)
def test_family_x_method(folders, family, method, tmp_path):
    cfg = small(folders[family], tmp_path, **METHODS[method])
    metrics = fit(cfg)
    assert metrics["status"] == "ok" and metrics["best_epoch"] == 0
    assert 0 <= metrics["best_dev"]["score"] <= 1
    history = (run_dir_of(cfg) / "history.csv").read_text().splitlines()
    header = history[0].split(",")
    if method == "bert-mask":               # gamma 1 from epoch 0: every row plus one copy
        assert metrics["train_examples"] == 2 * 64
    elif method == "bert-guided":
        assert {"loss_pd", "loss_md"} <= set(header)
        assert metrics["train_examples"] == 64
    else:
        (stats,) = metrics["ssa_labels"]
        assert stats["probed"] == 64 and stats["rule"] == cfg.label_rule
        if cfg.label_rule == "paper":       # gamma 1: one variant per correctly predicted row
            assert stats["variants"] == stats["kept"]
            assert stats["labelled_tokens"] > 0 or stats["kept"] == 0
        assert "loss_ssa" in header
    for row in history[1:]:
        assert all(np.isfinite(float(v)) for v in row.split(",")[1:] if v)


@pytest.mark.parametrize("family", FAMILIES)
def test_pairs_test_predictions_and_resume(folders, family, tmp_path):
    """A real GLUE pair task (WNLI, from the project's data) with test predictions; then the
    run is resumed from its last checkpoint (metrics.json removed as by a kill after the last
    epoch) and gives the same results, test predictions included."""
    cfg = small(folders[family], tmp_path, task="WNLI", max_train_examples=32,
                glue_dir=str(REPO / "data" / "glue"), predict_test=True, save_checkpoints=True)
    first = fit(cfg)
    run = run_dir_of(cfg)
    test = (run / "predictions" / "test.tsv").read_text()
    assert len(test.splitlines()) == 1 + 146 and first["resumed_after_epoch"] is None
    (run / "metrics.json").unlink()
    (run / "predictions" / "test.tsv").unlink()
    again = fit(cfg)
    assert again["resumed_after_epoch"] == 0 and again["best_dev"] == first["best_dev"]
    assert (run / "predictions" / "test.tsv").read_text() == test


@pytest.mark.parametrize("family", FAMILIES)
def test_pooled_representation(folders, family):
    """The pooler where the family has one, else the first token (docs/ssa.md)."""
    from kit.methods.bert import HeadSpec, SequenceModel
    backbone, tokenizer = load_backbone(str(folders[family]))
    model = SequenceModel(backbone, HeadSpec(num_labels=2)).eval()
    enc = tokenizer(["a good movie", "bad"], padding=True, return_tensors="pt")
    out = backbone(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    has_pooler = getattr(out, "pooler_output", None) is not None
    assert has_pooler == (family in POOLER)
    want = out.pooler_output if has_pooler else out.last_hidden_state[:, 0]
    special = torch.zeros_like(enc["input_ids"], dtype=torch.bool)
    with torch.no_grad():
        got = model(enc["input_ids"], enc["attention_mask"], special)["logits"]
        torch.testing.assert_close(got, model.classifier(want))


# --------------------------------------------------------------------------- papermill

def test_one_family_through_papermill(folders, tmp_path, run_notebook):
    """The finetune notebook as a profile runs it, on DeBERTa-v3 (eager-only, Unigram)."""
    cfg = small(folders["deberta-v3"], tmp_path / "out", method="ssa-h")
    default = RunConfig().to_dict()          # papermill injects literals: the changed fields
    params = {k: v for k, v in cfg.to_dict().items() if v != default[k]}
    run_notebook(REPO / "notebooks" / "finetune.ipynb", tmp_path / "nb.ipynb", **params)
    metrics = json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    assert metrics["status"] == "ok" and metrics["model"] == str(folders["deberta-v3"])


# --------------------------------------------------------------------------- multi-task

MULTITASK_OK = {"bert", "roberta", "xlm-roberta", "electra"}   # encoder.layer[i].attention.self


@pytest.mark.parametrize("family", FAMILIES)
def test_multitask_models_build_or_say_why_in_one_line(folders, family):
    """EmBERT / Gated-BERT hook BERT-style self-attention (query/key/value Linear layers):
    families with that layout run; the others stop with one line naming the encoder."""
    from kit.models.backbones import ModelError
    from kit.methods.embert import MultiTaskModel, MultiTaskSpec
    backbone, tokenizer = load_backbone(str(folders[family]))
    spec = MultiTaskSpec(["RTE", "CoLA"], [2, 2], [False, False], "gated")
    if family not in MULTITASK_OK:
        with pytest.raises(ModelError, match=rf"^{type(backbone).__name__}: embert/gated need a "
                                             r"BERT-style encoder \(encoder\.layer\[i\][^\n]*$"):
            MultiTaskModel(backbone, spec)
        return
    model = MultiTaskModel(backbone, spec).eval()
    enc = tokenizer(["a good movie", "bad"], ["fine", "it was"], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(enc["input_ids"], enc["attention_mask"],
                    token_type_ids=enc.get("token_type_ids"), task=1)
    assert out["logits"].shape == (2, 2)


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
def test_multitask_fit_runs_or_records_the_one_line_error(folders, family, tmp_path):
    """Gated-BERT on RTE + WNLI pairs: trains on RoBERTa (byte-level BPE, no token_type_ids);
    on DistilBERT the run stops before training and metrics.json holds the one line."""
    from kit.models.backbones import ModelError
    cfg = RunConfig.from_dict(dict(
        task="multitask", tasks=("RTE", "WNLI"), method="gated", model=str(folders[family]),
        max_train_examples=32, epochs=1, max_length=32, batch_size=16, save_checkpoints=False,
        glue_dir=str(REPO / "data" / "glue"), outputs_dir=str(tmp_path)))
    if family in MULTITASK_OK:
        metrics = fit(cfg)
        assert metrics["status"] == "ok" and {"RTE/score", "WNLI/score"} <= set(metrics["best_dev"])
        return
    with pytest.raises(ModelError):
        fit(cfg)
    record = json.loads((run_dir_of(cfg) / "metrics.json").read_text())
    assert record["status"] == "failed" and record["error"] == (
        "ModelError: DistilBertModel: embert/gated need a BERT-style encoder "
        "(encoder.layer[i].attention.self.query/key/value)")
