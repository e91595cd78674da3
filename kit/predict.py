"""Predict with a finished run: `predict(run_dir, texts_or_pairs)` and the command line.

    python -m kit.predict RUN_DIR INPUT.csv --out preds.csv [--text-columns a,b] [--batch-size N]

The run's `checkpoint/best` is loaded with kit.methods.bert.load_trained (every single-task method,
ssa-h included, every encoder family); texts are tokenized and batched the way the run evaluated its
dev set (kit.data.pipeline: encode, longest batches first, each padded to its own longest row), and
the rows come back in input order: the class name and one probability column per class, or the score
for a regression task.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kit import io as kio
from kit import runs
from kit.models.backbones import ModelError
from kit.data.pipeline import encode
from kit.models.model_io import SPEC
from kit.methods.bert import SequenceModel, load_trained
from kit.data.readers import DataError
from kit.config.tasks import Split, get_task
from kit.train.step import predict_logits

DEFAULT_BATCH_SIZE = 64


def checkpoint_folder(run_dir: str | Path) -> Path:
    """`run_dir/checkpoint/best`, or one line saying why there is none."""
    run_dir = Path(run_dir)
    if not runs.config_path(run_dir).is_file():
        raise ModelError(f"{run_dir}: not a run folder (it has no config.json)")
    folder = runs.checkpoint_dir(run_dir) / "best"
    if not (folder / SPEC).is_file():
        raise ModelError(f"{run_dir}: this run kept no checkpoint: rerun with "
                         "save_checkpoints: true")
    if "tasks" in json.loads((folder / SPEC).read_text()):
        raise ModelError(f"{run_dir}: a multi-task run; kit.predict takes single-task runs "
                         "(load this one with kit.methods.embert.load_multitask)")
    return folder


def run_text_columns(run_dir: str | Path) -> tuple[str, ...]:
    """The text columns of the run's task: csv_text_columns for a CSV run, else the task's."""
    config = runs.read_config(run_dir)
    if config["task"].lower() == "csv":
        columns = config["csv_text_columns"]
        return (columns,) if isinstance(columns, str) else tuple(columns)
    return get_task(config["task"]).text_columns


def as_split(texts_or_pairs, pair: bool) -> Split:
    """A Split (no labels) from sentences or (a, b) pairs; one line when the shape does not fit
    the run's task."""
    rows = list(texts_or_pairs)
    if not rows:
        raise DataError("nothing to predict: the list of texts is empty")
    is_pair = [not isinstance(r, str) for r in rows]
    if any(is_pair) != all(is_pair) or any(is_pair) and any(len(r) != 2 for r in rows):
        raise DataError("give either sentences (str) or sentence pairs ((a, b)), not a mix")
    if pair != is_pair[0]:
        want = "(a, b) sentence pairs" if pair else "single sentences"
        raise DataError(f"this run's task takes {want}")
    text_a = [r[0] if pair else r for r in rows]
    text_b = [r[1] for r in rows] if pair else None
    return Split(text_a, text_b, None, [str(i) for i in range(len(rows))], "kit.predict input")


def logits_of(model: SequenceModel, tokenizer, split: Split,
              batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
    """Logits [rows, num_labels] in row order: the split encoded as the run encoded its dev
    set, through the kit's inference pass (kit.train.step.predict_logits) on the model's device."""
    examples = encode(tokenizer, split, model.spec.max_length, model.spec.num_labels == 1)
    return predict_logits(model, examples, batch_size, tokenizer.pad_token_id)


def as_frame(logits: np.ndarray, labels: list[str] | None) -> pd.DataFrame:
    """`prediction` (class name, or the score of a regression head) and, for classes,
    `prob_<name>` per class. Without stored names (checkpoints from before names were kept)
    the classes are called LABEL_i, as transformers does."""
    if logits.shape[1] == 1 and labels is None:
        return pd.DataFrame({"prediction": logits[:, 0].astype(float)})
    names = list(labels or [f"LABEL_{i}" for i in range(logits.shape[1])])
    probs = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()
    frame = pd.DataFrame({"prediction": [names[i] for i in logits.argmax(-1)]})
    for i, name in enumerate(names):
        frame[f"prob_{name}"] = probs[:, i].astype(float)
    return frame


def predict(run_dir: str | Path, texts_or_pairs, batch_size: int = DEFAULT_BATCH_SIZE,
            device: str | None = None) -> pd.DataFrame:
    """Predictions of a finished run's best checkpoint for sentences or (a, b) pairs, one row
    each in input order (see `as_frame`). `device`: cuda when there is one, else cpu."""
    folder = checkpoint_folder(run_dir)
    split = as_split(texts_or_pairs, pair=len(run_text_columns(run_dir)) == 2)
    model, tokenizer = load_trained(folder)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return as_frame(logits_of(model, tokenizer, split, batch_size), model.spec.labels)


def read_input(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """The input CSV as strings (empty cells stay empty strings); one line naming the file when
    it is missing or lacks a text column."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the file is empty; it needs a header row and one row per "
                        "text") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not a readable CSV ({str(err).splitlines()[0]})") from None
    for column in columns:
        if column not in frame.columns:
            raise DataError(f"{path}: no column {column!r}; the file has columns "
                            f"{list(frame.columns)} (choose them with --text-columns a,b)")
    return frame


def check_out(path: Path) -> None:
    """--out names a file whose folder exists: one line now, not an error after predicting."""
    if path.is_dir():
        raise DataError(f"--out {path} is a folder; name the CSV file to write, e.g. "
                        f"{path / 'predictions.csv'}")
    if not path.parent.is_dir():
        raise DataError(f"--out {path}: the folder {path.parent} does not exist")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.predict", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a finished run: outputs/runs/<run_id>")
    parser.add_argument("input", type=Path, help="CSV file holding the text column(s)")
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    parser.add_argument("--text-columns", default="",
                        help="comma-separated text column(s); default: the run's task columns")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()                 # "Loading weights" bars on stderr
    try:
        check_out(args.out)                       # before the model loads: a typo costs nothing
        checkpoint_folder(args.run_dir)
        columns = (tuple(c.strip() for c in args.text_columns.split(",") if c.strip())
                   or run_text_columns(args.run_dir))
        if len(columns) > 2:
            raise DataError(f"--text-columns: one column or two (a pair), got {len(columns)}")
        frame = read_input(args.input, columns)
        rows = (frame[columns[0]].tolist() if len(columns) == 1
                else list(zip(frame[columns[0]], frame[columns[1]])))
        preds = predict(args.run_dir, rows, batch_size=args.batch_size)
    except (ModelError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    kio.write_text(args.out, pd.concat([frame, preds], axis=1).to_csv(index=False))
    print(f"{len(preds)} predictions -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
