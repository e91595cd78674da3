"""Users' own CSV files (Kaggle style): a training CSV with a target and optional fold column,
and a test CSV with an id column, read as text with one-line DataErrors naming the file line."""
from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kit.data.readers import DataError, Where, check_targets, class_ids, floats, read_text, row_ids
from kit.config.tasks import Split


def _csv_line(frame: pd.DataFrame, i: int) -> int:
    """Line in the file of data row i: after the header, plus the line breaks inside quoted
    cells of the rows before it. Only computed for error messages."""
    before = frame.iloc[:i]
    return 2 + i + int(sum(before[name].str.count("\n").sum() for name in frame.columns))


def _folds(column: pd.Series, where: Where) -> np.ndarray:
    """Fold ids as int64; "2" and "2.0" are both fold 2, "2.5" is an error."""
    folds = floats(column.str.strip().tolist(), str(column.name), where)
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
    text = read_text(path).rstrip("\r\n") + "\n"
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


def _text_frame(path: Path, text_columns: tuple[str, ...], *more: str) -> pd.DataFrame:
    """_csv_frame with one or two text columns (a sentence or a pair) and the `more` columns."""
    if len(text_columns) not in (1, 2):
        raise DataError(f"{path}: give one or two text columns, not {list(text_columns)}")
    return _csv_frame(path, [*text_columns, *more])


def _texts(frame: pd.DataFrame, text_columns: tuple[str, ...]) -> dict:
    """A Split's text_a and text_b (None for single sentences), verbatim."""
    return {"text_a": frame[text_columns[0]].tolist(),
            "text_b": frame[text_columns[1]].tolist() if len(text_columns) > 1 else None}


def _row_ids(frame: pd.DataFrame) -> list:
    """Ids from an `index` or `id` column when there is one, else row numbers (readers.row_ids)."""
    return row_ids(frame.columns, lambda name: frame[name].tolist(), len(frame))


def read_csv_test(path: str | Path, text_columns: tuple[str, ...], id_column: str) -> Split:
    """A Kaggle-style test CSV: the training file's text columns and an id column (unique
    ids, kept as text, in file order: the order of submission.csv); no labels."""
    path = Path(path)
    frame = _text_frame(path, text_columns, id_column)
    ids = frame[id_column].str.strip()
    bad = np.flatnonzero((ids == "").to_numpy() | ids.duplicated().to_numpy())
    if len(bad):
        i = int(bad[0])
        what = "empty id" if ids.iloc[i] == "" else f"duplicate id {ids.iloc[i]!r}"
        raise DataError(f"{path}: line {_csv_line(frame, i)}: {what} in column {id_column!r}; "
                        "a submission needs one unique id per row")
    return Split(**_texts(frame, text_columns), labels=None, ids=ids.tolist(), source=str(path))


def read_csv_text(path: str | Path, text_columns: tuple[str, ...]) -> Split:
    """A CSV's text columns only (no target, labels None): text for masked-LM pretraining.
    Ids as read_csv_split gives them."""
    path = Path(path)
    frame = _text_frame(path, text_columns)
    return Split(**_texts(frame, text_columns), labels=None, ids=_row_ids(frame),
                 source=str(path))


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
    frame = _text_frame(path, text_columns, target, *([fold_column] if fold_column else []))

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
        y = check_targets(floats(values, target, where), target, where)
    else:
        out_labels = tuple(labels) if labels else tuple(sorted(set(values)))
        y = class_ids(values, out_labels, target, where)
    split = Split(**_texts(frame, text_columns), labels=y, ids=_row_ids(frame), source=str(path),
                  folds=_folds(frame[fold_column], where) if fold_column else None)
    return split, out_labels
