"""Progress that reads well wherever a run happens.

- In a notebook opened by a person (a Jupyter kernel, SSA_KIT_PROGRESS not `lines`): one
  display per run, updated in place: tqdm's widget bar, reset for each loop (an epoch's
  training, evaluation, probing), and a table of the finished epochs (counted from 1: train
  loss, dev metrics, the best epoch marked). Nothing goes to stderr, which JupyterLab paints as
  red error blocks; one-off notes (resumed, reused) are plain stdout text. A notebook papermill
  runs on its own keeps the table, as it last was, as HTML output.
- In a terminal: tqdm's usual bar, redrawn in place, and one line per epoch.
- In a log, a CI job or a batch (papermill runs the notebook; the kernel's stderr is streamed to
  the batch's terminal): one plain line per update, at most one every `LINE_INTERVAL_S`
  seconds, no carriage returns and no widget frames, and one line per epoch.

The batch runner sets SSA_KIT_PROGRESS=lines for its kernels; SSA_KIT_PROGRESS=off silences
the bars and the epoch lines, =auto (the default) decides as above.

metrics.json, history.csv and checkpoints count epochs from 0 (`epoch`, `best_epoch`); what a
person reads counts from 1: `epoch_number` is the one conversion, used by every display.
"""
from __future__ import annotations

import html
import os
import sys
from datetime import datetime

from tqdm import tqdm as terminal_tqdm

from kit.train.metrics import flatten_metrics

LINE_INTERVAL_S = 10.0
QUIET_S = 3.0          # loops shorter than this print no line (the epoch's summary line says it)
ENV = "SSA_KIT_PROGRESS"


def epoch_number(epoch):
    """The epoch a person reads, counted from 1, of a 0-based epoch index (an int, or a pandas
    column of them): records keep the index, displays show this."""
    return epoch + 1


def shown_epoch(epoch: int, epochs: int) -> str:
    """`1/2` for epoch 0 of 2: progress lines count from 1; records keep the 0-based index."""
    return f"{epoch_number(epoch)}/{epochs}"


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


def _shell():
    """IPython's running shell, or None (IPython not even imported: a plain process)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (JupyterLab, papermill), as tqdm.auto decides."""
    shell = _shell()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def _mode() -> str:
    """off | lines | notebook | terminal (see the module docstring)."""
    mode = os.environ.get(ENV, "auto")
    if mode in ("off", "lines"):
        return mode
    if in_notebook():
        return "notebook"
    return "terminal" if sys.stderr.isatty() else "lines"   # a file or a pipe: lines


def bar(iterable=None, desc: str = "", total: int | None = None, **kwargs):
    """A progress bar over `iterable` suited to where it is shown (see the module docstring)."""
    mode = _mode()
    if mode == "off":
        kwargs["disable"] = True
    if mode == "lines":
        kwargs.setdefault("file", sys.stderr)
        return LineBar(iterable, desc=desc, total=total, **kwargs)
    if mode == "notebook":
        return CellBar(iterable, desc, total, **kwargs)
    return terminal_tqdm(iterable, desc=desc, total=total, **kwargs)


class CellBar:
    """A notebook's bar: the cell's one tqdm widget (tqdm.notebook), reset for each loop
    (an epoch's training, evaluation, SSA probing), so a run shows one bar and its epoch table
    rather than a bar per loop. Without ipywidgets: a text bar on stdout, redrawn in place."""
    shared: tuple | None = None            # (cell, its tqdm)

    def __init__(self, iterable, desc: str, total: int | None, initial: int = 0,
                 disable: bool = False, **_):
        self.iterable, self.bar = iterable, None
        if disable:
            return
        cell = _cell()
        if CellBar.shared is None or CellBar.shared[0] != cell:
            CellBar.shared = (cell, _widget_bar(desc))
        self.bar = CellBar.shared[1]
        self.bar.reset(total=len(iterable) if total is None else total)
        self.bar.set_description(desc, refresh=False)
        self.bar.set_postfix_str("", refresh=False)    # the last loop's loss is not this one's
        self.bar.n = self.bar.last_print_n = initial
        self.bar.refresh()

    def __iter__(self):
        for item in self.iterable:
            yield item
            if self.bar is not None:
                self.bar.update()

    def set_postfix(self, **kwargs) -> None:
        if self.bar is not None:
            self.bar.set_postfix(**kwargs)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.refresh()             # the loop's last count (updates are throttled)


def _widget_bar(desc: str):
    try:
        from tqdm.notebook import tqdm as widget_tqdm
        return widget_tqdm(desc=desc)
    except ImportError:                    # no ipywidgets: stdout is still no red block
        return terminal_tqdm(desc=desc, file=sys.stdout)


def note(line: str) -> None:
    """A one-off line beside the bars (a resumed run): stdout in a notebook, else stderr, so a
    batch streams it."""
    mode = _mode()
    if mode != "off":
        print(line, file=sys.stdout if mode == "notebook" else sys.stderr, flush=True)


def brief(dev_metrics: dict) -> str:
    """`accuracy 0.6123, f1 0.5800` from a dev metrics dict (multi-task: `RTE/accuracy ...`)."""
    flat = flatten_metrics(dev_metrics)
    return ", ".join(f"{k} {v:.4f}" for k, v in flat.items() if k != "score" or len(flat) == 1)


