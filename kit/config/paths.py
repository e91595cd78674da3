"""THE project folder, and where a relative path given to the kit points.

A notebook app (JupyterLab, classic Notebook, VS Code) starts a notebook's kernel in notebooks/,
papermill and the batch (kit.cluster.kernels) in the project folder. Both must find the same outputs/,
data/ and tests/fixtures/, so a relative path never means "relative to wherever the kernel
happened to start":

- `project_path(p)`: an absolute path stays; a relative one is relative to the project folder
  when the current directory is the project or a folder inside it (notebooks/ is), else to the
  current directory (someone running the kit from a folder of their own keeps the usual
  meaning of a relative path);
- `input_path(p)`: the same for what a run reads (csv_path, csv_test_path, glue_dir, a local
  model folder, reuse_labels_from), except that a relative path which exists only relative to
  the current directory is taken from there (a CSV put beside the notebook, `csv_path="my.csv"`);
- `outputs_root(outputs_dir)`: the outputs folder; the default "outputs" means
  $SSA_KIT_OUTPUTS when that is set (in notebooks too);
- `kit_commit()`: the project's git commit, which every run records (kit.train.provenance) and
  a reused run is compared with.

Config strings stay as given (a run id never depends on where a path was resolved): these
functions are applied where a path is used (kit.runs.runs_root, kit.data.pipeline, the token
cache, the results writers). Nothing here imports torch or the rest of the kit.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]     # kit/config/paths.py -> ../../..
DEFAULT_OUTPUTS = "outputs"                        # RunConfig.outputs_dir's default
OUTPUTS_ENV = "SSA_KIT_OUTPUTS"                    # where the default outputs folder is instead


def base() -> Path:
    """The folder a relative path is relative to: the project folder when the current
    directory is the project or inside it, else the current directory."""
    cwd = Path.cwd().resolve()
    return PROJECT if cwd == PROJECT or PROJECT in cwd.parents else cwd


def project_path(path: str | os.PathLike) -> Path:
    """`path` as an absolute path by the rule of `base` (`~` expanded)."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else base() / path


def input_path(path: str | os.PathLike) -> Path:
    """An input file or folder: `project_path(path)`, or, when only the current directory
    holds a relative `path` (a file beside the notebook), that one."""
    chosen = project_path(path)
    here = Path(path).expanduser()
    if not chosen.exists() and not here.is_absolute() and here.exists():
        return here.absolute()
    return chosen


def outputs_root(outputs_dir: str | os.PathLike = DEFAULT_OUTPUTS) -> Path:
    """The outputs folder as an absolute path: $SSA_KIT_OUTPUTS for the default "outputs" when
    it is set, else `project_path(outputs_dir)`."""
    chosen = os.environ.get(OUTPUTS_ENV) if Path(outputs_dir) == Path(DEFAULT_OUTPUTS) else None
    return project_path(chosen or outputs_dir)


def kit_commit(repo: Path = PROJECT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the kit's git checkout; (None, None) without git or a checkout (a
    pip-installed kit). Dirty counts tracked files only: outputs/ and other untracked files
    change no result. Not cached: a long-lived kernel may see commits between its runs (~10 ms).
    Only the kit's own checkout counts: a kit installed into a venv inside some other repository
    would otherwise report that repository's commit."""
    if not (repo / ".git").exists():                  # a folder, or a file in a worktree
        return None, None
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], text=True,
                              capture_output=True, timeout=10)
        if head.returncode != 0:
            return None, None
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                                 "--untracked-files=no"], text=True, capture_output=True,
                                timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head.stdout.strip(), bool(status.stdout.strip())
