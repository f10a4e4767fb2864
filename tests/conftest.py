from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

MODEL_DIR = Path(str(resources.files("shardlab.problems") / "data" / "models"))


@pytest.fixture
def llama8b_config() -> dict:
    return json.loads((MODEL_DIR / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
