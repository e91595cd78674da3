"""The report's header (kit.results.report.page), made by the kit from the run folders rather than
by a notebook: the profile, the date, where the runs were made (kit commits, CPU / GPU class,
precision, library versions: each run's metrics.json `environment`, kit.train.provenance), the
runs ok / failed / absent (and what the batch that built it did), the warnings that matter
(too few seeds, mixed environments, degenerate cells, failures), the profile's main table (the
one kit.batch prints and writes first) and every grid point with a link to its run's notebook.
"""
from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import jinja2
import pandas as pd
from markupsafe import Markup

from kit import runs
from kit.config.profiles import Profile, read_spec
from kit.config.rules import precision_name
from kit.config.run_config import RunConfig
from kit.results.tables import table_sets, writers
from kit.results.frame.collect import load_runs, mixed_environments
from kit.results.tables.paper_table import DEGENERATE
from kit.results.views import show

SHOWN_FAILURES = 3
NOTEBOOK_FAILED = "notebook failed: "      # an ok run's error: its notebook's, after fit()


@dataclass
class GridRun:
    """A grid point of the profile and what its run folder says (status "absent": no folder;
    "incomplete": started, no metrics.json yet, still running or killed)."""
    run_id: str
    run_dir: Path
    point: dict
    status: str
    metrics: dict | None
    error: str = ""


def grid_runs(profile: Profile) -> list[GridRun]:
    """Every point of the profile's grid with its run folder's status (kit.runs' readers)."""
    out = []
    for point in profile.points:
        cfg = RunConfig.from_dict(point)
        run_dir, metrics, status, error = runs.run_dir_of(cfg), None, "absent", ""
        if runs.run_started(run_dir):
            try:
                metrics = runs.read_metrics(run_dir)
            except (OSError, ValueError) as err:
                status, error = "damaged", str(err).splitlines()[0]   # as the tables say
            else:
                status = str(metrics.get("status")) if metrics else "incomplete"
                error = str((metrics or {}).get("error") or "")
        if status == "ok" and (failed := runs.notebook_error(run_dir)):
            error = f"{NOTEBOOK_FAILED}{failed}"      # a cell after fit() (kit.batch says so)
        out.append(GridRun(cfg.run_id, run_dir, cfg.to_dict(), status, metrics, error))
    return out


def header(profile: Profile, grid: list[GridRun], links: dict[str, str],
           counts: dict[str, int] | None, failures: list[str]) -> tuple[str, dict]:
    """The header's HTML and the summary that outputs/reports/index.html lists."""
    title, table = main_table(profile, grid)
    built = datetime.datetime.now().astimezone().isoformat(" ", "seconds")
    statuses = grid_counts(grid)
    facts = {"profile": f"{profile.name} ({show.relative(profile.path)})", "built": built,
             **provenance([r for r in grid if r.metrics]),
             "runs (from the run folders)": statuses}
    facts["this batch"] = (", ".join(f"{n} {s}" for s, n in counts.items()
                                     if n or s in ("ok", "skipped", "failed", "absent"))
                           if counts is not None else "none: rebuilt from the runs present")
    body = HEADER.render(profile=profile.name, description=_description(profile), facts=facts,
                         warnings=warnings(grid, table, failures),
                         table=None if table is None else _table(profile, title, table),
                         runs=[_run(run, links.get(run.run_id)) for run in grid])
    return body, {"profile": profile.name, "built": built, "counts": statuses,
                  "main_table": None if table is None else title}


# ---------------------------------------------------------------- what the header says

def grid_counts(grid: list[GridRun]) -> str:
    """`4 ok, 0 failed, 1 absent`: ok / failed / absent always, other statuses when present."""
    counts = Counter(r.status for r in grid)
    order = ["ok", "failed", *sorted(set(counts) - {"ok", "failed", "absent"}), "absent"]
    return ", ".join(f"{counts.get(s, 0)} {s}" for s in order)


def provenance(done: list[GridRun]) -> dict[str, str]:
    """Where the runs were made, each field's values with their run counts when they differ."""
    envs = [(r.metrics, r.metrics.get("environment")) for r in done
            if isinstance(r.metrics.get("environment"), dict)]
    if not envs:
        return {"environment": "no run recorded one"}
    return {
        "kit commit": _tally(_commit(env) for _, env in envs),
        "CPU": _tally(_cpu(env) for _, env in envs),
        "GPU": _tally(_gpu(env) for _, env in envs),
        "precision": _tally(f"{precision_name(m.get('mixed_precision'))} on "
                            f"{m.get('device') or '?'}" for m, _ in envs),
        "libraries": _tally(", ".join(f"{k} {env.get(k)}" for k in
                                      ("python", "torch", "transformers", "accelerate"))
                            for _, env in envs),
    }


def _commit(env: dict) -> str:
    commit = env.get("kit_commit")
    if not commit:
        return "unknown (not a git checkout)"
    return commit[:10] + (" + uncommitted changes" if env.get("kit_dirty") else "")


def _cpu(env: dict) -> str:
    cpu = env.get("cpu") or {}
    threads, processes = env.get("threads"), env.get("processes") or 1
    return (f"{cpu.get('model', '?')}, class {cpu.get('cpu_class', '?')}, {threads} thread"
            f"{'s' if threads != 1 else ''}"
            + (f", {processes} processes" if processes > 1 else ""))


def _gpu(env: dict) -> str:
    gpu = env.get("gpu")
    return f"{gpu.get('name')} x{gpu.get('count', 1)}" if gpu else "none"


