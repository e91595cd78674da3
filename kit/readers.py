"""Readers that turn GLUE TSV folders, the Hugging Face hub copy of GLUE and users' own CSV
files into `Split`s.

Every problem with the input raises `DataError` with one line that names the file (and the
line in it), says what is wrong and what to do, so that a user never has to read a pandas or
csv traceback to find a broken row.
"""
from __future__ import annotations

import codecs
import io
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pandas as pd

from kit.tasks import Split, Task


class DataError(ValueError):
    """Bad input data: the message is one line naming the file, the problem and the fix."""

    def __init__(self, message: str):
        # Messages quote values and third-party errors that may hold line breaks; a one-line
        # message stays readable in logs and in a CLI's one-line error report.
        super().__init__(" ".join(str(message).splitlines()))


_GLUE_HINT = ("pass glue_dir=/path/to/glue_data or set GLUE_DIR=/path/to/glue_data, "
              "the folder holding the <TASK>/ subfolders (CoLA/, SST-2/, MRPC/, ...)")


# --------------------------------------------------------------------------- file access

def _read_text(path: Path) -> str:
    """The whole file as text: it must exist, hold something and be UTF-8 (a BOM is dropped)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found; check the path")
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(f"{path}: the file is empty; re-download or re-export it")
    # MRPC train/dev (and Excel's "CSV UTF-8") start with a byte order mark; without this the
    # first header name would be "\ufeffQuality" and the label column would not be found.
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise DataError(f"{path}: line {line}: bytes are not valid UTF-8 ({err.reason} at byte "
                        f"{err.start}); re-save the file as UTF-8") from None


def _read_lines(path: Path) -> list[str]:
    """The file's lines. Only "\\n" ends a line: str.splitlines() would also split on
    \\x0b, \\x0c, \\x1c-\\x1e, \\x85 and \\u2028, and GLUE sentences do carry stray control
    characters (CoLA train has \\x08, STS-B train \\x12)."""
    lines = [line.removesuffix("\r") for line in _read_text(path).split("\n")]
    while lines and not lines[-1]:    # the final newline (absent in CoLA dev) or blank tail
        lines.pop()
    return lines


# --------------------------------------------------------------------------- targets

Where = Callable[[int], str]   # row index -> "file: line N", the prefix of a row's message


def _class_ids(values: Sequence[str], labels: Sequence[str], column: str,
               where: Where) -> np.ndarray:
    """Label strings -> int64 class ids in the order of `labels`."""
    index = {label: i for i, label in enumerate(labels)}
    ids = np.empty(len(values), dtype=np.int64)
    for i, value in enumerate(values):
        if value not in index:
            allowed = ", ".join(repr(label) for label in labels)
            raise DataError(f"{where(i)}: unknown label {value!r} in column {column!r}; allowed: "
                            f"{allowed}. Fix or remove that row")
        ids[i] = index[value]
    return ids


def _floats(values: Sequence[str], column: str, where: Where) -> np.ndarray:
    """Numeric strings -> float64, naming the first row that is not a number."""
    out = np.empty(len(values), dtype=np.float64)
    for i, value in enumerate(values):
        try:
            out[i] = float(value)
        except ValueError:
            raise DataError(f"{where(i)}: {value!r} in column {column!r} is not a number; fix or "
                            "remove that row") from None
    return out


def _check_targets(targets: np.ndarray, column: str, where: Where,
                   bounds: tuple[float, float] | None = None) -> np.ndarray:
    """Regression targets must be finite (and inside `bounds`): one NaN poisons the loss."""
    bad = ~np.isfinite(targets)
    if bounds is not None:
        bad |= (targets < bounds[0]) | (targets > bounds[1])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        wanted = ("a finite number" if bounds is None
                  else f"a number from {bounds[0]:g} to {bounds[1]:g}")
        raise DataError(f"{where(i)}: target {float(targets[i])} in column {column!r} is not "
                        f"{wanted}; fix or remove that row")
    return targets.astype(np.float32)


def _ids(header: Sequence[str], column: Callable[[str], list[str]], n: int) -> list[str]:
    """Row ids: GLUE's `index` (QQP: `id`) column where the file has one, else row numbers."""
    for name in ("index", "id"):
        if name in header:
            return column(name)
    return [str(i) for i in range(n)]


# --------------------------------------------------------------------------- GLUE TSV files

@dataclass(frozen=True)
class _Layout:
    """Where a GLUE task's TSV files keep their text and label (found by header name)."""
    text: tuple[str, ...]                    # header names of text_a (and text_b)
    label: str                               # header name of the label; test files lack it
    no_header: tuple[str, ...] | None = None  # column names of labelled files with no header


