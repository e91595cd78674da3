"""Writing tables: markdown (GitHub), one CSV per table and LaTeX (booktabs), each file written
atomically (kit.io), all texts built before anything is written."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from kit import io as kio
from kit.config.paths import outputs_root, project_path


def cell(value) -> str:
    """A table value as text, as the tables show it (markdown, the report, the notebooks):
    blank when missing, floats to 6 significant digits."""
    if not isinstance(value, (list, tuple, dict)) and pd.isna(value):
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _markdown_cell(value) -> str:
    """`cell` as markdown text: "|" escaped (it would split the cell), one line."""
    return cell(value).replace("|", "\\|").replace("\n", " ")


def _markdown(frame: pd.DataFrame) -> str:
    """A GitHub markdown table (pandas' to_markdown; cells pre-formatted, never re-parsed)."""
    text = frame.map(_markdown_cell).rename(columns=str)
    return text.to_markdown(index=False, tablefmt="github", disable_numparse=True) + "\n"


def _with_index(table: pd.DataFrame) -> pd.DataFrame:
    """The table with a named index (paper_table's "Model") as its first column; an unnamed
    index is only row numbers and is dropped."""
    named = any(name is not None for name in table.index.names)
    return table.reset_index(drop=not named)


def _tex_text(text: str) -> str:
    """Plain text (a caption) made safe for LaTeX: its special characters escaped."""
    for char in "&%$#_{}":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "$<$")


def _slug(text: str) -> str:
    """A file-name and LaTeX-label friendly form of a table title."""
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def table_stem(name: str, title: str) -> str:
    """The file stem of one table of a set written as `name`: `<name>-<title slug>` (its CSV;
    the report names it under the table it shows)."""
    return f"{name}-{_slug(title)}"


def write_tables(tables: pd.DataFrame | Mapping[str, pd.DataFrame], name: str,
                 tables_dir: str | os.PathLike) -> list[Path]:
    """Write `<name>.md`, one CSV per table and `<name>.tex` under `tables_dir`, each
    atomically (kit.io: a crash leaves the old file or the new one, never half of one).

    `tables` is one table (`<name>.csv`), or {title: table} for several in one file set (a
    profile's summary, paper table and selection): md gets a "## title" section per table, csv
    a file per table, `<name>-<title slug>.csv` (tables of different shapes are never stacked),
    tex a booktabs table per table with a caption (the title and the table's
    `attrs["caption"]`, which md prints under the table) and a label `tab:<name>-<title slug>`.
    All texts are built before anything is written, so a formatting error leaves the old files
    untouched.
    """
    named = {name: tables} if isinstance(tables, pd.DataFrame) else dict(tables)
    several = not isinstance(tables, pd.DataFrame)
    captions = {title: t.attrs.get("caption", "") for title, t in named.items()}
    frames = {title: _with_index(t) for title, t in named.items()}
    # the lines a table must show above itself (kit.results.tables.table_sets: mixed environments,
    # thin cells), once at the top of the file: every table of one set shares them
    notes = list(dict.fromkeys(n for t in named.values() for n in t.attrs.get("notes", ())))
    md = "".join(f"> {n}\n\n" for n in notes) + "\n".join(
        (f"## {title}\n\n" if several else "") + _markdown(f)
        + (f"\n{captions[title]}\n" if captions[title] else "") for title, f in frames.items())
    csvs = {(table_stem(name, title) if several else name): f.to_csv(index=False)
            for title, f in frames.items()}
    tex = "\n".join(f.to_latex(index=False, escape=True, na_rep="", float_format="{:.6g}".format,
                               caption=_tex_text(" ".join(filter(None, [title + ".",
                                                                         captions[title]]))),
                               label=f"tab:{_slug(name)}" + (f"-{_slug(title)}" if several else ""))
                    for title, f in frames.items()
                    ).replace("±", r"$\pm$").replace("†", r"$\dagger$")   # robust in any TeX
    folder = project_path(tables_dir)       # relative: the project's (kit.config.paths)
    texts = {folder / f"{name}.md": md,
             **{folder / f"{stem}.csv": text for stem, text in csvs.items()},
             folder / f"{name}.tex": tex}
    for path, text in texts.items():
        kio.write_text(path, text)            # tmp file beside it, then os.replace
    return list(texts)


def write_results(tables: pd.DataFrame | Mapping[str, pd.DataFrame],
                  outputs_dir: str | os.PathLike = "outputs", profile: str | None = None,
                  name: str = "") -> list[Path]:
    """`write_tables` into `<outputs_dir>/tables/` as `name`, by default `<profile>-results`
    (`all-results` without a profile; a YAML path's stem), beside the batch runner's own
    `<profile>.{md,csv,tex}` (the outputs folder by kit.config.paths.outputs_root)."""
    stem = Path(profile).stem if profile and profile.endswith((".yaml", ".yml")) else profile
    return write_tables(tables, name or f"{stem or 'all'}-results",
                        outputs_root(outputs_dir) / "tables")
