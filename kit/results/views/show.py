"""How a notebook shows a table, its caption and the files it wrote: as a page reads, not as
Python's repr. The report (kit.results.report) renders the notebooks as they ran, so what a cell
shows here is what the report's reader sees: no `[PosixPath(...)]`, no 0, 1, 2 ... index
column, captions as sentences.

    table(frame)      -> a pandas Styler: no RangeIndex column, the caption (and notes) above it
    written(paths)    -> prints `Written to outputs/tables: demo-results.md, ...`
"""
from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import pandas as pd


def cell(value) -> str:
    """A table value as text, as the markdown tables show it: blank when missing, floats to 6
    significant digits (the report's main table uses it too)."""
    if not isinstance(value, (list, tuple, dict)) and pd.isna(value):
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def table(frame: pd.DataFrame, caption: str | None = None, empty: str = "(none)"):
    """`frame` to display: a Styler whose cells read as `cell` puts them, without the index
    when it is only row numbers, with `caption` (default: the table's own `attrs["notes"]` and
    `attrs["caption"]`) as sentences above it. An empty frame shows `empty` instead."""
    if frame.empty:
        return _Text(empty)
    if caption is None:
        caption = " ".join([*frame.attrs.get("notes", ()), frame.attrs.get("caption", "")])
    styler = frame.style.format(cell)
    if isinstance(frame.index, pd.RangeIndex):
        styler = styler.hide(axis="index")
    if caption.strip():
        styler = styler.set_caption(html.escape(caption.strip()))
        styler = styler.set_table_styles([{"selector": "caption",
                                           "props": "caption-side: top; text-align: left;"}])
    return styler


def written(paths: Sequence[Path]) -> None:
    """One line naming the files a cell wrote, by folder: `Written to outputs/tables: a.md, b.csv`."""
    folders: dict[Path, list[str]] = {}
    for path in map(Path, paths):
        folders.setdefault(path.parent, []).append(path.name)
    for folder, names in folders.items():
        print(f"Written to {relative(folder)}: {', '.join(names)}")


def relative(path: Path) -> str:
    """`path` relative to the working folder when inside it (outputs/tables), else as is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class _Text:
    """A line of text that displays as itself (not as a quoted string)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(self.text)}</p>"
