"""Shared pytest fixtures: where the binary, the default model, shared/ test data and
the derived test models are. Paths come from the environment set by
scripts/run-tests.sh, with defaults for running pytest by hand from the repo root."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(os.environ.get("TESSERA_ROOT", pathlib.Path(__file__).resolve().parents[2]))
SHARED = pathlib.Path(os.environ.get("TESSERA_SHARED", ROOT.parent / "shared"))
BUILD = pathlib.Path(os.environ.get("TESSERA_BUILD", ROOT / "build"))
BIN = pathlib.Path(os.environ.get("TESSERA_BIN", BUILD / "tessera"))
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# Models derived from the default one (F16 GGUF, HF safetensors dir, tiny random
# qwen2/qwen3) are written here by scripts/make-test-models.py.
TEST_MODELS = BUILD / "testmodels"


@pytest.fixture(scope="session")
def tessera_bin():
    assert BIN.exists(), f"{BIN} not built"
    return BIN


@pytest.fixture(scope="session")
def default_model():
    assert DEFAULT_MODEL.exists(), f"{DEFAULT_MODEL} missing: run make model"
    return DEFAULT_MODEL


@pytest.fixture(scope="session")
def shared_dir():
    assert SHARED.exists(), f"{SHARED} missing"
    return SHARED
