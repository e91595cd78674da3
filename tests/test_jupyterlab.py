"""Every notebook in notebooks/ run in a real JupyterLab in headless Chromium, as a person runs
it: the server started from the venv on the project folder (so a kernel starts in notebooks/),
each notebook opened from the file browser in a tab of its own, Run > Run All Cells, and then
what the page shows: no error output and nothing on stderr (JupyterLab paints it red), figures
that decode, the training notebooks' live epoch table and the token view. The results and
figure notebooks run as they are (`profile = ""`) on the smoke profile's runs, the training
notebooks on their own tiny defaults; outputs go to a temporary folder ($SSA_KIT_OUTPUTS), each
tab is closed with Discard, and nothing is written under notebooks/.

One test: the smoke runs made (in this worker's warm kernel) while the server starts, then one
browser page and every notebook's kernel running side by side. Kernel starts and the imports of
torch and transformers are most of its cost. Deselect it with `-m "not jupyterlab"`;
SSA_KIT_SCREENSHOTS=DIR keeps the screenshots there too (jupyterlab-<notebook>.png, and
jupyterlab-finetune-tokens.png of the token view), e.g. DIR=docs/figures.
"""
import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from jupyterlab_driver import (BLOCKS, Lab, browser_or_skip, chromium, errors, lab_server,
                               new_page, stream_text, unexplained)
from kit import batch, runs

pytestmark = pytest.mark.jupyterlab

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
# each trains a tiny model: started first, they take longest
TRAINING = ["finetune", "kaggle_csv", "pretrain", "multitask"]
# each shows the runs present (the slowest first); all but compare choose a profile by
# themselves: the smoke profile's, made before. compare shows the 4 runs started last, whatever
# their profile: it runs first, alone, so those are the smoke runs, not a training notebook's
FROM_RUNS = ["case_study", "mechanism", "results", "label_quality", "gamma", "cost", "compare"]
# the smoke profile's methods (params/smoke.yaml), one run each: the rows compare shows
SMOKE_METHODS = ["bert", "bert-mask", "ssa-co", "ssa-h"]
# what each notebook must show besides "no error": at least so many decoded images, and
# HTML blocks (jupyterlab_driver.BLOCKS: the live epoch table, the token view)
SHOWS = {"finetune": {"images": 1, "epochs": 1, "tokens": 1},
         "kaggle_csv": {"images": 2, "epochs": 1}, "pretrain": {"images": 1, "epochs": 1},
         "multitask": {"images": 1, "epochs": 1}, "results": {},
         "label_quality": {"images": 1}, "gamma": {"images": 1}, "cost": {"images": 1},
         "case_study": {"images": 1}, "mechanism": {"images": 1}, "compare": {}}
# the run folder (without its hash) each training notebook's defaults make
TRAINED = ["CoLA-mlm-s0", "csv-bert-s0", "multitask-embert-s0", "synthetic-ssa-h-s0"]
DEADLINE_S = 360            # from the last Run All to every notebook done


def _snapshot(folder: Path) -> dict[str, str]:
    """{path under folder: sha256} of every file there, hidden ones included."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _git_status(folder: Path) -> str | None:
    if not (REPO / ".git").exists() or not shutil.which("git"):
        return None
    return subprocess.run(["git", "status", "--porcelain", "--", str(folder)], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def _unexecuted(name: str) -> bool:
    """The committed notebook has no outputs and no execution counts (then "every cell has a
    count" means this session ran it)."""
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    return all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code")


def _smoke_runs(outputs: Path, made: set) -> None:
    """The smoke profile's runs (4 methods, seconds each) in this worker's warm kernel, without
    a report; their folder names into `made`."""
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        code = batch.run_profile("smoke", outputs_dir=str(outputs), report=False)
    assert code == 0, printed.getvalue()
    made.update(d.name for d in runs.runs_root(outputs).iterdir())


def _table_rows(nb: dict) -> list[tuple[str, ...]]:
    """The first three cells of each row of the HTML tables the notebook displays (pandas'
    to_html: an index <th>, then <td>s), in order."""
    html = "".join("".join(o["data"]["text/html"]) for cell in nb["cells"]
                   for o in cell.get("outputs", []) if "text/html" in o.get("data", {}))
    return re.findall(r"<tr>\s*<th>\d+</th>\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>\s*"
                      r"<td>([^<]*)</td>", html)


def _run_all(lab: Lab) -> None:
    """Open every notebook and wait for its kernel (the browser's and the kernel starts' share
    of the work: before the runs compete for the cores); Run > Run All Cells in compare, alone,
    until it is done (what it reads, the runs started last, is then the smoke runs and nothing
    a training notebook is writing), then in each of the others, the training ones first (they
    take longest); those run side by side."""
    for name in TRAINING + FROM_RUNS:
        lab.open(name)
    lab.wait_idle()
    lab.run_all("compare")
    lab.wait_done("compare", time.monotonic() + DEADLINE_S)
    for name in TRAINING + FROM_RUNS:
        if name != "compare":
            lab.run_all(name)


def _look(lab: Lab, name: str, deadline: float, tmp_path: Path) -> dict:
    """Once `name` is done: its errors and streams, what its page shows, its screenshots; then
    its tab closed without saving."""
    nb = lab.wait_done(name, deadline)
    seen = {**lab.shown(name), "errors": errors(nb), "stderr": stream_text(nb, "stderr"),
            "stdout": stream_text(nb, "stdout"), "table": _table_rows(nb)}
    # its screenshot: the training cell at the top (its bar, live table and what follows), else
    # the first figure's cell at the bottom (what leads to it above); the token view's too
    shots = [("", f".{BLOCKS['epochs']}", "start") if seen["epochs"] else
             ("", ".jp-OutputArea-output img", "end")]
    if seen["tokens"]:
        shots.append(("-tokens", f".{BLOCKS['tokens']}", "start"))
    for suffix, first, block in shots:
        png = tmp_path / f"jupyterlab-{name}{suffix}.png"
        lab.screenshot(name, png, first, block)
        if os.environ.get("SSA_KIT_SCREENSHOTS"):
            target = Path(os.environ["SSA_KIT_SCREENSHOTS"])
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, target / png.name)
    seen["asked to save"] = lab.close_without_saving(name)
    return seen


