"""How a notebook shows a table, its caption and the files it wrote: as a page reads, not as
Python's repr. The report (kit.results.report) renders the notebooks as they ran, so what a cell
shows here is what the report's reader sees: no `[PosixPath(...)]`, no 0, 1, 2 ... index
column, captions as sentences.

    table(frame)      -> HTML and text: no RangeIndex column, the caption (and notes) above it
    written(paths)    -> prints `Written to outputs/tables: demo-results.md, ...`
"""
from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from kit.results.tables.writers import cell


def table(frame: pd.DataFrame, caption: str | None = None, empty: str = "(none)") -> Shown:
    """`frame` to display: its cells as `cell` puts them, without the index when it is only row
    numbers, `caption` (default: the table's own `attrs["notes"]` and `attrs["caption"]`) as
    sentences above it; as HTML (a notebook, the report) and as text. An empty frame shows
    `empty` instead."""
    if frame.empty:
        return Shown(empty, f"<p>{html.escape(empty)}</p>")
    if caption is None:
        caption = " ".join([*frame.attrs.get("notes", ()), frame.attrs.get("caption", "")])
    caption = caption.strip()
    rows = not isinstance(frame.index, pd.RangeIndex)
    styler = frame.style.format(cell)
    if not rows:
        styler = styler.hide(axis="index")
    if caption:
        styler = styler.set_caption(html.escape(caption)).set_table_styles(
            [{"selector": "caption", "props": "caption-side: top; text-align: left;"}])
    text = frame.map(cell).to_string(index=rows)
    return Shown("\n".join(filter(None, [caption, text])), styler.to_html())


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


class Shown:
    """What a cell displays: `html` in a notebook and the report, `text` where only text shows
    (a terminal, papermill's log)."""

    def __init__(self, text: str, html_: str):
        self.text, self.html = text, html_

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return self.html