_LAYOUTS: dict[str, _Layout] = {
    # CoLA train/dev are the raw cola_public files: no header. Its test file has one.
    "CoLA": _Layout(("sentence",), "label",
                    no_header=("source", "label", "original_judgement", "sentence")),
    "SST-2": _Layout(("sentence",), "label"),
    "MRPC": _Layout(("#1 String", "#2 String"), "Quality"),
    "STS-B": _Layout(("sentence1", "sentence2"), "score"),
    "QQP": _Layout(("question1", "question2"), "is_duplicate"),
    "MNLI": _Layout(("sentence1", "sentence2"), "gold_label"),   # not label1..label5
    "QNLI": _Layout(("question", "sentence"), "label"),
    "RTE": _Layout(("sentence1", "sentence2"), "label"),
    "WNLI": _Layout(("sentence1", "sentence2"), "label"),
}

_STSB_RANGE = (0.0, 5.0)


def _splits_of(task: Task) -> tuple[str, ...]:
    return ("train", *task.dev_splits, *task.test_splits)


def _check_glue_split(task: Task, split: str) -> None:
    if task.kind != "glue" or task.name not in _LAYOUTS:
        raise DataError(f"task {task.name!r} is not a GLUE task; only the nine GLUE tasks are "
                        "read from GLUE folders or the hub")
    if split not in _splits_of(task):
        raise DataError(f"{task.name} has no split {split!r}; choose one of "
                        f"{', '.join(_splits_of(task))}")


def _glue_path(task: Task, split: str, glue_dir: str | Path) -> Path:
    """glue_dir/<TASK>/<split>.tsv, saying which level of that path is missing."""
    root = Path(glue_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"GLUE folder {root} does not exist; {_GLUE_HINT}")
    if not (root / task.name).is_dir():
        raise DataError(f"{root / task.name} does not exist (no {task.name}/ subfolder in "
                        f"{root}); {_GLUE_HINT}")
    path = root / task.name / f"{split}.tsv"
    if not path.is_file():
        raise DataError(f"{path} does not exist; {task.name} needs "
                        f"{', '.join(s + '.tsv' for s in _splits_of(task))}; {_GLUE_HINT}")
    return path


def _read_table(path: Path, header: list[str] | None) -> tuple[list[str], list[list[str]], Where]:
    """Header, rows split on tabs, and the line prefix for messages about row i.
    `header` is given for files that have none (CoLA train/dev)."""
    lines = _read_lines(path)
    first_line = 1
    if header is None:
        header, first_line, lines = lines[0].split("\t"), 2, lines[1:]
    if not lines:
        raise DataError(f"{path}: the file has a header but no rows; re-download it")

    def where(i: int) -> str:
        return f"{path}: line {first_line + i}"

    rows = [line.split("\t") for line in lines]
    for i, fields in enumerate(rows):
        if len(fields) != len(header):
            raise DataError(f"{where(i)}: expected {len(header)} tab-separated fields, got "
                            f"{len(fields)} (a stray tab or line break inside a field?); fix or "
                            "remove that line")
    return header, rows, where


def read_glue_split(task: Task, split: str, glue_dir: str | Path) -> Split:
    """Read `glue_dir/<TASK>/<split>.tsv` in the standard GLUE layout.

    Fields are split on tabs with no quoting (GLUE rows hold unbalanced `"`) and no NA
    conversion ("NA" and "null" are text). Test files have no label column: labels None.
    """
    _check_glue_split(task, split)
    path = _glue_path(task, split, glue_dir)
    layout = _LAYOUTS[task.name]
    is_test = split in task.test_splits
    fixed = list(layout.no_header) if layout.no_header and not is_test else None
    header, rows, where = _read_table(path, fixed)
    needed = [*layout.text, *([] if is_test else [layout.label])]
    missing = [name for name in needed if name not in header]
    if missing:
        raise DataError(f"{path}: header has no column {', '.join(map(repr, missing))}; the "
                        f"header is {header}. Is this the GLUE {task.name} {split} file?")

    def column(name: str) -> list[str]:
        k = header.index(name)
        return [fields[k] for fields in rows]

    labels = None
    if layout.label in header:
        values = column(layout.label)
        if task.regression:
            scores = _floats(values, layout.label, where)
            labels = _check_targets(scores, layout.label, where, _STSB_RANGE)
        else:
            labels = _class_ids(values, task.labels, layout.label, where)
    return Split(
        text_a=column(layout.text[0]),
        text_b=column(layout.text[1]) if len(layout.text) > 1 else None,
        labels=labels, ids=_ids(header, column, len(rows)), source=str(path))


