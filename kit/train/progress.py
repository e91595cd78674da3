"""Progress bars that read well wherever a run happens.

- In a notebook opened by a person: tqdm's widget (tqdm.auto).
- In a terminal: tqdm's usual bar, redrawn in place.
- In a log, a CI job or a batch (papermill runs the notebook; the kernel's stderr is streamed to
  the batch's terminal): one plain line per update, at most one every `LINE_INTERVAL_S`
  seconds, no carriage returns and no widget frames.

The batch runner sets SSA_KIT_PROGRESS=lines for its kernels; SSA_KIT_PROGRESS=off silences
the bars, =auto (the default) decides as above.
"""
from __future__ import annotations

import os
import sys

from tqdm import tqdm as terminal_tqdm
from tqdm.auto import tqdm as auto_tqdm

LINE_INTERVAL_S = 10.0
QUIET_S = 3.0          # loops shorter than this print no line (the epoch's summary line says it)
ENV = "SSA_KIT_PROGRESS"


class LineBar(terminal_tqdm):
    """tqdm that writes each refresh as its own line (for logs); the final state is a line too."""

    def __init__(self, *args, **kwargs):
        kwargs.update(leave=False, ascii=True, dynamic_ncols=False)
        kwargs.setdefault("mininterval", LINE_INTERVAL_S)
        kwargs.setdefault("delay", QUIET_S)
        self.printed_at: int | None = None    # the count of the last line written
        kwargs.setdefault("bar_format", "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} "
                                        "[{elapsed}<{remaining}, {rate_fmt}]{postfix}")
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if msg == "":                  # tqdm clearing its bar: there is nothing to clear in a log
            return False               # (False: tqdm then writes no "\r" either)
        self.fp.write(f"{self if msg is None else msg}\n")
        self.fp.flush()
        self.printed_at = self.n
        return True

    def close(self):
        if not self.disable and self.printed_at not in (None, self.n):
            self.display()             # a long loop's final count and time, once
        super().close()


def _mode() -> str:
    mode = os.environ.get(ENV, "auto")
    if mode not in ("auto", "lines", "off"):
        return "auto"
    if mode == "auto" and "ipykernel" not in sys.modules and not sys.stderr.isatty():
        return "lines"                 # a plain process writing to a file or a pipe
    return mode


def bar(iterable=None, desc: str = "", total: int | None = None, **kwargs):
    """A progress bar over `iterable` suited to where it is shown (see the module docstring)."""
    mode = _mode()
    if mode == "off":
        kwargs["disable"] = True
    cls = LineBar if mode == "lines" else auto_tqdm
    if mode == "lines":
        kwargs.setdefault("file", sys.stderr)
    return cls(iterable, desc=desc, total=total, **kwargs)


def note(line: str) -> None:
    """A one-off line beside the bars (an epoch's dev metric): stderr, so a batch streams it."""
    if _mode() != "off":
        print(line, file=sys.stderr, flush=True)
