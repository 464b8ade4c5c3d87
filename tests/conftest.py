"""Every test runs offline with a private Hugging Face cache."""

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_HF_HOME = tempfile.mkdtemp(prefix="robust-pretrain-hf-home-")
os.environ["HF_HOME"] = _HF_HOME
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["WANDB_DISABLED"] = "true"

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        raise RuntimeError(f"shared data not found at {SHARED_DATA}; clone the project next to ../shared")
    return SHARED_DATA


@pytest.fixture
def local_hub() -> Iterator:
    """A local Hub-compatible server, with the in-process client pointed at it (online) for the test's duration."""
    from local_hub import LocalHubServer, use_local_hub

    with LocalHubServer() as hub, use_local_hub(hub.endpoint):
        yield hub