# --------------------------------------------------------------------------- Hugging Face hub

_HUB_DATASET = "nyu-mll/glue"
_HUB_TEXT = {"mnli": ("premise", "hypothesis")}   # other configs use the GLUE column names


def _hub_split_name(split: str) -> str:
    """Ours -> hub: dev -> validation, dev_matched -> validation_matched; train/test as is."""
    return "validation" + split.removeprefix("dev") if split.startswith("dev") else split


def hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the hub cannot be used right now, or None. Checked before calling `datasets`,
    which otherwise retries for minutes before failing offline."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return f"{var}={os.environ[var]} is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout_s).close()
    except OSError as err:
        return f"cannot connect to {endpoint.hostname}:{port} ({err})"
    return None


def _hub_label_strings(task: Task, label_names: Sequence[str] | None) -> tuple[str, ...]:
    """Our label string for each hub class id.

    Where the hub's class names are our label strings (MNLI, QNLI, RTE) map by name: the hub
    orders MNLI entailment, neutral, contradiction. Elsewhere (CoLA, SST-2, MRPC, QQP, WNLI)
    the hub names the classes in words, but the GLUE files write the hub's class id itself.
    """
    if label_names and set(label_names) <= set(task.labels):
        return tuple(label_names)
    if task.labels == tuple(str(i) for i in range(len(task.labels))):
        return task.labels
    raise DataError(f"{task.name}: cannot match the hub's classes {list(label_names or [])} to "
                    f"the task's labels {list(task.labels)}; read the GLUE files instead: "
                    f"{_GLUE_HINT}")


def split_from_hub(task: Task, data: Mapping[str, Sequence], label_names: Sequence[str] | None,
                   source: str) -> Split:
    """Convert one hub split (a `datasets.Dataset` or a dict of columns) into a `Split`.

    `label_names` are the hub's class names in hub id order (`features["label"].names`);
    None for STS-B. The hub marks hidden test labels with -1: those give labels None.
    """
    columns = _HUB_TEXT.get(task.hub_config, task.text_columns)
    hub_labels = np.asarray(list(data["label"]))

    def where(i: int) -> str:
        return f"{source}: row {i}"

    labels = None
    if not (hub_labels == -1).all():
        if task.regression:
            labels = _check_targets(hub_labels.astype(np.float64), "label", where, _STSB_RANGE)
        else:
            table = np.array([task.labels.index(s) for s in _hub_label_strings(task, label_names)])
            bad = (hub_labels < 0) | (hub_labels >= len(table))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise DataError(f"{where(i)}: hub label id {hub_labels[i]} is outside 0.."
                                f"{len(table) - 1}; read the GLUE files instead: {_GLUE_HINT}")
            labels = table[hub_labels.astype(np.int64)]
    return Split(
        text_a=list(data[columns[0]]),
        text_b=list(data[columns[1]]) if len(columns) > 1 else None,
        labels=labels, ids=[str(i) for i in data["idx"]], source=source)


def read_hub_split(task: Task, split: str) -> Split:
    """Load one GLUE split from the hub's parquet copy (`nyu-mll/glue`); needs the network.

    Fails fast with a DataError when offline (HF_HUB_OFFLINE set or hub unreachable).
    """
    _check_glue_split(task, split)
    reason = hub_unreachable()
    if reason:
        raise DataError(f"the Hugging Face hub is unreachable ({reason}), so GLUE {task.name} "
                        f"cannot be downloaded; use a local copy of GLUE: {_GLUE_HINT}")
    from datasets import load_dataset   # heavy import, only once the hub is really used

    hub_split = _hub_split_name(split)
    source = f"hf://datasets/{_HUB_DATASET}/{task.hub_config}/{hub_split}"
    try:
        data = load_dataset(_HUB_DATASET, task.hub_config, split=hub_split)
    except Exception as err:  # network, auth, cache: whatever it is, say it in one line
        raise DataError(f"{source}: loading from the hub failed ({type(err).__name__}: {err}); "
                        f"use a local copy of GLUE: {_GLUE_HINT}") from err
    return split_from_hub(task, data, getattr(data.features["label"], "names", None), source)


# --------------------------------------------------------------------------- users' CSV files

def _csv_line(frame: pd.DataFrame, i: int) -> int:
    """Line in the file of data row i: after the header, plus the line breaks inside quoted
    cells of the rows before it. Only computed for error messages."""
    before = frame.iloc[:i]
    return 2 + i + int(sum(before[name].str.count("\n").sum() for name in frame.columns))


