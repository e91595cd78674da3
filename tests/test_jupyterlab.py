"""Every notebook in notebooks/ run in a real JupyterLab in headless Chromium, as a person runs
it: the server started from the venv on the project folder (so a kernel starts in notebooks/),
each notebook opened from the file browser in its own tab, Run > Run All Cells, and then what
the page shows: no error output anywhere, figures that decode, the training notebook's live
epoch table and token view. The results and figure notebooks run as they are (`profile = ""`) on
the smoke profile's runs, the training notebooks on their own tiny defaults; outputs go to a
temporary folder ($SSA_KIT_OUTPUTS) and nothing is written under notebooks/.

One test (one server, one browser page, the kernels running side by side): the kernel starts
and imports dominate, and the smoke runs are made while the training notebooks train.
Deselect it with `-m "not jupyterlab"`; SSA_KIT_SCREENSHOTS=DIR keeps a screenshot per
notebook there (e.g. for docs/figures/jupyterlab-finetune.png).
"""
import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jupyterlab_driver import (CHROMIUM, CHROMIUM_ARGS, Lab, browser_or_skip, errors,
                               lab_server, stream_text)
from kit import batch, runs

pytestmark = pytest.mark.jupyterlab

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
# train a tiny model each: run first, while the smoke runs are made
TRAINING = ["finetune", "kaggle_csv", "pretrain", "multitask"]
# show the runs present: run once the smoke runs exist
FROM_RUNS = ["results", "label_quality", "gamma", "cost", "case_study", "mechanism"]
# what each notebook must show beyond "no error": decoded images, HTML blocks by class
SHOWS = {"finetune": {"images": 1, "epochs": 1, "tokens": 1},
         "kaggle_csv": {"images": 1}, "pretrain": {"images": 1}, "multitask": {"images": 1},
         "results": {}, "label_quality": {"images": 1}, "gamma": {"images": 1},
         "cost": {"images": 1}, "case_study": {"images": 1}, "mechanism": {"images": 1}}


