"""Nothing to show: `NoRuns`, one line naming the command that makes the runs (no traceback, in
a notebook too), raised by the tables, the figures and the notebooks' views alike; `MAIN`, the
profile `./run_all.sh` runs, and `run_command`, the command that runs a profile."""
from __future__ import annotations

MAIN = "demo"                       # the profile `./run_all.sh` runs


class NoRuns(ValueError):
    """Nothing to show, and the command that makes it, in one line. IPython shows an exception
    with `_render_traceback_` as the lines it returns: a notebook shows this line, not a
    traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def run_command(profile: str) -> str:
    return "./run_all.sh" if profile == MAIN else f"./run_all.sh {profile}"