def _tally(values) -> str:
    """One value as itself; several as `a (3 runs), b (1 run)`, the most common first."""
    counts = Counter(values)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{v} ({n} run{'s' if n > 1 else ''})" for v, n in counts.most_common())


def main_table(profile: Profile, grid: list[GridRun]) -> tuple[str, pd.DataFrame | None]:
    """The profile's first table, as kit.results.report.profile_outputs writes it (its CSV is the
    same table), or (why not, None) when no run has a folder or the tables cannot be made. Runs that
    stopped early (preempted) have no result yet: the warnings count them; a damaged run (its
    record cannot be read) is a row of the table, counted in its cell."""
    started = [r.run_dir for r in grid if runs.config_path(r.run_dir).exists()
               and r.status in ("ok", "failed", "incomplete", "damaged")]
    if not started:
        return "no run has a folder yet", None
    try:
        tables = table_sets.profile_tables(load_runs(started), profile.varying())
    except (ValueError, KeyError) as err:
        return f"tables: {str(err).splitlines()[0]}", None
    return next(iter(tables.items()))


def degenerate_cells(table: pd.DataFrame) -> list[str]:
    """`CoLA (BERT-r, SSA-H)`: the columns with a degenerate cell (marked DEGENERATE by
    kit.results.tables.paper_table) and its rows."""
    cells = {}
    for column in table.columns:
        rows = [str(i) for i, v in table[column].items() if DEGENERATE in str(v)]
        if rows:
            cells[column] = rows
    return [f"{c} ({', '.join(rows)})" for c, rows in cells.items()]


def warnings(grid: list[GridRun], table: pd.DataFrame | None, failures: list[str]) -> list[str]:
    """The lines a reader must see before any number: thin cells, mixed environments,
    degenerate cells, failed / unfinished / absent runs, notebooks that failed."""
    ok = [r for r in grid if r.status == "ok"]
    if table is not None:                  # its notes: thin cells, mixed environments
        lines = list(table.attrs.get("notes", ()))
    else:
        lines = [mixed_environments([(r.run_id, r.metrics.get("environment")) for r in ok])]
    if table is not None and (cells := degenerate_cells(table)):
        lines.append(f"degenerate cells ({DEGENERATE}, see the table's caption: e.g. a "
                     f"majority-class model; their numbers say nothing and are left out of Avg): "
                     f"{'; '.join(cells)}")
    failed = [r for r in grid if r.status == "failed"]
    if failed:
        shown = "; ".join(f"{r.run_id}: {r.error}" for r in failed[:SHOWN_FAILURES])
        more = len(failed) - SHOWN_FAILURES
        lines.append(f"{len(failed)} run{'s' if len(failed) > 1 else ''} failed: {shown}"
                     + (f" and {more} more" if more > 0 else ""))
    notebooks = [r for r in ok if r.error.startswith(NOTEBOOK_FAILED)]
    if notebooks:
        shown = "; ".join(f"{r.run_id}: {r.error.removeprefix(NOTEBOOK_FAILED)}"
                          for r in notebooks[:SHOWN_FAILURES])
        more = len(notebooks) - SHOWN_FAILURES
        lines.append(f"{len(notebooks)} finished run{'s' if len(notebooks) > 1 else ''} with a "
                     f"notebook that failed after training (the run counts; its notebook shows "
                     f"the error): {shown}" + (f" and {more} more" if more > 0 else ""))
    # the table's notes name its damaged runs (kit.results.frame.collect.damaged_line)
    said = ("ok", "failed", "absent", *(("damaged",) if table is not None else ()))
    other = Counter(r.status for r in grid if r.status not in said)
    if other:
        stopped = ", ".join(f"{n} {s}" for s, n in sorted(other.items()))
        lines.append(f"{stopped} run(s) did not end: rerunning the profile resumes or retries "
                     "them")
    absent = sum(r.status == "absent" for r in grid)
    if absent:
        lines.append(f"{absent} of {len(grid)} grid points have no run folder (not run yet, or "
                     "their task's files are missing)")
    return list(dict.fromkeys(line for line in lines + failures if line))


# ---------------------------------------------------------------- HTML

# kit/results/templates/kit_header.html.j2, autoescaped: no value needs escaping by hand
HEADER = jinja2.Environment(loader=jinja2.PackageLoader("kit.results"),
                            autoescape=True).get_template("kit_header.html.j2")


def _description(profile: Profile) -> str:
    return str(read_spec(profile.path).get("description") or "").strip()


def _table(profile: Profile, title: str, table: pd.DataFrame) -> dict:
    """The main table for the template: pandas' HTML (escaped by pandas), its caption and CSV."""
    named = table if isinstance(table.index, pd.RangeIndex) else table.reset_index()
    text = named.map(writers.cell).rename(columns=str)
    return {"title": title, "caption": table.attrs.get("caption", ""),
            "csv": f"{writers.table_stem(profile.name, title)}.csv",
            "html": Markup(text.to_html(index=False, table_id="kit-main-table", escape=True,
                                        border=0))}


def _run(run: GridRun, link: str | None) -> dict:
    """A grid point's row: its run id (a link to its executed notebook when it has one), what
    it ran, its status, its best dev score and its error."""
    score = ((run.metrics or {}).get("best_dev") or {}).get("score")
    return {"run_id": run.run_id, "link": link, "point": run.point, "status": run.status,
            "score": "" if score is None else f"{score:.4f}", "error": run.error}
