"""A pytest plugin that appends every failure's test id and traceback to a file the moment the
test fails: `python -m pytest -p bench.failure_log --failure-log PATH ...` (from the project
folder). A run cut by a time limit, or a machine taken back mid-run, still leaves the reason of
each failure so far; the terminal's summary comes only at the end. Under pytest-xdist the
controller writes (the workers send it their reports), so each failure is written once."""
from __future__ import annotations

from pathlib import Path


def pytest_addoption(parser) -> None:
    parser.addoption("--failure-log", metavar="PATH", default=None,
                     help="append each failing test's id and traceback to PATH as it fails")


def pytest_configure(config) -> None:
    path = config.getoption("failure_log")
    if path and not hasattr(config, "workerinput"):         # an xdist worker: its controller
        config.pluginmanager.register(FailureLog(Path(path)), "failure-log-writer")


class FailureLog:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, report) -> None:
        """`<node id> (<phase>)`, the traceback, a blank line; closed (so on disk) at once."""
        if not report.failed:
            return
        when = getattr(report, "when", "collect")            # a collect report has no phase
        with self.path.open("a", encoding="utf-8") as out:
            out.write(f"{report.nodeid or report.fspath} ({when})\n{report.longreprtext}\n\n")

    def pytest_runtest_logreport(self, report) -> None:
        self.write(report)

    def pytest_collectreport(self, report) -> None:          # a test file that cannot import
        self.write(report)
