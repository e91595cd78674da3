"""A profile's tables and figures, as a batch writes them at its end (and `--report-only`):
outputs/tables/<profile>.{md,csv,tex} from every run of its grid that has a folder (this
shard's and others'), then the figures its `figures:` names in outputs/figures/."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from kit.config.paths import outputs_root
from kit.config.profiles import Profile
from kit.config.run_config import ConfigError, RunConfig
from kit.results.tables import table_sets, writers
from kit.results.frame.collect import load_runs
from kit.runs import config_path, run_dir_of

# each of kit.config.profiles.FIGURES: its function in kit.results.figures.plots (by name:
# matplotlib is imported only when a profile draws)
DRAW = {"label-quality": "label_quality_figure", "cost": "cost_figure", "gamma": "gamma_figure"}


def write(profile: Profile, outputs_dir: str, show: bool = False) -> list[Path]:
    """The tables and figures' paths; `show` prints the first table to the terminal and a line
    per figure."""
    run_dirs = [d for d in (run_dir_of(RunConfig.from_dict(p)) for p in profile.points)
                if config_path(d).exists()]
    if not run_dirs:
        return []
    tables = table_sets.profile_tables(load_runs(run_dirs), profile.varying())
    paths = writers.write_tables(tables, profile.name, outputs_root(outputs_dir) / "tables")
    if show:
        title, table = next(iter(tables.items()))
        named = table if isinstance(table.index, pd.RangeIndex) else table.reset_index()
        notes = "".join(f"{line}\n" for line in table.attrs.get("notes", ()))
        print(f"\n{title} - {profile.name} (dev sets; {paths[0]})\n{notes}"
              f"{named.to_markdown(index=False)}\n", flush=True)
    figures = [figure(profile, kind, outputs_dir, show) for kind in profile.figures]
    return paths + [path for path in figures if path is not None]


def figure(profile: Profile, kind: str, outputs_dir: str, show: bool) -> Path | None:
    """One of the profile's figures, drawn from its grid's runs; None, with one line, when they
    hold nothing to draw (e.g. no SSA run finished): the tables and results stand."""
    from kit.results.figures import plots          # matplotlib: only for a profile that draws
    if kind not in DRAW:     # load_profile checked the names; a Profile made by hand may not be
        raise ConfigError(f"{profile.path}: unknown figure {kind!r}; choose from "
                          f"{', '.join(DRAW)}")
    try:     # the profile by its file: a YAML elsewhere may share a name with one in params/
        fig = getattr(plots, DRAW[kind])(outputs_dir=outputs_dir, profile=str(profile.path))
    except ValueError as err:
        print(f"figure {kind}: not drawn ({str(err).splitlines()[0]})", flush=True)
        return None
    path = plots.save_figure(fig, outputs_dir, f"{profile.name}-{kind}")
    if show:
        print(f"figure: {path}", flush=True)
    return Path(path)
