"""A trained run's view of single sentences, per word-piece: the last layer's [CLS] attention,
the SSA token head's P(important) and SSA-H's hybrid weights, with the sentence's prediction;
and the case study (Fig. 8) that puts a vanilla run and an SSA run side by side.

The only figure data that needs a model: it loads the runs' best checkpoints (kit.runs finds them,
kit.methods.bert loads them). torch and the model are imported inside `token_scores` only, so
kit.results.figures.plots imports this module without torch (its plots need numbers, not
models).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from kit import runs
from kit.config.tasks import get_task
from kit.results.figures.token_view import label_name

# The paper's two SST-2 case-study sentences (section 4.7), spelled as printed.
PAPER_SENTENCES = ("a whole lot foul, freaky and funny.",
                   "in its ragged, cheaps and unassuming way, the movie works.")


def token_scores(run_dir: str | os.PathLike, sentences: Sequence[str | Sequence[str]],
                 max_length: int = 128) -> pd.DataFrame:
    """Per sentence and real word-piece ([CLS]/[SEP]/padding left out), from a run's best
    checkpoint: `attention`, the last layer's attention from [CLS] averaged over heads and
    renormalised over the shown word-pieces (`attention_raw` before that); for SSA runs the
    token head's `p_important` = P(label 1), and for ssa-h the hybrid layer's `weight` w_i
    (NaN otherwise); the sentence's `prediction` (label name; the value for regression) and
    `confidence` (its probability). A sentence is a string, or a pair [a, b] for pair tasks."""
    import torch
    from kit.methods.bert import load_trained
    run_dir = Path(run_dir)
    config = runs.read_config(run_dir) or {}
    task = get_task(config["task"]) if config.get("task", "csv") != "csv" else None
    folder = runs.best_checkpoint(run_dir)
    if folder is None:
        raise ValueError(f"{run_dir}: the run kept no best checkpoint: rerun with "
                         "save_checkpoints: true")
    model, tokenizer = load_trained(folder, eager_attention=True)
    rows = []
    for sid, sentence in enumerate(sentences):
        pair = [sentence] if isinstance(sentence, str) else list(sentence)
        enc = tokenizer(*pair, return_tensors="pt", truncation=True, max_length=max_length,
                        return_special_tokens_mask=True)
        special = enc["special_tokens_mask"].bool()
        with torch.inference_mode():
            out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                        special_mask=special, token_type_ids=enc.get("token_type_ids"),
                        output_attentions=True)
        real = (enc["attention_mask"].bool() & ~special)[0]
        cls_attention = out["attentions"][-1][0].float().mean(0)[0][real]
        attention = cls_attention / cls_attention.sum().clamp_min(1e-12)
        nan = torch.full_like(attention, float("nan"))
        p_important = (torch.softmax(out["token_logits"][0].float(), -1)[:, 1][real]
                       if out["token_logits"] is not None else nan)
        weight = out["token_weights"][0].float()[real] if out["token_weights"] is not None else nan
        logits = out["logits"][0].float()
        if task is None or task.regression:
            prediction, confidence = f"{logits[0].item():.2f}", float("nan")
        else:
            probs = torch.softmax(logits, -1)
            k = int(probs.argmax())
            prediction = label_name(task, k)
            confidence = float(probs[k])
        tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][0][real].tolist())
        text = sentence if isinstance(sentence, str) else " ||| ".join(sentence)
        for position, token in enumerate(tokens):
            rows.append({"sentence_id": sid, "sentence": text, "position": position,
                         "token": token.replace("Ġ", "").replace("▁", ""),
                         "attention": float(attention[position]),
                         "attention_raw": float(cls_attention[position]),
                         "weight": float(weight[position]),
                         "p_important": float(p_important[position]),
                         "prediction": prediction, "confidence": confidence})
    return pd.DataFrame(rows)


def case_study_data(vanilla_dir: str | os.PathLike, ssa_dir: str | os.PathLike,
                    sentences: Sequence[str | Sequence[str]] = PAPER_SENTENCES,
                    max_length: int = 128) -> pd.DataFrame:
    """`token_scores` of a vanilla run and an SSA run side by side, one row per word-piece:
    sentence_id, sentence, position, token, vanilla_attention, ssa_attention, ssa_weight,
    ssa_p_important, vanilla_prediction, vanilla_confidence, ssa_prediction, ssa_confidence,
    then task, model, vanilla_seed, ssa_seed (from the runs' config.json, for the title).
    Both runs must share a tokenizer (the same backbone)."""
    vanilla = token_scores(vanilla_dir, sentences, max_length)
    ssa = token_scores(ssa_dir, sentences, max_length)
    keys = ["sentence_id", "sentence", "position", "token"]
    if not vanilla[keys].equals(ssa[keys]):
        raise ValueError("case study: the two runs tokenize differently (different backbones)")
    data = vanilla[keys].copy()
    for prefix, frame in (("vanilla", vanilla), ("ssa", ssa)):
        for column in ("attention", "weight", "p_important", "prediction", "confidence"):
            if prefix == "vanilla" and column in ("weight", "p_important"):
                continue
            data[f"{prefix}_{column}"] = frame[column].to_numpy()
    configs = [runs.read_config(d) or {} for d in (vanilla_dir, ssa_dir)]
    return data.assign(task=configs[0].get("task"), model=configs[0].get("model"),
                       vanilla_seed=configs[0].get("seed"), ssa_seed=configs[1].get("seed"))