def _folds(column: pd.Series, where: Where) -> np.ndarray:
    """Fold ids as int64; "2" and "2.0" are both fold 2, "2.5" is an error."""
    folds = _floats(column.str.strip().tolist(), str(column.name), where)
    fractional = ~np.isfinite(folds) | (folds != np.round(folds))
    if fractional.any():
        i = int(np.flatnonzero(fractional)[0])
        raise DataError(f"{where(i)}: fold {column.iloc[i]!r} in column {column.name!r} is not "
                        "a whole number; fix that row")
    return folds.astype(np.int64)


def _csv_frame(path: Path, wanted: Sequence[str]) -> pd.DataFrame:
    """A user's CSV as strings (header row, commas, standard quoting), with the `wanted`
    columns present and at least one row."""
    # Trailing blank lines are editor noise; blank lines inside the file stay rows (with an
    # empty target, which is reported), so that row numbers keep matching file lines.
    text = _read_text(path).rstrip("\r\n") + "\n"
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False,
                            skip_blank_lines=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise DataError(f"{path}: not a readable CSV ({err}); check the separator (commas) and "
                        "that quotes are balanced") from None
    missing = [name for name in wanted if name not in frame.columns]
    if missing:
        raise DataError(f"{path}: no column {', '.join(map(repr, missing))}; the file has "
                        f"columns {list(frame.columns)}")
    if frame.empty:
        raise DataError(f"{path}: the file has a header but no rows")
    return frame


def read_csv_test(path: str | Path, text_columns: tuple[str, ...], id_column: str) -> Split:
    """A Kaggle-style test CSV: the training file's text columns and an id column (unique
    ids, kept as text, in file order: the order of submission.csv); no labels."""
    path = Path(path)
    if len(text_columns) not in (1, 2):
        raise DataError(f"{path}: give one or two text columns, not {list(text_columns)}")
    frame = _csv_frame(path, [*text_columns, id_column])
    ids = frame[id_column].str.strip()
    bad = np.flatnonzero((ids == "").to_numpy() | ids.duplicated().to_numpy())
    if len(bad):
        i = int(bad[0])
        what = "empty id" if ids.iloc[i] == "" else f"duplicate id {ids.iloc[i]!r}"
        raise DataError(f"{path}: line {_csv_line(frame, i)}: {what} in column {id_column!r}; "
                        "a submission needs one unique id per row")
    return Split(text_a=frame[text_columns[0]].tolist(),
                 text_b=frame[text_columns[1]].tolist() if len(text_columns) > 1 else None,
                 labels=None, ids=ids.tolist(), source=str(path))


def read_csv_split(path: str | Path, text_columns: tuple[str, ...], target: str,
                   regression: bool, fold_column: str | None = None,
                   labels: tuple[str, ...] | None = None,
                   ) -> tuple[Split, tuple[str, ...] | None]:
    """Read a user's CSV (header row, comma-separated, standard quoting).

    Classification: labels are `labels` or the sorted distinct target values; returned with
    the Split. Regression: float targets, returned labels None. `fold_column` -> Split.folds.
    Text is kept verbatim ("NA" stays text, empty cells are empty strings). Ids come from an
    `index` or `id` column when there is one, else row numbers.
    """
    path = Path(path)
    if len(text_columns) not in (1, 2):
        raise DataError(f"{path}: give one or two text columns, not {list(text_columns)}")
    frame = _csv_frame(path, [*text_columns, target, *([fold_column] if fold_column else [])])

    def where(i: int) -> str:
        return f"{path}: line {_csv_line(frame, i)}"

    # Targets are trimmed (hand-edited CSVs often have "pos, neg"); texts are kept verbatim.
    values = [value.strip() for value in frame[target]]
    empty = [i for i, value in enumerate(values) if not value]
    if empty:
        raise DataError(f"{where(empty[0])}: empty target in column {target!r}; fill it in or "
                        "remove that row")
    if regression:
        out_labels = None
        y = _check_targets(_floats(values, target, where), target, where)
    else:
        out_labels = tuple(labels) if labels else tuple(sorted(set(values)))
        y = _class_ids(values, out_labels, target, where)
    split = Split(
        text_a=frame[text_columns[0]].tolist(),
        text_b=frame[text_columns[1]].tolist() if len(text_columns) > 1 else None,
        labels=y, ids=_ids(frame.columns, lambda name: frame[name].tolist(), len(frame)),
        source=str(path), folds=_folds(frame[fold_column], where) if fold_column else None)
    return split, out_labels