def dev_columns(dev_metrics: dict) -> dict[str, float]:
    """The dev metrics a person reads, by name: a single-task run's own (its selection `score`
    only when it is the only one), a multi-task run's mean task score, which selects its best
    epoch, then each task's metrics (`RTE/accuracy`; its score is one of them)."""
    flat = flatten_metrics(dev_metrics)
    if not any("/" in k for k in flat):
        return {k: v for k, v in flat.items() if k != "score" or len(flat) == 1}
    return {"mean score": flat["score"],
            **{k: v for k, v in flat.items() if "/" in k and not k.endswith("/score")}}


def epoch_done(record: dict, cfg, best: bool) -> None:
    """An epoch's record (kit.train.loop: epoch, dev, train_loss, wall_s) as it ends: a row of
    the notebook's epoch table, or the line `epoch 1/3: dev accuracy 0.6123, train loss 0.5000
    (best)` in a terminal or a log. `best`: it is the best epoch so far."""
    mode = _mode()
    if mode == "notebook":
        EpochTable.of(cfg, record).add(record, best)
    elif mode != "off":
        note(f"epoch {epoch_number(record['epoch'])}/{cfg.epochs}: dev {brief(record['dev'])}, "
             f"train loss {record['train_loss']:.4f}{' (best)' if best else ''}")


class EpochTable:
    """A notebook's table of one run's finished epochs: one display, updated in place
    (IPython's display_id), so the cell shows the run's state rather than a scroll of lines."""
    current: EpochTable | None = None

    def __init__(self, run_id: str, epochs: int, cell):
        self.run_id, self.epochs, self.cell = run_id, epochs, cell
        self.rows: list[dict] = []
        self.best: int | None = None
        self.handle = None

    @classmethod
    def of(cls, cfg, record: dict) -> EpochTable:
        """The table this record belongs to: the current one, or a new one for another run,
        another cell, or a run that starts over (its epoch does not follow the last row's)."""
        table, cell = cls.current, _cell()
        if (table is None or table.run_id != cfg.run_id or table.cell != cell
                or record["epoch"] <= table.rows[-1]["epoch"]):
            table = cls.current = cls(cfg.run_id, cfg.epochs, cell)
        return table

    def add(self, record: dict, best: bool) -> None:
        self.rows.append({"epoch": record["epoch"], "train loss": record["train_loss"],
                          **dev_columns(record["dev"])})
        if best:
            self.best = len(self.rows) - 1
        self.show()

    def html(self) -> str:
        import pandas as pd     # only where a notebook shows the table: a run's process spares it
        frame = pd.DataFrame(self.rows)
        frame["best"] = ["★" if i == self.best else "" for i in range(len(frame))]
        frame["epoch"] = [f"{epoch_number(e)}/{self.epochs}" for e in frame["epoch"]]
        head = (f"<b>{html.escape(self.run_id)}</b>: {len(self.rows)} of {self.epochs} "
                "epoch(s) done (★ best on dev)")
        table = frame.to_html(index=False, float_format="{:.4f}".format)
        return f'<div class="ssa-epochs">{head}{table}</div>'     # (a class pages can find)

    def show(self) -> None:
        from IPython.display import HTML, display
        if self.handle is None:
            self.handle = display(HTML(self.html()), display_id=True)
        else:
            self.handle.update(HTML(self.html()))


def _cell():
    """Which cell is running (IPython's execution count): a table belongs to one cell."""
    return getattr(_shell(), "execution_count", None)


# ---------------------------------------------------------------- a finished run reused

def reuse_line(metrics: dict, checkout: tuple[str | None, bool | None],
               rerun: str = "rerun=True") -> str:
    """One line saying that `metrics` (a finished run's metrics.json) are reused rather than
    trained: its run id, when and at which commit it was trained, a warning when that commit is
    not `checkout` (kit.config.paths.kit_commit(): the code now) or either had uncommitted
    changes, and how to train it again (`rerun`, as the reader spells it)."""
    env = metrics.get("environment") or {}
    commit, dirty = env.get("kit_commit"), env.get("kit_dirty")
    now, now_dirty = checkout
    when = metrics.get("finished_at")
    trained = (f"trained {datetime.fromisoformat(when):%Y-%m-%d %H:%M}" if when
               else "trained earlier")
    trained += (f" at commit {commit[:8]}" if commit
                else " outside a git checkout" if "kit_commit" in env else "")
    warn = [text for flag, text in (
        (commit and now and commit != now, f"the checkout is now at {(now or '')[:8]}"),
        (dirty, "it was trained with uncommitted changes"),
        (now_dirty, "the checkout has uncommitted changes")) if flag]
    warning = f"; WARNING: {', '.join(warn)}: its numbers may not be this code's" if warn else ""
    return (f"reused finished run {metrics.get('run_id')} ({trained}){warning}; "
            f"{rerun} trains it again")


def reused(metrics: dict, checkout: tuple[str | None, bool | None]) -> None:
    """Say that a finished run is reused (`reuse_line`): stdout in a notebook, else stderr (a
    terminal, a log); even with SSA_KIT_PROGRESS=off, since it is about the numbers."""
    notebook = in_notebook() and _mode() != "lines"
    print(reuse_line(metrics, checkout), file=sys.stdout if notebook else sys.stderr, flush=True)
