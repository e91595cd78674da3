"""Trained models outside the kit: checkpoints that plain transformers loads (with the trained
head and the label names) where the head is a transformers head, a clear refusal where it is not,
and kit.predict / `python -m kit.predict` on finished runs (tiny model, real RTE rows)."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from kit.models import zoo
from kit.models.backbones import ModelError, load_backbone
from kit.config.run_config import RunConfig
from kit.data.pipeline import glue_source
from kit.methods.bert import HeadSpec, SequenceModel, load_trained
from kit.models.model_io import save_model
from kit.methods.embert import MultiTaskModel, MultiTaskSpec, load_multitask
from kit.predict import as_frame, as_split, main, predict, logits_of, run_text_columns
from kit.data.readers import DataError, read_glue_split
from kit.data.synthetic import generate
from kit.config.tasks import get_task
from kit.train.finetune import fit
from kit.runs import run_dir_of

RUN = dict(model="tiny", epochs=1, lr=5e-3, batch_size=16, save_checkpoints=True)


def finished_run(tmp_path_factory, name: str, **params) -> Path:
    """The folder of a finished run of RUN updated with `params`."""
    cfg = RunConfig(**{**RUN, **params}, outputs_dir=str(tmp_path_factory.mktemp(name)))
    assert fit(cfg)["status"] == "ok"
    return run_dir_of(cfg)


@pytest.fixture(scope="module")
def rte_run(tmp_path_factory):
    """A finished bert run on real RTE (64 training rows; the full 277-row dev set)."""
    return finished_run(tmp_path_factory, "rte", task="RTE", method="bert",
                        max_train_examples=64)


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    """A bert run on the synthetic task that learns (both classes predicted, logits apart), in
    fp32 and in bf16 alike. With the task's default 5-11 distractor words the tiny random model
    sat at the majority class after 3 epochs on some seeds in either precision (fp32 seed 1; bf16
    seed 0: dev accuracy 0.553 = the majority), so whether it learned was the luck of the dropout
    stream; with 0-6 distractors seeds 0-2 learned in both (dev accuracy 0.59-0.99)."""
    return finished_run(tmp_path_factory, "bert", epochs=3, batch_size=8, task="synthetic",
                        method="bert", synthetic_size=600, synthetic_distractors=3)


@pytest.fixture(scope="module")
def ssa_h_run(tmp_path_factory):
    return finished_run(tmp_path_factory, "ssah", task="synthetic", method="ssa-h",
                        synthetic_size=200)


def rte_dev():
    return read_glue_split(get_task("RTE"), "dev", glue_source("", "RTE"))


def dev_predictions(run_dir) -> list[str]:
    return pd.read_csv(run_dir / "predictions" / "dev.tsv", sep="\t")["prediction"].tolist()


def hf_logits_one_by_one(hf, tokenizer, split) -> np.ndarray:
    """Plain transformers, one row at a time: no padding at all on this side."""
    with torch.inference_mode():
        return np.stack([hf(**tokenizer(a, *([] if split.text_b is None else [split.text_b[i]]),
                                        truncation=True, max_length=128,
                                        return_tensors="pt")).logits[0].numpy()
                         for i, a in enumerate(split.text_a)])


def test_plain_transformers_loads_a_bert_run_and_predicts_what_the_kit_predicts(bert_run):
    folder = bert_run / "checkpoint" / "best"
    dev = generate(False, 150, "dev", distractors=3)  # the run's dev set (synthetic_size // 4)
    model, tokenizer = load_trained(folder)
    kit_logits = logits_of(model, tokenizer, dev)
    hf = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert type(hf).__name__ == "BertForSequenceClassification"
    assert hf.config.id2label == {0: "negative", 1: "positive"}
    hf_logits = hf_logits_one_by_one(hf, tokenizer, dev)
    assert hf_logits.std(axis=0).min() > 1e-2         # a trained head: logits follow the text
    np.testing.assert_allclose(hf_logits, kit_logits, atol=1e-5)
    names = [hf.config.id2label[i] for i in hf_logits.argmax(-1)]
    assert names == dev_predictions(bert_run) and len(set(names)) == 2


def test_plain_transformers_on_a_real_rte_run_has_its_label_names(rte_run):
    folder = rte_run / "checkpoint" / "best"
    dev = rte_dev()
    model, tokenizer = load_trained(folder)
    hf = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert hf.config.id2label == {0: "entailment", 1: "not_entailment"}
    assert hf.config.label2id == {"entailment": 0, "not_entailment": 1}
    assert hf.config.problem_type == "single_label_classification" and hf.config.num_labels == 2
    hf_logits = hf_logits_one_by_one(hf, tokenizer, dev)
    np.testing.assert_allclose(hf_logits, logits_of(model, tokenizer, dev), atol=1e-5)
    assert [hf.config.id2label[i] for i in hf_logits.argmax(-1)] == dev_predictions(rte_run)


def test_kit_predict_on_pairs_gives_the_runs_dev_predictions(rte_run):
    dev = rte_dev()
    got = predict(rte_run, list(zip(dev.text_a, dev.text_b)), batch_size=7)
    assert got["prediction"].tolist() == dev_predictions(rte_run)
    assert list(got.columns) == ["prediction", "prob_entailment", "prob_not_entailment"]
    np.testing.assert_allclose(got[["prob_entailment", "prob_not_entailment"]].sum(axis=1), 1.0,
                               rtol=1e-6)
    with pytest.raises(DataError, match="takes \\(a, b\\) sentence pairs"):
        predict(rte_run, ["a single sentence"])


def test_kit_predict_on_sentences_of_an_ssa_h_run(ssa_h_run):
    dev = pd.read_csv(ssa_h_run / "predictions" / "dev.tsv", sep="\t")
    sentences = generate(False, len(dev), "dev").text_a
    got = predict(ssa_h_run, sentences)
    assert got["prediction"].tolist() == dev["prediction"].tolist()
    assert set(got["prediction"]) <= {"negative", "positive"}


def test_an_ssa_h_checkpoint_is_refused_by_plain_transformers(ssa_h_run):
    with pytest.raises(ValueError) as err:
        AutoModelForSequenceClassification.from_pretrained(ssa_h_run / "checkpoint" / "best")
    assert "ssa-kit ssa-h model" in str(err.value) and "kit.predict" in str(err.value)


def test_regression_head_config_and_logits(tmp_path):
    torch.manual_seed(0)
    backbone, tokenizer = load_backbone("tiny")
    model = SequenceModel(backbone, HeadSpec(num_labels=1, method="ssa-co")).eval()
    save_model(model, tokenizer, tmp_path)
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert hf.config.problem_type == "regression" and hf.config.num_labels == 1
    enc = tokenizer(["a cat sat", "two dogs ran far away"], padding=True, return_tensors="pt",
                    return_special_tokens_mask=True)
    special = enc.pop("special_tokens_mask").bool()
    with torch.inference_mode():
        ours = model(enc["input_ids"], enc["attention_mask"], special, enc["token_type_ids"])
        np.testing.assert_allclose(hf(**enc).logits.numpy(), ours["logits"].numpy(), atol=1e-6)
    split = as_split(["a cat sat", "two dogs ran far away"], pair=False)
    logits = logits_of(load_trained(tmp_path)[0], tokenizer, split)
    np.testing.assert_allclose(logits, ours["logits"].numpy(), atol=1e-6)
    frame = as_frame(logits, None)                      # a regression run's output: the scores
    assert list(frame.columns) == ["prediction"]
    assert frame["prediction"].tolist() == logits[:, 0].astype(float).tolist()


def test_text_columns_come_from_the_run(tmp_path):
    config = {"task": "csv", "csv_text_columns": ["excerpt"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert run_text_columns(tmp_path) == ("excerpt",)
    (tmp_path / "config.json").write_text(json.dumps({"task": "sts-b"}))
    assert run_text_columns(tmp_path) == ("sentence1", "sentence2")


def test_a_checkpoint_in_the_earlier_layout_still_loads(tmp_path):
    """Folders written before this layout (the encoder's save_pretrained names, every head in
    heads.safetensors) load with load_trained: runs killed before the upgrade still resume."""
    from safetensors.torch import save_file
    torch.manual_seed(0)
    backbone, tokenizer = load_backbone("tiny")
    model = SequenceModel(backbone, HeadSpec(num_labels=2, method="ssa-co")).eval()
    backbone.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()
               if not k.startswith("backbone.")}, str(tmp_path / "heads.safetensors"))
    (tmp_path / "head_spec.json").write_text(json.dumps(model.spec.__dict__))
    loaded = load_trained(tmp_path)[0].state_dict()
    assert all(torch.equal(v, loaded[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("family, loads", [("roberta", True), ("electra", False)])
def test_families_with_and_without_a_transformers_head(tmp_path, family, loads):
    """RoBERTa's classification head (dense + tanh on <s>, out_proj) is the kit's pooler +
    classifier; ELECTRA's head has a GELU layer the kit does not train: refused."""
    folder = zoo.build_family(family, tmp_path / family, lines=zoo.glue_lines(rows=30))
    backbone, tokenizer = load_backbone(str(folder))
    torch.manual_seed(0)
    model = SequenceModel(backbone, HeadSpec(num_labels=3, method="bert",
                                             labels=["a", "b", "c"])).eval()
    save_model(model, tokenizer, tmp_path / "ckpt")
    split = as_split(["a cat sat on the mat", "dogs"], pair=False)
    ours = logits_of(model, tokenizer, split)
    np.testing.assert_array_equal(logits_of(load_trained(tmp_path / "ckpt")[0], tokenizer,
                                                 split), ours)
    if not loads:
        with pytest.raises(ValueError, match="ssa-kit bert model"):
            AutoModelForSequenceClassification.from_pretrained(tmp_path / "ckpt")
        return
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "ckpt").eval()
    with torch.inference_mode():
        hf_logits = [hf(**tokenizer(t, return_tensors="pt")).logits[0].numpy()
                     for t in split.text_a]
    np.testing.assert_allclose(np.stack(hf_logits), ours, atol=1e-5)


