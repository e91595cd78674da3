"""./run_all.sh setup: set-up alone, and a torch already in the environment kept (a venv over a
cluster's own CUDA torch, a conda env as VENV): a stand-in venv whose python sees a stub torch
distribution and logs every pip call."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stand_in_venv(root: Path) -> Path:
    """VENV/bin/python: this interpreter with a stub `torch` 2.99.0+cu999 (a package and its
    dist-info, as a cluster's module system would put it on the path) before everything else;
    `-m pip` is logged and refused, so any install shows."""
    site = root / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text('__version__ = "2.99.0+cu999"\n')
    info = site / "torch-2.99.0+cu999.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.99.0+cu999\n")
    (root / "bin").mkdir()
    python = root / "bin" / "python"
    python.write_text(f"""#!/bin/bash
if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$@" >> {root}/pip.log; exit 1; fi
PYTHONPATH={site}:{REPO}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    return root


def test_setup_alone_keeps_the_torch_it_finds(tmp_path):
    venv = stand_in_venv(tmp_path / "venv")
    done = subprocess.run(["bash", str(REPO / "run_all.sh"), "setup"], cwd=tmp_path,
                          env={**os.environ, "VENV": str(venv)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (f"set-up done: {venv} (torch 2.99.0+cu999); every command after it "
                           "runs offline (the hub only for models and GLUE tasks not fetched: "
                           "./run_all.sh fetch)\n")
    assert not (venv / "pip.log").exists()           # nothing installed, torch kept