def test_every_notebook_runs_in_jupyterlab(tmp_path, request):
    sync_playwright = browser_or_skip("the JupyterLab test")
    request.getfixturevalue("batch_kernel")          # the smoke runs in the warm kernel
    # a notebook added to notebooks/ is added here too: to TRAINING or FROM_RUNS, and to SHOWS
    assert set(TRAINING + FROM_RUNS) == set(SHOWS) == {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    assert [name for name in SHOWS if not _unexecuted(name)] == []
    before, status_before = _snapshot(NOTEBOOKS), _git_status(NOTEBOOKS)
    outputs = tmp_path / "outputs"
    # the kernels' environment is a person's, but for where outputs go (and one torch thread
    # each): progress as in any notebook, whatever an earlier batch in this worker set
    env = {"SSA_KIT_OUTPUTS": str(outputs), "SSA_KIT_PROGRESS": "auto", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    started, took, seen, smoke = time.perf_counter(), {}, {}, set()
    # the smoke runs are made while the server starts: the results notebooks need them
    with lab_server(REPO, tmp_path / "lab", env, lambda: _smoke_runs(outputs, smoke)) as url, \
            sync_playwright() as p:
        took["smoke runs, server"] = time.perf_counter() - started
        # what headless Chromium keeps under ~/.cache (scoped_dir*) goes to the temporary folder
        browser = chromium(p, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
        try:
            lab = Lab(new_page(browser), url, tmp_path / "lab" / "server.log")
            _run_all(lab)
            took["all running"] = time.perf_counter() - started
            deadline = time.monotonic() + DEADLINE_S
            for name in TRAINING + FROM_RUNS:
                seen[name] = _look(lab, name, deadline, tmp_path)
                took[name] = time.perf_counter() - started
        finally:
            browser.close()
    print("JupyterLab test, s from the start:", {k: round(v, 1) for k, v in took.items()},
          "double-clicked again:", lab.clicked_again)
    for name, view in seen.items():
        print(f"{name}: {view | {'stdout': view['stdout'][:200]} }")

    assert {name: view["errors"] for name, view in seen.items() if view["errors"]} == {}
    assert {name: view["stderr"] for name, view in seen.items() if view["stderr"]} == {}
    assert unexplained(lab.console_errors, lab.log) == []
    for name, want in SHOWS.items():
        images = seen[name]["images"]
        assert all(ok and width > 0 for ok, width in images), f"{name}: an image did not decode"
        got = {"images": len(images), "epochs": seen[name]["epochs"],
               "tokens": seen[name]["tokens"]}
        assert all(got[k] >= n for k, n in want.items()), f"{name} shows {got}, wants {want}"
    # the results and figure notebooks chose the smoke runs by themselves, and said so
    for name in FROM_RUNS[:-1]:
        assert seen[name]["stdout"].startswith('profile = "smoke": '), name
    # compare, run before any training notebook, shows the 4 smoke runs: a row per method
    assert seen["compare"]["table"] == [("synthetic", "tiny", m) for m in SMOKE_METHODS]
    assert seen["compare"]["stdout"].startswith(
        "one run in bert (synthetic), bert-mask (synthetic), ssa-co (synthetic), ssa-h "
        "(synthetic): no std"), seen["compare"]["stdout"]
    assert all(view["asked to save"] for view in seen.values())       # closed with Discard
    # every training notebook's run finished, in the temporary outputs folder
    trained = {d.name: runs.read_metrics(d) for d in runs.runs_root(outputs).iterdir()
               if d.name not in smoke}
    assert sorted(name.rsplit("-", 1)[0] for name in trained) == TRAINED
    assert all(metrics["status"] == "ok" for metrics in trained.values()), trained
    # nothing written under notebooks/: no outputs folder, no checkpoints, no saved notebook
    assert _snapshot(NOTEBOOKS) == before and _git_status(NOTEBOOKS) == status_before
    assert not (tmp_path / "lab" / "checkpoints").exists()
