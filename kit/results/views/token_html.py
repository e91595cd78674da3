"""SSA on the tokens: a few sentences as HTML, each word-piece coloured by what SSA makes of it,
for a notebook (`show_tokens(run_dir)`) and the report (`report_section`, kit.results.report.page).

Three views (`by`):
    labels       the SSA labels the run saved (save_labels: true, read through kit.runs): 1
                 important, 0 not, or not labelled, on the training rows the probe labelled
    p_important  the token head's P(important) from the best checkpoint (SSA-Co, SSA-H)
    attention    the last layer's [CLS] attention from the best checkpoint (every method),
                 scaled to each sentence's largest weight
`auto` picks labels when the run saved some, else P(important) for a run with a token head,
else attention. The checkpoint views read kit.results.figures.model_scores.token_scores on the first
dev sentences (or sentences of your own). On the synthetic task the true cue words (the Examples'
`importance`, kit.data.synthetic) are underlined; each sentence shows its label and prediction.

The HTML has inline styles only (no <style>, no script, nothing fetched), dark text on light
backgrounds whatever the notebook's theme, so a notebook and the report page show the same.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup

from kit import methods, runs
from kit.config.tasks import Split, get_task
from kit.data.pipeline import encode
from kit.models.backbones import load_tokenizer
from kit.results.views.model_view import dev_sample
from kit.results.figures.model_scores import token_scores
from kit.results.figures.token_view import label_name

VIEWS = {"labels": "SSA label", "p_important": "P(important), the token head",
         "attention": "[CLS] attention, last layer (scaled to the sentence's largest)"}
LABEL_COLOURS = {1: "#fd8d3c", 0: "#9ecae1"}     # important / not; not labelled: white
SCALE_COLOURS = {"p_important": "#e6550d", "attention": "#3182bd"}   # value 1; value 0: white
TIPS = {"p_important": "P(important)", "attention": "attention / the sentence's largest"}
TEXT, FAINT, CUE = "#111111", "#666666", "3px solid #000000"
REPORT_SENTENCES, REPORT_RUNS = 3, 6
BOX = ("font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:14px;line-height:1.9;"
       "background:#ffffff;color:#111111;padding:8px 10px;margin:6px 0;"
       "border:1px solid #dddddd;border-radius:4px")
CELL = "text-align:left;vertical-align:top;padding:2px 10px 2px 0;border:none;color:#111111"
STYLES = {"BOX": BOX, "CELL": CELL, "TEXT": TEXT, "FAINT": FAINT, "CUE": CUE}
# kit/results/templates/kit_tokens.html.j2's macros (view, note, section), autoescaped
TOKENS = jinja2.Environment(loader=jinja2.PackageLoader("kit.results"),
                            autoescape=True).get_template("kit_tokens.html.j2").module


@dataclass
class TokenView:
    """Sentences and their word-pieces (`frame`: one row per word-piece) in one view (`by`);
    shows itself as HTML in a notebook, `.html` is the same string for a page. `note`: why
    there is nothing to show (then `frame` is empty)."""
    frame: pd.DataFrame
    by: str
    title: str
    note: str = ""

    @property
    def html(self) -> str:
        if self.note:
            return str(TOKENS.note(STYLES, self.note))
        return render(self.frame, self.by, self.title)

    def _repr_html_(self) -> str:
        return self.html


def show_tokens(run_dir: str | os.PathLike, n: int = 6, by: str = "auto",
                sentences=None, epoch: int | None = None) -> TokenView:
    """The view a notebook shows of a run: `n` sentences by `by` (see the module docstring);
    `sentences` (strings, or [a, b] pairs) instead of the dev set's first rows (checkpoint
    views only); `epoch`: which saved SSA epoch the labels view shows (default: the last).
    `auto` on a run with neither saved labels nor a best checkpoint shows a line saying so (a
    notebook cell of any run goes on); a view asked for by name that cannot be made raises."""
    run_dir = Path(run_dir)
    asked = by
    by = pick_view(run_dir, by, own_sentences=sentences is not None)
    if asked == "auto" and by != "labels" and runs.best_checkpoint(run_dir) is None:
        return TokenView(pd.DataFrame(), by, run_dir.name, note=(
            f"{run_dir.name}: no token view: the run kept no checkpoint (save_checkpoints: "
            "false) and saved no SSA labels (save_labels: true, SSA methods)"))
    if by == "labels":
        if sentences is not None:
            raise ValueError("show_tokens: SSA labels exist for the run's training rows only; "
                             "use by='p_important' or by='attention' for sentences of your own")
        return label_tokens(run_dir, n, epoch)
    return score_tokens(run_dir, n, by, sentences)


def pick_view(run_dir: Path, by: str = "auto", own_sentences: bool = False) -> str:
    """`by` itself when it names a view; for `auto`: labels when the run saved some (and no
    sentences of your own are given), else p_important for a method with a token head, else
    attention."""
    if by != "auto":
        if by not in VIEWS:
            raise ValueError(f"show_tokens: by={by!r}; choose auto, {', '.join(VIEWS)}")
        return by
    if not own_sentences and runs.saved_label_epochs(run_dir):
        return "labels"
    method = (runs.read_config(run_dir) or {}).get("method")
    return "p_important" if method in methods.REGISTRY and methods.get(method).token_head \
        else "attention"


# ---------------------------------------------------------------- the frames

def label_tokens(run_dir: Path, n: int = 6, epoch: int | None = None) -> TokenView:
    """The labels view: the first `n` rows of a saved SSA epoch (`epoch`, default the last;
    only that epoch's file is read) that the probe labelled (the paper rule: any token labelled;
    the code rule: its masked copies, whose masked tokens are 0), word-pieces from the run's
    tokenizer. SSA labels only sentences the probe (the model after the previous epoch)
    predicted correctly, so their prediction is their label."""
    config = runs.read_config(run_dir) or {}
    if epoch is None:
        epoch = (runs.saved_label_epochs(run_dir) or [None])[-1]
    blob = runs.read_saved_epoch(run_dir, epoch) if epoch is not None else None
    if blob is None:
        which = f" for epoch {epoch}" if epoch is not None else ""
        raise ValueError(f"{run_dir}: no saved SSA labels{which}: they exist for ssa-co / ssa-h "
                         "runs with save_labels: true, from ssa_start_epoch on")
    rows, stats = blob["epoch_set"], blob["stats"]
    code_rule = stats.get("rule") == "code"
    probed = [i for i, labels in enumerate(rows["ssa_labels"])
              if (labels == 0).any() or (not code_rule and (labels >= 0).any())][:n]
    tokenizer = run_tokenizer(run_dir, config)
    records = []
    for sid, row in enumerate(probed):
        special = rows["special"][row].astype(bool)
        labels = rows["ssa_labels"][row][~special]
        label = label_text(config, rows["labels"][row])
        importance = rows["importance"][row][~special] if rows["importance"] is not None else None
        tokens = tokenizer.convert_ids_to_tokens(rows["input_ids"][row][~special].tolist())
        records += _token_rows(sid, tokens, np.where(labels >= 0, labels, np.nan), importance,
                               _segments(special), label, f"{label} (probe)", np.nan)
    title = (f"{run_dir.name}: SSA labels of epoch {stats.get('epoch')} ({stats.get('rule')} "
             f"rule; probed by the model after epoch {stats.get('epoch', 0) - 1})")
    return TokenView(pd.DataFrame(records), "labels", title)


def score_tokens(run_dir: Path, n: int = 6, by: str = "p_important",
                 sentences=None) -> TokenView:
    """A checkpoint view (p_important or attention) of the dev set's first `n` sentences, or
    of `sentences` (no label, no cue marks), through model_scores.token_scores."""
    config = runs.read_config(run_dir) or {}
    task = _task(config)
    if sentences is None:
        split = dev_sample(config, n)[2]
    else:
        rows = [[s] if isinstance(s, str) else list(s) for s in sentences]
        split = Split([r[0] for r in rows], [r[1] for r in rows] if len(rows[0]) == 2 else None,
                      None, [str(i) for i in range(len(rows))], "sentences")
    texts = split.text_a if split.text_b is None else [list(p) for p in
                                                        zip(split.text_a, split.text_b)]
    max_length = int(config.get("max_length") or 128)
    scores = token_scores(run_dir, texts, max_length)
    if by == "p_important" and scores["p_important"].isna().all():
        raise ValueError(f"{run_dir}: a {config.get('method')} run has no token head, so no "
                         "P(important): show by='attention'")
    regression = task is None or task.regression
    encoded = encode(run_tokenizer(run_dir, config), split, max_length, regression)
    records = []
    for sid, sentence in scores.groupby("sentence_id", sort=True):
        special = encoded.special[sid].astype(bool)
        if len(sentence) != (~special).sum():
            raise ValueError(f"{run_dir}: sentence {sid} tokenizes differently from the "
                             "checkpoint's view")
        values = sentence[by].to_numpy(dtype=float)
        if by == "attention":
            values = values / max(values.max(), 1e-12)
        importance = (encoded.importance[sid][~special] if encoded.importance is not None
                      else None)
        label = label_text(config, split.labels[sid]) if split.labels is not None else ""
        first = sentence.iloc[0]
        records += _token_rows(sid, sentence["token"].tolist(), values, importance,
                               _segments(special), label, first["prediction"], first["confidence"])
    source = "your sentences" if sentences is not None else "the first dev sentences"
    title = f"{run_dir.name}: {VIEWS[by]}, best checkpoint, {source}"
    return TokenView(pd.DataFrame(records), by, title)


def _token_rows(sid, tokens, values, importance, segments, label, prediction, confidence):
    """One sentence's rows of a TokenView frame (byte-level BPE's and SentencePiece's word
    markers left out of the shown word-piece, as model_scores does)."""
    return [{"sentence_id": sid, "position": i, "value": float(values[i]),
             "token": str(t).replace("Ġ", "").replace("▁", ""),
             "cue": np.nan if importance is None else float(importance[i]),
             "segment": int(segments[i]), "label": label, "prediction": prediction,
             "confidence": float(confidence)} for i, t in enumerate(tokens)]


def _segments(special: np.ndarray) -> np.ndarray:
    """Per real word-piece, which text of a pair it is in (0 or 1): the special tokens before
    it, less the leading [CLS] / <s>."""
    return np.maximum(np.cumsum(special)[~special] - 1, 0)


def _task(config: dict):
    name = config.get("task", "csv")
    return None if str(name).lower() == "csv" else get_task(name)


def label_text(config: dict, value) -> str:
    """A gold label as the views show it (token_view.label_name) for the run of `config`."""
    return label_name(_task(config), value)


def run_tokenizer(run_dir: Path, config: dict):
    """The run's tokenizer: the best checkpoint's copy, else the model config.json names.
    Quietly: transformers warns that a kit-only checkpoint's model type (ssa-h's) is unknown
    to it, which says nothing about its tokenizer."""
    from transformers.utils import logging as hf_logging
    folder = runs.best_checkpoint(run_dir)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return load_tokenizer(str(folder) if folder is not None else config["model"],
                              local_only=True)
    finally:
        hf_logging.set_verbosity(level)


# ---------------------------------------------------------------- HTML

def colour(by: str, value: float) -> str:
    """The background of a word-piece: a label's colour (white when not labelled), or white
    blended towards the view's colour by `value` in [0, 1] (white for NaN)."""
    if by == "labels":
        return LABEL_COLOURS.get(int(value), "#ffffff") if not np.isnan(value) else "#ffffff"
    if np.isnan(value):
        return "#ffffff"
    full = SCALE_COLOURS[by]
    v = min(max(float(value), 0.0), 1.0)
    rgb = [round(255 + v * (int(full[i:i + 2], 16) - 255)) for i in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _tip(by: str, value: float, cue: float) -> str:
    shown = ("not labelled" if np.isnan(value) else f"label {int(value)}") if by == "labels" \
        else f"{TIPS[by]} {value:.3f}"
    return shown + ("; true cue word" if cue == 1 else "")


def _piece(row, by: str, pair: bool) -> dict:
    """A word-piece for the template: its colours, underline (a true cue word) and tooltip;
    `pair`: the second text of a pair starts here."""
    faint = by == "labels" and np.isnan(row.value)
    return {"token": row.token, "background": colour(by, row.value), "pair": pair,
            "colour": FAINT if faint else TEXT, "tip": _tip(by, row.value, row.cue),
            "border": CUE if row.cue == 1 else "3px solid transparent"}


def legend(by: str, cues: bool) -> list[tuple]:
    """What the colours (and the underline) mean: (background, text, underlined) swatches."""
    if by == "labels":
        items = [(LABEL_COLOURS[1], "1 important"), (LABEL_COLOURS[0], "0"),
                 ("#ffffff", "not labelled")]
    else:
        items = [(colour(by, v), f"{v:g}") for v in (0.0, 0.25, 0.5, 0.75, 1.0)]
    return [(*item, False) for item in items] + ([("#ffffff", "true cue word", True)]
                                                  if cues else [])


def render(frame: pd.DataFrame, by: str, title: str = "") -> str:
    """The sentences of `frame` (TokenView's) as one self-contained HTML block."""
    cues = "cue" in frame and bool(frame["cue"].notna().any())
    sentences = []
    for _, sentence in frame.groupby("sentence_id", sort=True):
        pieces, segment = [], 0
        for row in sentence.itertuples():
            pieces.append(_piece(row, by, pair=row.segment != segment))
            segment = row.segment
        first = sentence.iloc[0]
        confidence = first["confidence"]
        prediction = str(first["prediction"]) + (
            f" ({confidence:.2f})" if not pd.isna(confidence) else "")
        sentences.append({"pieces": pieces, "label": str(first["label"]),
                          "prediction": prediction})
    return str(TOKENS.view(STYLES, title, VIEWS[by], legend(by, cues), sentences))


def report_section(run_dirs, n: int = REPORT_SENTENCES, max_runs: int = REPORT_RUNS) -> str:
    """The report's token section: the labels view of the runs among `run_dirs` that saved SSA
    labels, the first run of each task x model x method, at most `max_runs`; "" when none
    saved any."""
    shown, views = set(), []
    for run_dir in map(Path, run_dirs):
        config = runs.read_config(run_dir) or {}
        key = tuple(str(config.get(k)) for k in ("task", "model", "method"))
        if key in shown or len(views) == max_runs or not runs.saved_label_epochs(run_dir):
            continue
        shown.add(key)
        views.append(label_tokens(run_dir, n).html)
    return str(TOKENS.section([Markup(view) for view in views])) if views else ""
