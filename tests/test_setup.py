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
    (site / "torch" / "__init__.py").write_text('from torch import version\n'
                                                '__version__ = "2.99.0+cu999"\n')
    (site / "torch" / "version.py").write_text('cuda = "99.9"\nhip = None\n')
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
    assert done.stdout == (f"set-up done: {venv}, torch 2.99.0+cu999 (CUDA 99.9); every "
                           "command after it runs offline (the hub only for models and GLUE "
                           "tasks not fetched: ./run_all.sh fetch)\n")
    assert not (venv / "pip.log").exists()           # nothing installed, torch kept


def test_torch_index_url_is_where_setup_installs_torch_from(tmp_path):
    """A venv where nothing is installed and pip succeeds (logged): TORCH_INDEX_URL reaches the
    torch install only; the kit's packages come from pip's own index."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f"""#!/bin/bash
if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$@" >> {venv}/pip.log; exit 0; fi
exit 1
""")
    (venv / "bin" / "python").chmod(0o755)
    url = "https://download.pytorch.org/whl/cu128"
    done = subprocess.run(["bash", str(REPO / "run_all.sh"), "setup"], cwd=tmp_path,
                          env={**os.environ, "VENV": str(venv), "TORCH_INDEX_URL": url},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (venv / "pip.log").read_text().splitlines() == [
        f"-m pip install --disable-pip-version-check --index-url {url} torch==2.13.0",
        "-m pip install --disable-pip-version-check -e .[test]"]
