"""run_all.sh, the one entry point: its help names every subcommand it dispatches, without a
set-up (no venv is made or touched to print it)."""
import os
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


@pytest.mark.parametrize("version, refused", [("4.46.3", True), ("4.57.1", True),
                                              ("5.0.0", False), ("5.24.0.dev0", False)])
def test_an_older_transformers_stops_the_kit_at_import_in_one_line(tmp_path, version, refused):
    """pyproject says transformers>=5; a Python with 4.x (a GPU image's) stops at `import kit`
    with one line naming both versions, exit 1, before any run. The installed version is faked
    by a package metadata folder first on the path (what importlib.metadata reads)."""
    import subprocess
    import sys
    dist = tmp_path / f"transformers-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", "import kit"], env=env, capture_output=True,
                          text=True, cwd=tmp_path)
    if not refused:
        assert (done.returncode, done.stderr) == (0, "")
        return
    assert done.returncode == 1
    assert done.stderr == (f"ssa-kit needs transformers >= 5; this Python has transformers "
                           f"{version}: pip install 'transformers>=5' (docs/gpu.md)\n")
