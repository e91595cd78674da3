"""What the rerun tests compare of a run folder (tests/test_progress.py, tests/test_run.py)."""
from kit import runs


def files(run_dir) -> dict:
    """A run folder's files (not its dot-files) and their bytes."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


def hidden(cfg) -> list[str]:
    """The dot-folders beside a run's folder that hold its files: a finished run set aside."""
    return sorted(p.name for p in runs.runs_root(cfg.outputs_dir).iterdir()
                  if p.name.startswith(".") and cfg.run_id in p.name)
