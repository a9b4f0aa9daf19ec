"""Shared pytest fixtures: where the binary, the default model, the reference data
(build/testdata, provisioned by scripts/get-testdata.py) and the derived test models are.
Paths come from the environment set by scripts/run-tests.sh, with defaults for running
pytest by hand from the repo root.

A reference that is missing fails its tests; it never skips them. And a test module in
which every test was skipped has not run at all: the session then fails (see
pytest_sessionfinish), so a whole suite cannot vanish into skips."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(os.environ.get("TESSERA_ROOT", pathlib.Path(__file__).resolve().parents[2]))
TESTDATA = pathlib.Path(os.environ.get("TESSERA_TESTDATA", ROOT / "build" / "testdata"))
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
def testdata():
    assert (TESTDATA / ".ok").exists(), f"{TESTDATA} incomplete: run scripts/get-testdata.py (make test does)"
    return TESTDATA


_outcomes = {}  # module path -> {"passed": n, "skipped": n, ...}


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        counts = _outcomes.setdefault(report.fspath, {})
        counts[report.outcome] = counts.get(report.outcome, 0) + 1


def _idle_modules():
    return sorted(m for m, c in _outcomes.items() if c.get("skipped") and not c.get("passed") and not c.get("failed"))


def pytest_sessionfinish(session, exitstatus):
    if _idle_modules():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    idle = _idle_modules()
    if idle:
        terminalreporter.write_sep("=", "suites that did not run", red=True)
        for m in idle:
            terminalreporter.write_line(f"FAILED {m}: every test was skipped")
