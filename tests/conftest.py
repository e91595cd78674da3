"""Shared test set-up: offline always, GLUE data from GLUE_DIR or ../shared/glue."""
import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"          # before transformers / datasets are imported
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GLUE_DIR = Path(os.environ.get("GLUE_DIR") or REPO.parent / "shared" / "glue")


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    if not GLUE_DIR.is_dir():
        pytest.fail(f"real GLUE data not found at {GLUE_DIR}: set GLUE_DIR")
    return GLUE_DIR
