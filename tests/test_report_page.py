"""The report (kit.results.report.page): its header, links and self-containment on hand-made run
folders (no kernel, no browser), the batch's wiring (its last line, `report: false`, --no-report, a
failed report), and the smoke profile's report opened from file:// in headless Chromium: the
main table equals its CSV, every image decodes, no console error, no request leaves file://."""
import base64
import contextlib
import csv
import io
import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml

from kit import batch, runs
from kit.config.run_config import ConfigError, RunConfig
from kit.results.tables import writers
from kit.results.report import page
from jupyterlab_driver import browser_or_skip, chromium, new_page

REPO = Path(__file__).resolve().parents[1]
# a 1x1 PNG: an image output for the fake notebooks
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63f8cfc0f01f0005000201a5c4d4fe0000000049454e44ae426082")).decode()
ANY_REMOTE = re.compile(r"""\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.I)

GRID = """
figures: [label-quality]
grid:
  task: synthetic
  model: tiny
  method: [bert, ssa-h]
  seed: [0, 1, 2]
  synthetic_size: 64
  epochs: 1
"""


def _env(cpu_class: str) -> dict:
    return {"kit_commit": "0123456789abcdef", "kit_dirty": False, "python": "3.11.7",
            "torch": "2.13.0", "transformers": "5.0", "accelerate": "1.0",
            "cpu": {"model": "Test CPU", "cpu_class": cpu_class}, "threads": 2, "gpu": None,
            "processes": 1}


def _write_run(cfg: RunConfig, metrics: dict | None, notebook: bool = False) -> None:
    run_dir = runs.make_run_dir(cfg)
    runs.config_path(run_dir).write_text(json.dumps(cfg.to_dict()))
    if metrics is not None:
        runs.metrics_path(run_dir).write_text(json.dumps({**runs.base_record(cfg), **metrics}))
    if notebook:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# One run"),
                                             nbformat.v4.new_code_cell("plot()", outputs=[
                                                 nbformat.v4.new_output(
                                                     "display_data", {"image/png": PNG})])])
        nbformat.write(nb, runs.notebook_path(run_dir))


def _ok(score: float, cpu_class: str) -> dict:
    dev = {"accuracy": score, "score": score}
    return {"status": "ok", "error": None, "epochs": [{"epoch": 0, "dev": dev}],
            "best_epoch": 0, "best_dev": dev, "device": "cpu", "mixed_precision": "no",
            "environment": _env(cpu_class)}


@pytest.fixture
def hand_made(tmp_path):
    """Six grid points: bert seeds 0 and 1 ok (the same score: a degenerate cell; two CPU
    classes: mixed environments), bert seed 2 preempted, ssa-h seed 0 failed, seed 1 started
    and never ended, seed 2 absent."""
    path = tmp_path / "p.yaml"
    path.write_text(GRID)
    out = tmp_path / "out"
    profile = batch.load_profile(str(path), str(out))
    cfgs = {(p["method"], p["seed"]): RunConfig.from_dict(p) for p in profile.points}
    _write_run(cfgs["bert", 0], _ok(0.8, "avx2"), notebook=True)
    _write_run(cfgs["bert", 1], _ok(0.8, "amx"))
    _write_run(cfgs["bert", 2], {"status": "preempted", "error": None})
    _write_run(cfgs["ssa-h", 0], {"status": "failed", "error": "ValueError: boom"})
    _write_run(cfgs["ssa-h", 1], None)
    return profile, out, cfgs


def fake_execute(calls: list, fail: str = ""):
    """An `execute` without a kernel: the notebook with one image output; raises (after writing
    it, as papermill does) for the notebook named `fail`."""
    def execute(notebook: Path, output: Path, parameters: dict) -> None:
        calls.append((notebook.stem, parameters))
        nb = nbformat.read(notebook, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell("figure()", outputs=[
            nbformat.v4.new_output("display_data", {"image/png": PNG})]))
        nbformat.write(nb, output)
        if notebook.stem == fail:
            raise RuntimeError("no runs to draw")
    return execute


def test_the_page_says_what_the_run_folders_say(hand_made):
    profile, out, cfgs = hand_made
    calls = []
    path = page.build(profile, out, fake_execute(calls, fail="label_quality"),
                      counts={"ok": 1, "skipped": 1, "failed": 1, "absent": 0, "preempted": 1})
    assert path == out / "reports" / "p" / "index.html"
    text = path.read_text()
    assert [name for name, _ in calls] == ["results", "label_quality"]
    assert calls[0][1] == {"profile": str(profile.path), "outputs_dir": str(out.resolve())}
    assert calls[1][1]["task"] == "synthetic"
    facts = dict(re.findall(r"<tr><th>([^<]+)</th><td>([^<]*)</td></tr>", text))
    assert facts["runs (from the run folders)"] == (
        "2 ok, 1 failed, 1 incomplete, 1 preempted, 1 absent")
    assert facts["this batch"] == "1 ok, 1 skipped, 1 failed, 0 absent, 1 preempted"
    assert facts["kit commit"] == "0123456789" and facts["precision"] == "fp32 on cpu"
    assert facts["CPU"] == ("Test CPU, class avx2, 2 threads (1 run), "
                            "Test CPU, class amx, 2 threads (1 run)")
    warnings = re.search(r'id="kit-warnings">(.*?)</div>', text, re.S)[1]
    for needle in ("this table mixes environments: cpu_class avx2", "2 runs (seeds) per cell",
                   "degenerate cells (†", "synthetic (BERT-r)", "1 run failed: ",
                   "ValueError: boom", "1 incomplete, 1 preempted run(s) did not end",
                   "1 of 6 grid points have no run folder",
                   "notebooks/label_quality.ipynb failed: RuntimeError: no runs to draw"):
        assert needle in warnings, needle
    # each run with a notebook links to its page, relative to the report
    link = f"runs/{cfgs['bert', 0].run_id}.html"
    assert f'<a href="{link}">' in text and (path.parent / link).exists()
    assert text.count("<a href=\"runs/") == 1
    # self-contained: images inline, no input cells, nothing fetched from anywhere
    assert text.count('src="data:image/png;base64,') == 2
    assert "collect.collect_runs(" not in text
    assert 'id="kit-tokens"' not in text        # no run saved SSA labels: no token section
    assert page.remote_references(text) == [] and not ANY_REMOTE.search(text)
    assert not ANY_REMOTE.search((path.parent / link).read_text())
    index = (out / "reports" / "index.html").read_text()
    assert 'href="p/index.html"' in index and "2 ok, 1 failed" in index
    assert (path.parent / "notebooks" / "label_quality.ipynb").exists()


def test_a_damaged_run_is_counted_on_the_page(hand_made):
    """A truncated metrics.json: the page is built, and its facts, warnings and main table count
    the run as damaged (the tables' word) instead of leaving it out."""
    profile, out, cfgs = hand_made
    _write_run(cfgs["ssa-h", 2], None)
    runs.metrics_path(runs.run_dir_of(cfgs["ssa-h", 2])).write_text('{"status": "ok", "best_')
    text = page.build(profile, out, fake_execute([]), counts=None).read_text()
    facts = dict(re.findall(r"<tr><th>([^<]+)</th><td>([^<]*)</td></tr>", text))
    assert facts["runs (from the run folders)"] == (
        "2 ok, 1 failed, 1 damaged, 1 incomplete, 1 preempted, 0 absent")
    warnings = re.search(r'id="kit-warnings">(.*?)</div>', text, re.S)[1]
    assert f"1 damaged run (a record no run writes; counted in n, never averaged; rerunning " \
           f"its point retrains it): {cfgs['ssa-h', 2].run_id}: " in warnings
    assert "damaged run(s) did not end" not in warnings
    assert "n/a (n=0 of 3, 1 failed, 1 missing, 1 damaged)" in text


def test_a_remote_reference_stops_the_page():
    html = '<img src="https://example.org/a.png"><link rel="stylesheet" href="//cdn/x.css">'
    assert len(page.remote_references(html)) == 2
    assert page.remote_references('<a href="#x">x</a><img src="data:image/png;base64,AA">') == []
    with pytest.raises(ValueError, match="would fetch"):
        page.check_local(html, Path("index.html"))


def test_report_false_and_bad_values(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text("report: false\ngrid:\n  task: synthetic\n")
    assert batch.load_profile(str(path)).report is False
    path.write_text("report: maybe\ngrid:\n  task: synthetic\n")
    with pytest.raises(ConfigError, match=r"q.yaml: `report` must be true or false, got 'maybe'"):
        batch.load_profile(str(path))


def test_the_batch_ends_with_the_report_line_unless_told_not_to(tmp_path, capsys, monkeypatch):
    """No kernel: the one point's task is found nowhere (skipped), the page is a stand-in."""
    built = []
    monkeypatch.setattr(page, "build", lambda profile, out, execute, counts: built.append(
        counts) or page.report_path(out, profile.name))
    path = tmp_path / "r.yaml"
    path.write_text("skip_missing_tasks: true\ngrid:\n  task: MRPC\n  model: tiny\n")
    out = str(tmp_path / "out")
    assert batch.main([str(path), "--outputs", out]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"report: {out}/reports/r/index.html"
    assert built == [{"ok": 0, "skipped": 0, "failed": 0, "blocked": 0, "absent": 1,
                      "preempted": 0, "stopped": 0, "notebook failed": 0}]
    assert batch.main([str(path), "--outputs", out, "--no-report"]) == 0
    path.write_text("report: false\n" + path.read_text())
    assert batch.main([str(path), "--outputs", out]) == 0
    assert "report:" not in capsys.readouterr().out and len(built) == 1


def test_a_failed_report_is_one_line_and_keeps_the_exit_status(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("no space for the page\nsecond line")
    monkeypatch.setattr(page, "build", broken)
    profile = batch.load_profile("smoke", str(tmp_path))
    line = batch.build_report(profile, str(tmp_path), SimpleNamespace(execute=print))
    assert line == "report: failed (RuntimeError: no space for the page)"


# ---------------------------------------------------------------- in a browser

def _browser():
    """Playwright and the OS's Chromium, or a skip naming what to install (a failure in CI)."""
    return browser_or_skip("the report's browser test")


def _open(browser, url: str, screenshot: Path | None = None) -> dict:
    """Load `url`; what it showed and did: console errors, requests that left file://, images."""
    page_ = new_page(browser)
    errors, left = [], []
    page_.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
    page_.on("pageerror", lambda err: errors.append(str(err)))

    def route(r):
        if r.request.url.startswith(("file:", "data:")):
            return r.continue_()
        left.append(r.request.url)
        return r.abort()
    page_.route("**/*", route)
    page_.goto(url, wait_until="load")
    seen = {"errors": errors, "left": left,
            "images": page_.eval_on_selector_all(
                "img", "imgs => imgs.map(i => [i.complete, i.naturalWidth])"),
            "table": page_.eval_on_selector_all(
                "#kit-main-table tr", "rows => rows.map(r => Array.from(r.cells, "
                                      "c => c.innerText.trim()))"),
            "csv": page_.eval_on_selector_all("#kit-main-csv", "c => c.map(e => e.innerText)"),
            "links": page_.eval_on_selector_all("#kit-runs a", "a => a.map(e => e.href)"),
            "text": page_.inner_text("body"),
            "tables": page_.eval_on_selector_all(
                "table", "ts => ts.map(t => Array.from(t.rows, r => Array.from(r.cells, "
                         "c => c.innerText.trim())))")}
    if screenshot:
        page_.screenshot(path=str(screenshot))          # the top: header and main table
    page_.close()
    return seen


def _smoke_batch(tmp_path: Path) -> tuple[list[str], Path]:
    """The smoke profile (with its label-quality figure: an image on the page) run by kit.batch
    into a fresh outputs folder, its report built in the batch's warm kernel: (the batch's
    printed lines, the outputs folder)."""
    spec = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    profile = tmp_path / "smoke.yaml"
    profile.write_text(yaml.safe_dump({**spec, "figures": ["label-quality"]}))
    out = tmp_path / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert batch.run_profile(str(profile), outputs_dir=str(out)) == 0
    return printed.getvalue().strip().splitlines(), out


def test_the_smoke_report_end_to_end_and_in_a_browser(tmp_path, batch_kernel):
    """The batch's last line, its run pages and executed notebooks (without a browser); then
    the page in Chromium (one test: the batch runs once, on one pytest worker)."""
    lines, out = _smoke_batch(tmp_path)
    index = out / "reports" / "smoke" / "index.html"
    assert lines[-1] == f"report: {index}"
    assert lines[-2].startswith("profile smoke: 4 ok, 0 skipped, 0 failed")
    assert len(list((index.parent / "runs").glob("*.html"))) == 4
    assert {p.name for p in (index.parent / "notebooks").iterdir()} == {
        "results.ipynb", "label_quality.ipynb"}
    text = index.read_text()
    warnings = re.search(r'id="kit-warnings">(.*?)</div>', text, re.S)[1]
    assert "1 run (seed) per cell" in warnings and "failed" not in warnings   # notebooks ran
    assert page.remote_references(text) == [] and not ANY_REMOTE.search(text)

    sync_playwright = _browser()
    md = (out / "tables" / "smoke.md").read_text()
    first = re.search(r"^## (.+)$", md, re.M)[1]            # the batch's first table
    table_csv = out / "tables" / f"{writers.table_stem('smoke', first)}.csv"
    with table_csv.open(newline="") as f:
        expected = list(csv.reader(f))
    with sync_playwright() as p:
        browser = chromium(p)
        try:
            seen = _open(browser, index.as_uri(), tmp_path / "report.png")
            run_page = _open(browser, seen["links"][0])
            listing = _open(browser, (out / "reports" / "index.html").as_uri())
        finally:
            browser.close()
    assert seen["csv"] == [table_csv.name]
    assert seen["table"] == expected and len(expected) == 5       # header + 4 methods
    assert seen["images"] and all(ok and width > 0 for ok, width in seen["images"])
    assert len(seen["links"]) == 4 and all(u.startswith("file://") for u in seen["links"])
    assert run_page["images"] and all(ok and w > 0 for ok, w in run_page["images"])
    for view in (seen, run_page, listing):
        assert view["errors"] == [] and view["left"] == []
    assert (tmp_path / "report.png").stat().st_size > 10_000
    _reads_as_a_page(seen)


def _reads_as_a_page(seen: dict) -> None:
    """No Python repr on the page, each table once, none with a 0, 1, 2 ... index column."""
    assert not re.search(r"PosixPath|WindowsPath|<pandas\.|\bdtype: ", seen["text"]), seen["text"]
    tables = [t for t in seen["tables"] if len(t) > 1]
    assert len({repr(t) for t in tables}) == len(tables), "a table shown twice"
    for rows in tables:
        first = [row[0] for row in rows[1:]]
        assert first != [str(i) for i in range(len(first))], f"an index column: {rows[:3]}"
    if os.environ.get("SSA_KIT_SCREENSHOT"):
        _screenshot_for_the_docs(sync_playwright, tmp_path / "report.png")


def _screenshot_for_the_docs(sync_playwright, smoke: Path) -> None:
    """SSA_KIT_SCREENSHOT=PATH: the smoke report's screenshot there, or with
    SSA_KIT_SCREENSHOT_OF=outputs/reports/demo/index.html that page's (checked as the smoke
    page is), e.g. for docs/figures/demo-report.png."""
    target, other = os.environ["SSA_KIT_SCREENSHOT"], os.environ.get("SSA_KIT_SCREENSHOT_OF")
    if not other:
        shutil.copyfile(smoke, target)
        return
    with sync_playwright() as p:
        browser = chromium(p)
        try:
            seen = _open(browser, Path(other).resolve().as_uri(), Path(target))
        finally:
            browser.close()
    assert seen["errors"] == [] and seen["left"] == [] and seen["table"]
    assert all(ok and width > 0 for ok, width in seen["images"])


def test_a_finished_runs_failed_notebook_is_on_the_page(hand_made):
    """A run that finished ok but whose notebook failed after fit() (kit.batch: `notebook
    failed`): its row keeps status ok and says so in its error column, and a warning names it."""
    from kit.results.report import page_header
    profile, out, cfgs = hand_made
    run_dir = runs.run_dir_of(cfgs["bert", 1])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("fit(config)"),
                                         nbformat.v4.new_code_cell("plot()", outputs=[
                                             nbformat.v4.new_output(
                                                 "error", ename="ValueError",
                                                 evalue="the plot failed", traceback=[])])])
    nbformat.write(nb, runs.notebook_path(run_dir))
    grid = {r.run_id: r for r in page_header.grid_runs(profile)}
    row = grid[cfgs["bert", 1].run_id]
    assert (row.status, row.error) == ("ok", "notebook failed: ValueError: the plot failed")
    assert grid[cfgs["bert", 0].run_id].error == ""          # its notebook shows no error
    assert (f"1 finished run with a notebook that failed after training (the run counts; its "
            f"notebook shows the error): {row.run_id}: ValueError: the plot failed"
            in page_header.warnings(list(grid.values()), None, []))
