"""A real JupyterLab, started from the project's venv, driven in the OS's headless Chromium as a
person drives it: open a notebook from the file browser, click a cell, Run > Run All Cells,
wait, look. Used by tests/test_jupyterlab.py.

What JupyterLab writes goes to a temporary folder (its config, runtime, data, settings and
workspaces; the kernels' IPython profile): nothing lands in the user's home or in the project.
Autosave is off and nothing ever presses Save, so an executed notebook is never written back
(committed notebooks carry no outputs); checkpoints would go to the temporary folder too.

What ran is read from the page's own notebook model (`window.jupyterapp`, exposed with
--LabApp.expose_app_in_browser): an error output is one whose output_type is "error" (the
rendered page shows errors and stderr streams alike, as application/vnd.jupyter.stderr). What
shows is read from the rendered page: images that decoded, HTML blocks by CSS class.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-extensions"]
# Playwright's waits (a browser start, a page load, a click) get 90 s, not its 30 s default: a
# page shares two cores with kernels, training runs and the other pytest worker
WAIT_S = 90.0
# front-end plugins a notebook run needs none of: the language server's (its server extension is
# off too: it would 404 and log errors), the extension manager, the terminal, the debugger and
# the Notebook 7 buttons. Fewer plugins start faster.
DISABLED_PLUGINS = ["@jupyterlab/lsp-extension",
                    "@jupyterlab/fileeditor-extension:language-server",
                    "@jupyterlab/notebook-extension:language-server",
                    "@jupyterlab/extensionmanager-extension", "@jupyterlab/terminal-extension",
                    "@jupyterlab/debugger-extension", "@jupyter-notebook/lab-extension"]
SERVER_EXTENSIONS_OFF = {"jupyter_lsp": False, "jupyter_server_terminals": False,
                         "notebook": False}
# user settings: never save a document by itself; no news toast, no update check (offline)
SETTINGS = {"@jupyterlab/docmanager-extension/plugin": {"autosave": False},
            "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                            "checkForUpdates": False}}
TOKEN = "ssa-kit-test"

# the open notebook at `path`, in short: its widget id, whether its model is loaded, its
# kernel's status, each code cell's execution count, whether an output is an error; and any
# dialog's text. Cheap: it is polled.
STATE_JS = """path => {
  for (const w of window.jupyterapp.shell.widgets('main')) {
    if (!w.context || w.context.path !== path) continue;
    const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
    const counts = [];
    let error = false;
    for (const cell of w.context.isReady ? w.context.model.cells : []) {
      if (cell.type !== 'code') continue;
      counts.push(cell.executionCount);
      for (let i = 0; i < cell.outputs.length; i++) error ||= cell.outputs.get(i).type === 'error';
    }
    const dialog = document.querySelector('.jp-Dialog');
    return {id: w.id, ready: w.context.isReady, status: kernel ? kernel.status : null,
            counts, error, dialog: dialog ? dialog.innerText : null};
  }
  return null;
}"""
# the open notebook at `path` as nbformat JSON
NOTEBOOK_JS = """path => {
  for (const w of window.jupyterapp.shell.widgets('main'))
    if (w.context && w.context.path === path) return w.context.model.toJSON();
}"""
# HTML blocks the kit's outputs mark with a CSS class, by what they are
BLOCKS = {"epochs": "ssa-epochs",       # a training cell's live epoch table
          "tokens": "ssa-tokens"}       # the token view
# what the notebook's panel shows: its outputs, their images (decoded or not), the BLOCKS
SHOWN_JS = """([id, blocks]) => {
  const panel = document.getElementById(id);
  const shown = {outputs: panel.querySelectorAll('.jp-OutputArea-output').length,
                 images: Array.from(panel.querySelectorAll('.jp-OutputArea-output img'),
                                    i => [i.complete, i.naturalWidth])};
  for (const [name, css] of Object.entries(blocks))
    shown[name] = panel.querySelectorAll(`.jp-OutputArea-output .${css}`).length;
  return shown;
}"""


def chromium(playwright, **options):
    """The OS's Chromium, headless, started by Playwright (`playwright`: sync_playwright()'s)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                      timeout=WAIT_S * 1000, **options)