def _snapshot(folder: Path) -> dict[str, str]:
    """{path under folder: sha256} of every file there, hidden ones included."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _git_status(folder: Path) -> str | None:
    if not (REPO / ".git").exists() or not shutil.which("git"):
        return None
    return subprocess.run(["git", "status", "--porcelain", "--", str(folder)], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def _smoke_runs(outputs: Path) -> set[str]:
    """The smoke profile's runs (4 methods, seconds each) in this worker's warm kernel, without
    the report: {run folder names}."""
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        code = batch.run_profile("smoke", outputs_dir=str(outputs), report=False)
    assert code == 0, printed.getvalue()
    return {d.name for d in (outputs / "runs").iterdir()}


def _run_all(lab: Lab, outputs: Path, took: dict) -> set[str]:
    """Run > Run All Cells in every notebook: the training ones first, the others once the
    smoke runs (made meanwhile, in the warm kernel) exist: {the smoke runs' folder names}."""
    started = time.perf_counter()
    for name in TRAINING:
        lab.open(name)
    for name in TRAINING:
        lab.run_all(name)
    for name in FROM_RUNS:
        lab.open(name)
    took["opened"] = time.perf_counter() - started
    smoke = _smoke_runs(outputs)
    took["smoke runs"] = time.perf_counter() - started
    for name in FROM_RUNS:
        lab.run_all(name)
    return smoke


def _look(lab: Lab, name: str, deadline: float, tmp_path: Path) -> dict:
    """Once `name` is done: its errors, what its page shows, its screenshot (scrolled to the
    live epoch table, else the first figure); then its tab closed without saving."""
    nb = lab.wait_done(name, deadline)
    seen = {**lab.shown(name), "errors": errors(nb), "stderr": stream_text(nb, "stderr"),
            "stdout": stream_text(nb, "stdout")}
    png = tmp_path / f"jupyterlab-{name}.png"
    if seen["epochs"]:             # the training cell at the top: bar, live table, what follows
        lab.screenshot(name, png, ".ssa-epochs")
    else:                          # the first figure's cell at the bottom, what leads to it above
        lab.screenshot(name, png, ".jp-OutputArea-output img", block="end")
    if os.environ.get("SSA_KIT_SCREENSHOTS"):
        target = Path(os.environ["SSA_KIT_SCREENSHOTS"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, target / png.name)
    seen["asked to save"] = lab.close_without_saving(name)
    return seen


def test_every_notebook_runs_in_jupyterlab(tmp_path, request):
    sync_playwright = browser_or_skip("the JupyterLab test")
    request.getfixturevalue("batch_kernel")          # the smoke runs in the warm kernel
    assert set(SHOWS) == {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    before, status_before = _snapshot(NOTEBOOKS), _git_status(NOTEBOOKS)
    outputs = tmp_path / "outputs"
    env = {"SSA_KIT_OUTPUTS": str(outputs), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    started, took, seen = time.perf_counter(), {}, {}
    with lab_server(REPO, tmp_path / "lab", env) as url, sync_playwright() as p:
        took["server"] = time.perf_counter() - started
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            lab = Lab(browser.new_page(viewport={"width": 1280, "height": 900}), url)
            smoke = _run_all(lab, outputs, took)
            deadline = time.monotonic() + 300
            for name in TRAINING + FROM_RUNS:
                seen[name] = _look(lab, name, deadline, tmp_path)
                took[name] = time.perf_counter() - started
        finally:
            _debug_cpu(url)
            console = lab.console_errors
            browser.close()
    print("console", console)
    print("new runs", sorted(d.name for d in (outputs / "runs").iterdir()))
    print(f"JupyterLab, s since start: { {k: round(v, 1) for k, v in took.items()} }")
    for name, view in seen.items():
        print(f"{name}: {view}")
        print(f"{name} stdout: {view['stdout'][:300]!r}")

    failed = {name: view["errors"] for name, view in seen.items() if view["errors"]}
    assert not failed, f"error outputs: {failed}"
    for name, want in SHOWS.items():
        images = seen[name]["images"]
        assert all(ok and width > 0 for ok, width in images), f"{name}: an image did not decode"
        got = {"images": len(images), "epochs": seen[name]["epochs"],
               "tokens": seen[name]["tokens"]}
        assert all(got[k] >= n for k, n in want.items()), f"{name} shows {got}, wants {want}"
    assert all(view["asked to save"] for view in seen.values())     # each closed by Discard
    # every training notebook's run finished, in the temporary outputs folder
    trained = {d.name: runs.read_metrics(d) for d in (outputs / "runs").iterdir()
               if d.name not in smoke}
    assert sorted(m["status"] for m in trained.values()) == ["ok"] * 4, trained
    # nothing written under notebooks/: no outputs folder, no checkpoints, no saved notebook
    assert _snapshot(NOTEBOOKS) == before and _git_status(NOTEBOOKS) == status_before
    assert not (tmp_path / "lab" / "checkpoints").exists()


def _debug_cpu(url):
    import json as _j, urllib.request
    sess = {se["kernel"]["id"]: se["path"] for se in _j.load(urllib.request.urlopen(f"{url}/api/sessions?token=ssa-kit-test"))}
    out = subprocess.run(["ps", "-eo", "pid,ppid,times,args", "-ww"], capture_output=True, text=True).stdout
    rows = [l.split(None, 3) for l in out.splitlines()[1:]]
    kids = {}
    for pid, ppid, t, a in rows: kids.setdefault(ppid, []).append((pid, int(t), a))
    groups = {}
    me = [r for r in rows if r[0] == str(os.getpid())][0]
    groups["pytest"] = int(me[2])
    stack = [str(os.getpid())]
    while stack:
        p_ = stack.pop()
        for pid, t, a in kids.get(p_, []):
            key = "chromium" if "chrom" in a else "server" if "jupyterlab" in a else "other:" + a[:40]
            for k, v in sess.items():
                if k in a: key = v
            if "ipykernel" in a and key.startswith("other"): key = "warm kernel"
            groups[key] = groups.get(key, 0) + t
            stack.append(pid)
    with open("/tmp/jl/cpu.txt", "w") as f:
        f.write(_j.dumps(groups, indent=0) + "\ntotal %d\n" % sum(groups.values()))
