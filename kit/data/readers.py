"""The GLUE TSV reader, and what every reader shares (kit.data.hub reads the hub's copy of GLUE,
kit.data.csv_reader users' own CSV files): file checks, label / target parsers and DataError.

Every problem with the input raises `DataError` with one line that names the file (and the
line in it), says what is wrong and what to do, so that a user never has to read a pandas or
csv traceback to find a broken row.
"""
from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kit.config.tasks import Split, Task


class DataError(ValueError):
    """Bad input data: the message is one line naming the file, the problem and the fix."""

    def __init__(self, message: str):
        # Messages quote values and third-party errors that may hold line breaks; a one-line
        # message stays readable in logs and in a CLI's one-line error report.
        super().__init__(" ".join(str(message).splitlines()))


GLUE_HINT = ("pass glue_dir=/path/to/glue_data or set GLUE_DIR=/path/to/glue_data, "
             "the folder holding the <TASK>/ subfolders (CoLA/, SST-2/, MRPC/, ...)")


# --------------------------------------------------------------------------- file access

def read_text(path: Path) -> str:
    """The whole file as text: it must exist, hold something and be UTF-8 (a BOM is dropped)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found; check the path")
    raw = path.read_bytes()
    if not raw.strip():
        raise DataError(f"{path}: the file is empty; download or export it again")
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
    lines = [line.removesuffix("\r") for line in read_text(path).split("\n")]
    while lines and not lines[-1]:    # the final newline (absent in CoLA dev) or blank tail
        lines.pop()
    return lines


# --------------------------------------------------------------------------- targets

Where = Callable[[int], str]   # row index -> "file: line N", the prefix of a row's message


def class_ids(values: Sequence[str], labels: Sequence[str], column: str,
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


def floats(values: Sequence[str], column: str, where: Where) -> np.ndarray:
    """Numeric strings -> float64, naming the first row that is not a number."""
    out = np.empty(len(values), dtype=np.float64)
    for i, value in enumerate(values):
        try:
            out[i] = float(value)
        except ValueError:
            raise DataError(f"{where(i)}: {value!r} in column {column!r} is not a number; fix or "
                            "remove that row") from None
    return out


def check_targets(targets: np.ndarray, column: str, where: Where,
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


def row_ids(header: Sequence[str], column: Callable[[str], list[str]], n: int) -> list[str]:
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

STSB_RANGE = (0.0, 5.0)


def check_glue_split(task: Task, split: str) -> None:
    if task.kind != "glue" or task.name not in _LAYOUTS:
        raise DataError(f"task {task.name!r} is not a GLUE task; only the nine GLUE tasks are "
                        "read from GLUE folders or the hub")
    if split not in task.splits():
        raise DataError(f"{task.name} has no split {split!r}; choose one of "
                        f"{', '.join(task.splits())}")


class MissingTaskFiles(DataError):
    """A GLUE folder's <TASK>/ lacks files a run needs: the task is not there whole."""


def missing_files(root: Path, task: Task, test: bool = True) -> list[Path]:
    """The files of `task.splits(test)` that root/<TASK>/ lacks: absent, or not a file (a
    folder named train.tsv). Empty where the task is there whole."""
    return [path for split in task.splits(test)
            if not (path := root / task.name / f"{split}.tsv").is_file()]


def lacking(paths: Sequence[Path]) -> str:
    """`missing_files` (of one folder) in words: `/g/RTE/train.tsv (absent)`, or
    `/g/RTE/: train.tsv (absent), dev.tsv (not a file)`."""
    said = [f"{p.name} ({'not a file' if p.exists() else 'absent'})" for p in paths]
    return f"{paths[0].parent / said[0]}" if len(said) == 1 else (
        f"{paths[0].parent}/: {', '.join(said)}")


def _glue_path(task: Task, split: str, glue_dir: str | Path) -> Path:
    """glue_dir/<TASK>/<split>.tsv, saying which level of that path is missing."""
    root = Path(glue_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"GLUE folder {root} does not exist; {GLUE_HINT}")
    if not (root / task.name).is_dir():
        raise DataError(f"{root / task.name} does not exist (no {task.name}/ subfolder in "
                        f"{root}); {GLUE_HINT}")
    path = root / task.name / f"{split}.tsv"
    if not path.is_file():
        raise DataError(f"{path} does not exist; {task.name} needs "
                        f"{', '.join(s + '.tsv' for s in task.splits())}; {GLUE_HINT}")
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
    check_glue_split(task, split)
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
            scores = floats(values, layout.label, where)
            labels = check_targets(scores, layout.label, where, STSB_RANGE)
        else:
            labels = class_ids(values, task.labels, layout.label, where)
    return Split(
        text_a=column(layout.text[0]),
        text_b=column(layout.text[1]) if len(layout.text) > 1 else None,
        labels=labels, ids=row_ids(header, column, len(rows)), source=str(path))