def new_page(browser):
    """A 1280 x 900 page of `browser` whose waits without a timeout of their own (a page load, a
    click, a tab closing) get WAIT_S."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT_S * 1000)
    return page


def browser_or_skip(what: str):
    """Playwright's sync API, or a one-line skip naming what to install; with CI=true a missing
    browser fails `what` instead."""
    missing = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "playwright is not installed: pip install -e '.[test]'"
    if missing is None and not Path(CHROMIUM).exists():
        missing = f"no Chromium at {CHROMIUM}: apt-get install chromium"
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} must run in CI: {missing}")
        pytest.skip(missing)
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lab_environment(tmp: Path, env: dict[str, str]) -> dict[str, str]:
    """The server's (and so its kernels') environment: `env` over this process's, every Jupyter
    and IPython folder under `tmp`, with the page config and user settings above written there."""
    dirs = {name: tmp / name for name in ("config", "data", "runtime", "ipython")}
    labconfig = dirs["config"] / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": dict.fromkeys(DISABLED_PLUGINS, True)}))
    for plugin, values in SETTINGS.items():
        path = tmp / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    # the kernels import this checkout's kit (the tests' own), even where the venv's editable
    # install points at another checkout of the project
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "JUPYTER_CONFIG_DIR": str(dirs["config"]),
            "JUPYTER_DATA_DIR": str(dirs["data"]), "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
            "IPYTHONDIR": str(dirs["ipython"]), "PYTHONPATH": path, **env}


@contextlib.contextmanager
def lab_server(root: Path, tmp: Path, env: dict[str, str], meanwhile=None,
               timeout: float = 90.0):
    """`python -m jupyterlab` serving `root` on a free localhost port, from this interpreter's
    venv; `meanwhile()` is called while it starts (seconds), then it is waited for until it
    answers. Yields its base URL; stops it and its kernels at the end."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}",
           f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
           "--LabApp.expose_app_in_browser=True",
           f"--LabApp.user_settings_dir={tmp / 'settings'}",
           f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
           f"--FileContentsManager.checkpoints_kwargs={{'root_dir': '{tmp / 'checkpoints'}'}}",
           f"--ServerApp.jpserver_extensions={SERVER_EXTENSIONS_OFF!r}"]
    log = tmp / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(cmd, cwd=root, env=lab_environment(tmp, env), stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        if meanwhile is not None:
            meanwhile()
        _wait_until_up(server, f"{url}/api/status?token={TOKEN}", log, timeout)
        yield url
    finally:
        _stop(server)


def _wait_until_up(server: subprocess.Popen, status_url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(status_url, timeout=2):
                return
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log.read_text().splitlines()[-15:])
            raise RuntimeError(f"JupyterLab did not answer at {status_url} "
                               f"(exit {server.poll()}):\n{tail}")
        time.sleep(0.1)


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server, which shuts its kernels down; whatever of it is still alive 10 s
    later (the server, a kernel: each in a session of its own) gets SIGKILL. psutil checks a
    process is the one it found before signalling it (a pid may be reused)."""
    try:
        family = psutil.Process(server.pid).children(recursive=True)
    except psutil.Error:
        family = []
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=10)
    if server.poll() is None:
        server.kill()
    server.wait()
    for process in family:
        with contextlib.suppress(psutil.Error):
            process.kill()


class Lab:
    """One browser page (new_page's) on JupyterLab, with notebooks opened in tabs as a person
    opens them."""

    def __init__(self, page, url: str, log: Path, folder: str = "notebooks"):
        self.page, self.url, self.log, self.folder = page, url, log, folder
        self.opened: list[str] = []
        self.clicked_again: list[str] = []       # notebooks whose first double-click was lost
        self.console_errors: list[str] = []       # the page's console errors and exceptions
        page.on("console", lambda msg: msg.type == "error" and self.console_errors.append(
            msg.text))
        page.on("pageerror", lambda err: self.console_errors.append(str(err)))

    def path(self, name: str) -> str:
        return f"{self.folder}/{name}.ipynb"

    def fail(self, what: str) -> None:
        """Fails the test with `what`, the page's console errors and the server log's end."""
        tail = "\n".join(self.log.read_text().splitlines()[-20:])
        pytest.fail(f"{what}\nconsole errors: {self.console_errors}\nserver log's end:\n{tail}")

    def until(self, js: str, arg, timeout: float, polling: int = 200) -> bool:
        """Whether `js(arg)`, polled every `polling` ms, became truthy within `timeout` s."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout
        try:
            self.page.wait_for_function(js, arg=arg, polling=polling, timeout=timeout * 1000)
        except PlaywrightTimeout:
            return False
        return True

    def state(self, name: str) -> dict | None:
        return self.page.evaluate(STATE_JS, self.path(name))

    def open(self, name: str, tries: int = 3, timeout: float = 30.0) -> None:
        """The first notebook by its URL (/lab/tree/...); the next ones by a double-click in
        the file browser, each in a new tab. A double-click can be lost while the listing
        redraws (a kernel starting refreshes it): no tab `timeout` s later, it is
        double-clicked again, as a person would, up to `tries` times."""
        if not self.opened:
            self.page.goto(f"{self.url}/lab/tree/{self.path(name)}?token={TOKEN}")
            self.page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell")
        else:
            for attempt in range(tries):
                if attempt:
                    self.clicked_again.append(name)
                self.page.locator(".jp-DirListing-item", has_text=f"{name}.ipynb").dblclick()
                if self.until(f"p => ({STATE_JS})(p)", self.path(name), timeout):
                    break
            else:
                self.fail(f"{name}: no tab after {tries} double-clicks in the file browser")
        self.opened.append(name)

    def wait_idle(self, timeout: float = 240.0) -> None:
        """Until every open notebook is loaded and its kernel idle (a Run All before the kernel
        is there runs nothing); past `timeout` s, fails with what each shows."""
        idle = (f"ps => ps.every(p => {{ const s = ({STATE_JS})(p); "
                f"return s && s.ready && s.status === 'idle'; }})")
        if self.until(idle, [self.path(n) for n in self.opened], timeout):
            return
        states = {name: self.state(name) for name in self.opened}
        self.fail(f"kernels not idle after {timeout:.0f} s: " + "; ".join(
            f"{name}: {s and {k: s[k] for k in ('ready', 'status', 'dialog')}}"
            for name, s in states.items() if not (s and s["ready"] and s["status"] == "idle")))

    def run_all(self, name: str) -> None:
        """Its tab to the front, a click on its first cell and Run > Run All Cells."""
        self.page.locator(".lm-TabBar-tab", has_text=f"{name}.ipynb").click()
        panel = f"[id='{self.state(name)['id']}']"
        self.page.locator(f"{panel} .jp-Cell .jp-InputPrompt").first.click()
        self.page.get_by_role("menuitem", name="Run", exact=True).click()
        self.page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()

    def wait_done(self, name: str, deadline: float) -> dict:
        """The notebook (nbformat JSON) once its kernel is idle and every code cell ran or one
        raised (Run All stops there). A dialog, a dead kernel or the deadline (time.monotonic)
        fails with what it shows."""
        done = (f"p => {{ const s = ({STATE_JS})(p); return s.dialog || s.status === 'dead' || "
                f"s.status === 'idle' && (s.error || s.counts.every(n => n)); }}")
        self.until(done, self.path(name), max(deadline - time.monotonic(), 1), polling=500)
        state = self.state(name)
        if state["dialog"]:
            self.fail(f"{name}: JupyterLab shows a dialog: {state['dialog']}")
        if state["status"] != "idle" or not (state["error"] or all(state["counts"])):
            self.fail(f"{name}: not done (kernel {state['status']}, execution counts "
                      f"{state['counts']})")
        return self.page.evaluate(NOTEBOOK_JS, self.path(name))

    def shown(self, name: str) -> dict:
        return self.page.evaluate(SHOWN_JS, [self.state(name)["id"], BLOCKS])

    def screenshot(self, name: str, path: Path, first: str, block: str = "start") -> None:
        """Its tab to the front, scrolled to the cell of the first element matching `first`
        (that cell at the top of the view: block "start", or at its bottom: "end"), as a
        PNG."""
        self.page.locator(".lm-TabBar-tab", has_text=f"{name}.ipynb").click()
        target = self.page.locator(f"[id='{self.state(name)['id']}'] {first}").first
        if target.count():
            target.evaluate(f"e => (e.closest('.jp-Cell') || e).scrollIntoView("
                            f"{{block: '{block}'}})")
        self.page.screenshot(path=str(path))

    def close_without_saving(self, name: str) -> bool:
        """Close its tab as a person does (the tab's x) and answer JupyterLab's "Save your
        work?" with Discard: True when it asked (the notebook had changed), False when not."""
        tab = self.page.locator(".lm-TabBar-tab", has_text=f"{name}.ipynb")
        tab.locator(".lm-TabBar-tabCloseIcon").click()
        asked = self.page.wait_for_function(
            f"p => document.querySelector('.jp-Dialog') ? 'asked' : !({STATE_JS})(p) && 'closed'",
            arg=self.path(name), polling=100).json_value() == "asked"
        if asked:
            self.page.locator(".jp-Dialog button", has_text="Discard").click()
        tab.wait_for(state="detached")
        return asked


def unexplained(console_errors: list[str], server_log: Path) -> list[str]:
    """The page's console errors less the one known server race: JupyterLab lists the kernels
    (GET /api/kernels) while one is starting, before jupyter_server has set its
    `last_activity`, and gets a 500 (it asks again; a person sees nothing). Each such 500 in the
    server's log explains one "status of 500" console line."""
    log = server_log.read_text()
    races = len(re.findall(r"\] 500 GET /api/kernels\?", log))
    if races != log.count("] 500 ") or races > log.count("'last_activity' trait"):
        races = 0
    left = []
    for line in console_errors:
        if races and "the server responded with a status of 500" in line:
            races -= 1
        else:
            left.append(line)
    return left


def errors(nb: dict) -> list[str]:
    """Every error output of the notebook as "cell N: Name: value"."""
    return [f"cell {i}: {o['ename']}: {o['evalue']}" for i, cell in enumerate(nb["cells"])
            for o in cell.get("outputs", []) if o["output_type"] == "error"]


def stream_text(nb: dict, name: str) -> str:
    """All the notebook's `name` stream ("stdout" or "stderr": JupyterLab paints the latter
    red), in order."""
    return "".join(o["text"] if isinstance(o["text"], str) else "".join(o["text"])
                   for cell in nb["cells"] for o in cell.get("outputs", [])
                   if o["output_type"] == "stream" and o["name"] == name)
