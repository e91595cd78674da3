"""run_all.sh, the one entry point: its help names every subcommand it dispatches, without a
set-up (no venv is made or touched to print it)."""
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "run_all.sh"


def dispatched() -> set[str]:
    """The words of run_all.sh's last `case` (the commands it runs after set-up)."""
    body = SCRIPT.read_text().rsplit('case "${1:-demo}" in', 1)[1]
    return set(re.findall(r"^  (\w+)\)$", body, re.M))


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_help_lists_each_subcommand_once_and_points_further(flag, tmp_path):
    done = subprocess.run([str(SCRIPT), flag], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "VENV": str(tmp_path / "absent")})
    assert done.returncode == 0 and done.stderr == ""
    listed = re.findall(r"^  (\(nothing\)|\w+)\s", done.stdout, re.M)
    assert dispatched() == {"test", "run", "doctor", "slurm", "report", "plan", "fetch", "setup"}
    assert sorted(listed) == sorted(["(nothing)", "PROFILE", *dispatched()])
    assert "python -m kit.batch --help" in done.stdout
    assert "python -m kit.run --help" in done.stdout
    assert not (tmp_path / "absent").exists()          # no set-up to print help
