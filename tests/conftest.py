"""Shared test set-up: offline always; real GLUE data from the project's own copy (data/glue)."""
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"          # before transformers / datasets are imported
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("GLUE_DIR", None)            # tests read the project's copy, whatever the shell says

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# property-based tests draw the same cases on every run (seeded): a CI failure reproduces here
settings.register_profile("kit", derandomize=True, deadline=None)
settings.load_profile("kit")

REPO = Path(__file__).resolve().parents[1]
GLUE_DIR = REPO / "data" / "glue"


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    assert GLUE_DIR.is_dir(), f"the project's GLUE copy is missing: {GLUE_DIR}"
    return GLUE_DIR