def test_a_multitask_checkpoint_round_trips_and_is_refused_by_plain_transformers(tmp_path):
    torch.manual_seed(0)
    backbone, tokenizer = load_backbone("tiny")
    model = MultiTaskModel(backbone, MultiTaskSpec(["RTE", "STS-B"], [2, 1], [False, True],
                                                   "gated"))
    with torch.no_grad():
        for p in model.parameters():            # move the zero-initialised parts off zero
            p.add_(torch.randn_like(p) * 0.01)
    save_model(model, tokenizer, tmp_path / "run" / "checkpoint" / "best")
    loaded, _ = load_multitask(tmp_path / "run" / "checkpoint" / "best")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 loaded.state_dict().values()))
    with pytest.raises(ValueError, match="ssa-kit gated model"):
        AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "checkpoint" / "best")
    (tmp_path / "run" / "config.json").write_text(json.dumps({"task": "RTE", "tasks": ["RTE"]}))
    with pytest.raises(ModelError, match="a multi-task run; kit.predict takes single-task runs"):
        predict(tmp_path / "run", ["x"])


def test_cli_writes_the_csv_and_says_what_is_missing(rte_run, tmp_path, capsys):
    dev = rte_dev()
    source = pd.DataFrame({"id": dev.ids[:20], "sentence1": dev.text_a[:20],
                           "sentence2": dev.text_b[:20]})
    source.to_csv(tmp_path / "in.csv", index=False)
    assert main([str(rte_run), str(tmp_path / "in.csv"), "--out", str(tmp_path / "out.csv"),
                 "--batch-size", "4"]) == 0
    out = pd.read_csv(tmp_path / "out.csv", dtype={"id": str})
    assert out["id"].tolist() == dev.ids[:20]
    assert out["prediction"].tolist() == dev_predictions(rte_run)[:20]

    source.rename(columns={"sentence2": "hypothesis"}).to_csv(tmp_path / "bad.csv", index=False)
    assert main([str(rte_run), str(tmp_path / "bad.csv"), "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no column 'sentence2'" in err and "--text-columns" in err and "\n" not in err
    assert main([str(rte_run), str(tmp_path / "bad.csv"), "--out", str(tmp_path / "x.csv"),
                 "--text-columns", "sentence1,hypothesis"]) == 0

    bare = tmp_path / "bare"                      # a run that kept no checkpoint
    bare.mkdir()
    (bare / "config.json").write_text((rte_run / "config.json").read_text())
    assert main([str(bare), str(tmp_path / "in.csv"), "--out", str(tmp_path / "y.csv")]) == 2
    assert "kept no checkpoint: rerun with save_checkpoints: true" in capsys.readouterr().err
    with pytest.raises(ModelError, match="kept no checkpoint"):
        predict(bare, ["x"])
    assert json.loads((rte_run / "checkpoint" / "best" / "config.json").read_text())[
        "architectures"] == ["BertForSequenceClassification"]


@pytest.mark.parametrize("case", ["empty csv", "out is a folder", "out's folder missing"])
def test_bad_predict_inputs_are_one_line_before_any_prediction(rte_run, tmp_path, capsys, case):
    given = tmp_path / "in.csv"
    given.write_text("" if case == "empty csv" else "sentence1,sentence2\na,b\n")
    out = {"empty csv": tmp_path / "out.csv", "out is a folder": tmp_path,
           "out's folder missing": tmp_path / "no" / "out.csv"}[case]
    assert main([str(rte_run), str(given), "--out", str(out)]) == 2
    want = {"empty csv": f"{given}: the file is empty; it needs a header row and one row per text",
            "out is a folder": f"--out {tmp_path} is a folder; name the CSV file to write, e.g. "
                               f"{tmp_path / 'predictions.csv'}",
            "out's folder missing": f"--out {out}: the folder {out.parent} does not exist"}[case]
    assert capsys.readouterr().err == f"error: {want}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]     # nothing half-written
