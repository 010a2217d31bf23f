"""Shared fixtures: the ``xp`` fixture runs a test on every available array backend."""

from pathlib import Path

import pytest

from amopt.backends import Backend

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"

_BACKENDS = Backend.available()
# array-api-strict is part of the test extra: a missing install must fail loudly, not skip.
assert Backend.ARRAY_API_STRICT in _BACKENDS, "install the test extra: pip install -e '.[test]'"


@pytest.fixture(params=_BACKENDS, ids=[b.value for b in _BACKENDS])
def backend(request) -> Backend:
    return request.param


@pytest.fixture
def xp(backend):
    """The compat-wrapped namespace of each available backend (numpy, strict, torch, cupy)."""
    return backend.namespace()


@pytest.fixture
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.skip(f"shared data directory not found at {DATA_DIR}")
    return DATA_DIR
