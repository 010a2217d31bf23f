"""Shared fixtures: the ``xp`` fixture runs a test on every available array backend."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any

import pytest

from amopt.backends import library_available

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
# the bench cases read a9a from $AMOPT_A9A; point them at the shared copy when there is one
if (DATA_DIR / "libsvm" / "a9a").is_file():
    os.environ.setdefault("AMOPT_A9A", str(DATA_DIR / "libsvm" / "a9a"))


class Backend(enum.Enum):
    """An array library amopt is tested on.

    ``Backend.available()`` lists those usable here (CuPy only with a GPU); the
    ``xp`` fixture is parametrised over it, always including array-api-strict.
    """

    NUMPY = "numpy"
    ARRAY_API_STRICT = "array_api_strict"
    TORCH = "torch"
    CUPY = "cupy"

    @property
    def module_name(self) -> str:
        return self.value

    def is_importable(self) -> bool:
        return library_available(self.module_name)

    def namespace(self) -> Any:
        """The compat-wrapped namespace (``xp``) of this backend."""
        if self is Backend.NUMPY:
            import array_api_compat.numpy as xp
        elif self is Backend.TORCH:
            import array_api_compat.torch as xp
        elif self is Backend.CUPY:
            import array_api_compat.cupy as xp
        else:
            import array_api_strict as xp
        return xp

    @classmethod
    def available(cls) -> list[Backend]:
        return [b for b in cls if b.is_importable()]


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


@pytest.fixture
def triton_interpreter(monkeypatch):
    """The optimizers' default path is the Triton one, in Triton's interpreter on CPU
    tensors, chosen where a CUDA group would choose it
    (``benchmarks.host.triton_on_cpu``), with small blocks so that every kernel
    covers whole and partial chunks; skips where the driver cannot run here."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import torch

    from amopt.torch import _triton as tri
    from benchmarks.host import triton_on_cpu

    monkeypatch.setattr(tri, "BLOCK", 16)
    monkeypatch.setattr(tri, "CHUNK", 32)
    monkeypatch.setattr(tri, "SEGMENT_ROWS", 4)
    with triton_on_cpu(stub=False):
        if tri.available([torch.zeros(1)]) is not None:
            pytest.skip(tri.available([torch.zeros(1)]))
        yield
