"""The report: one self-contained HTML page per profile, outputs/reports/<profile>/index.html.

    build(profile, outputs_dir, execute=None, counts=None) -> the page's path

The page is a header made here (kit.results.report.page_header: profile, date, kit commits, CPU /
GPU and precision from each run's provenance, the runs' counts, the warnings that matter, the main
table and a link to every run's notebook) above the profile's results notebook
(notebooks/results.ipynb) and the figure notebooks that fit the profile, executed with papermill
and rendered by nbconvert with their inputs hidden. Everything is inside the file: figures are
data: URIs, the CSS is inlined, and no script, font or MathJax is fetched, so the folder opens
from file:// on a machine without network. Each run's executed notebook becomes
runs/<run_id>.html beside it (relative links), and outputs/reports/index.html lists every
profile's report. Every file is written atomically (kit.io): a failed build leaves the last
good page in place.

`execute(notebook, output, parameters)` runs a notebook; kit.batch passes its warm kernel
(kit.cluster.kernels), the default is plain papermill (a kernel of its own).
"""
from __future__ import annotations

import concurrent.futures
import functools
import logging
import re
from collections.abc import Callable
from pathlib import Path

import jinja2
import nbformat

from kit import io as kio
from kit import runs
from kit.config.paths import PROJECT, outputs_root
from kit.config.profiles import Profile, load_profile
from kit.results.report import page_header
from kit.results.views import token_html
from kit.results.views.notebook_defaults import PROFILE_NOTEBOOKS

Execute = Callable[[Path, Path, dict], None]

# the notebook of each figure kind a profile's `figures:` may ask for (kit.config.profiles.
# FIGURES; kit.results.report.profile_outputs draws the same figures as PNG files); those written
# for one profile are notebook_defaults.PROFILE_NOTEBOOKS (opened as they are, they show its runs)
FIGURE_NOTEBOOKS = {"label-quality": "label_quality", "gamma": "gamma", "cost": "cost"}
# label quality is measured on the synthetic task only (its cues are known)
FIXED_TASK = {"label_quality": "synthetic"}
TASK_NOTEBOOKS = ("label_quality", "gamma", "cost", "case_study")    # those with a `task`

# kit/results/templates: the index of reports and nbconvert's lab template (autoescaped)
TEMPLATES = jinja2.Environment(loader=jinja2.PackageLoader("kit.results"), autoescape=True)
# what a browser would fetch from another host: a src, a <link href>, a CSS url() or @import
REMOTE = re.compile(r"""\bsrc\s*=\s*["']?\s*(?:[a-z]+:)?//|<link\b[^>]*\bhref\s*=\s*["']?\s*"""
                    r"""(?:[a-z]+:)?//|url\(\s*["']?\s*(?:[a-z]+:)?//|@import\s+(?:url\()?["']?"""
                    r"""\s*(?:[a-z]+:)?//""", re.I)


def reports_root(outputs_dir: str | Path) -> Path:
    """outputs/reports: one folder per profile, and index.html listing them (the outputs
    folder by kit.config.paths.outputs_root)."""
    return outputs_root(outputs_dir) / "reports"


def report_path(outputs_dir: str | Path, profile: str) -> Path:
    return reports_root(outputs_dir) / profile / "index.html"


def papermill_execute(notebook: Path, output: Path, parameters: dict) -> None:
    """The default `execute`: papermill in a kernel of its own."""
    import papermill as pm
    pm.execute_notebook(str(notebook), str(output), parameters=parameters, kernel_name="python3",
                        progress_bar=False, cwd=str(PROJECT))


def build(profile: str | Profile, outputs_dir: str | Path = "outputs",
          execute: Execute | None = None, counts: dict[str, int] | None = None) -> Path:
    """Write the profile's report from the runs present and return its path (see the module's
    docstring); `counts`: what the batch that just ran did (ok, skipped, failed, absent ...)."""
    if isinstance(profile, str):
        profile = load_profile(profile, str(outputs_dir))
    folder = reports_root(outputs_dir) / profile.name
    grid = page_header.grid_runs(profile)
    # the runs' pages are rendered here while the kernel executes the notebooks: two cores busy.
    # Both threads import IPython as they go (nbconvert's highlighting: IPython.lib.lexers; a
    # kernel's start: IPython.paths); imported from both at once, the package was seen half made,
    # `KeyError: 'IPython'` (a report failed so on a busy machine): here, once, before the thread
    import IPython.lib.lexers  # noqa: F401
    import IPython.paths  # noqa: F401
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pages = pool.submit(render_runs, grid, folder)
        tokens = pool.submit(token_section, grid)
        executed, failures = run_notebooks(profile, outputs_dir, folder / "notebooks",
                                           execute or papermill_execute)
        links = pages.result()
    section, token_failures = tokens.result()
    header, summary = page_header.header(profile, grid, links, counts, failures + token_failures)
    # the header shows the main table: the results notebook's copy of it (its cells tagged
    # `main-table`) would be the same table twice
    skip = ("main-table",) if summary["main_table"] else ()
    page = render(executed, title=f"{profile.name}: ssa-kit report", exclude_input=True,
                  skip_tags=skip)
    page = page.replace("<main>", "<main>\n" + header, 1)
    page = page.replace("</main>", section + "</main>", 1)     # below the notebooks
    check_local(page, folder / "index.html")
    kio.write_text(folder / "index.html", page)
    kio.write_json(folder / "summary.json", summary)
    write_index(outputs_dir)
    return folder / "index.html"


# ---------------------------------------------------------------- the notebooks

def notebooks_for(profile: Profile) -> list[tuple[str, dict]]:
    """(notebook name, parameters beyond profile and outputs_dir) of the page, results first."""
    names = [FIGURE_NOTEBOOKS[f] for f in profile.figures if f in FIGURE_NOTEBOOKS]
    names += PROFILE_NOTEBOOKS.get(profile.name, ())
    tasks = {p.get("task") for p in profile.points}
    # one task: the figures' task; "": every task of the profile (a grid without `task` too)
    task = str(tasks.pop()) if len(tasks) == 1 and None not in tasks else ""
    return [("results", {})] + [(name, {"task": FIXED_TASK.get(name, task)}
                                 if name in TASK_NOTEBOOKS else {})
                                for name in dict.fromkeys(names)]


def run_notebooks(profile: Profile, outputs_dir: str | Path, folder: Path,
                  execute: Execute) -> tuple[list, list[str]]:
    """Execute the page's notebooks into `folder`; returns the executed notebooks (a failed one
    too: it shows its error) and one line per failure."""
    # a params/ profile by its name (what the notebooks print); a YAML elsewhere by its path
    named = profile.path.resolve() == (PROJECT / "params" / f"{profile.name}.yaml").resolve()
    common = {"profile": profile.name if named else str(profile.path),
              "outputs_dir": str(outputs_root(outputs_dir))}
    executed, failures = [], []
    for name, extra in notebooks_for(profile):
        output = folder / f"{name}.ipynb"
        with kio.atomic_path(output) as tmp:
            try:
                execute(PROJECT / "notebooks" / f"{name}.ipynb", tmp, {**common, **extra})
            except Exception as err:   # the notebook's error is shown in it; the page goes on
                if not tmp.stat().st_size:       # nothing ran (no kernel): nothing to show
                    raise
                failures.append(f"notebooks/{name}.ipynb failed: {one_line(err)}")
        executed.append(nbformat.read(output, as_version=4))
    return executed, failures


def token_section(grid: list[page_header.GridRun]) -> tuple[str, list[str]]:
    """The token view of the grid's finished runs that saved SSA labels
    (kit.results.views.token_html; "" when none did), or a failure line for the warnings: the rest
    of the page stands."""
    try:
        return token_html.report_section([r.run_dir for r in grid if r.status == "ok"]), []
    except Exception as err:           # noqa: BLE001 - one line on the page, never a lost page
        return "", [f"the token view failed: {one_line(err)}"]


def one_line(err: BaseException) -> str:
    """An error as one line: papermill's `ename: evalue`, else the exception's first line."""
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(err).__name__}: {err}"
    return (text.strip().splitlines() or [type(err).__name__])[0]


# ---------------------------------------------------------------- HTML

@functools.cache
def exporter(exclude_input: bool):
    """nbconvert's HTML exporter with kit/results/templates/kit_lab.html.j2, its lab template
    without what it would fetch (made once: it reads the template and its CSS)."""
    from nbconvert import HTMLExporter
    # its warnings (a figure without alt text) are not the batch's business
    quiet = logging.getLogger("kit.results.report.page.nbconvert")
    quiet.setLevel(logging.ERROR)
    return HTMLExporter(extra_loaders=[TEMPLATES.loader], template_file="kit_lab.html.j2",
                        exclude_input=exclude_input,
                        exclude_output_prompt=exclude_input, log=quiet)


def render(notebooks: list, title: str, exclude_input: bool, skip_tags: tuple = ()) -> str:
    """One HTML page of the cells of `notebooks`, one after another, but those tagged with one
    of `skip_tags`."""
    cells = [cell for nb in notebooks for cell in nb.cells
             if not set(skip_tags) & set(cell.metadata.get("tags", ()))]
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i}"           # ids must stay unique once notebooks are joined
    merged = nbformat.v4.new_notebook(cells=cells, metadata={
        **(notebooks[0].metadata if notebooks else {}), "title": title})
    body, _ = exporter(exclude_input).from_notebook_node(merged)
    return body


def render_runs(grid: list[page_header.GridRun], folder: Path) -> dict[str, str]:
    """runs/<run_id>.html in the report's `folder` (as outputs/runs/<run_id>/) of every run with
    an executed notebook, rendered again only when the notebook is newer than its page; returns
    {run_id: the page's link, relative to the report}."""
    links = {}
    for run in grid:
        source = runs.notebook_path(run.run_dir)
        if not source.exists():
            continue
        target = runs.runs_root(folder) / f"{run.run_id}.html"
        if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
            nb = nbformat.read(source, as_version=4)
            page = render([nb], title=run.run_id, exclude_input=False)
            check_local(page, target)
            kio.write_text(target, page)
        links[run.run_id] = target.relative_to(folder).as_posix()
    return links


def remote_references(page: str) -> list[str]:
    """What in `page` a browser would fetch from another host (empty for a self-contained page)."""
    return [page[m.start():m.start() + 80] for m in REMOTE.finditer(page)]


def check_local(page: str, path: Path) -> None:
    remote = remote_references(page)
    if remote:
        raise ValueError(f"{path}: the page would fetch {remote[0]!r} from the network")


def write_index(outputs_dir: str | Path) -> Path:
    """outputs/reports/index.html: every profile's report present, newest first."""
    root = reports_root(outputs_dir)
    reports = []
    for page in sorted(root.glob("*/index.html"), key=lambda p: -p.stat().st_mtime):
        try:
            summary = runs.read_json(page.parent / "summary.json")
        except (OSError, ValueError):
            summary = {}
        reports.append({"name": page.parent.name, "built": summary.get("built", ""),
                        "counts": summary.get("counts", "")})
    text = TEMPLATES.get_template("kit_index.html.j2").render(reports=reports)
    kio.write_text(root / "index.html", text)
    return root / "index.html"
