"""Array-namespace resolution, dtype helpers and which array libraries are usable here.

Everything numeric in amopt is written against the Python array API standard;
this module is the single place that knows about concrete libraries.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import array_api_compat
import numpy as np

__all__ = [
    "array_namespace",
    "accumulation_dtype",
    "is_array",
    "library_available",
    "to_numpy",
    "tiny",
]


def array_namespace(*arrays: Any) -> Any:
    """Return the (compat-wrapped) array API namespace of ``arrays``.

    Python scalars are ignored; NumPy inputs give ``array_api_compat.numpy``.
    """
    arrays = tuple(a for a in arrays if a is not None and not isinstance(a, int | float))
    return array_api_compat.array_namespace(*arrays)


def is_array(x: Any) -> bool:
    """True for any array that array-api-compat recognises (NumPy, CuPy, torch, strict...)."""
    return array_api_compat.is_array_api_obj(x) and not isinstance(x, int | float | complex)


def accumulation_dtype(xp: Any, dtype: Any) -> Any:
    """The dtype reductions are accumulated in: float64 for float64, else float32.

    Half-precision inputs (float16, bfloat16) are promoted to float32 so that
    squared norms neither overflow at 256 nor lose the small terms.
    """
    if dtype == xp.float64:
        return xp.float64
    return xp.float32


def tiny(xp: Any, acc_dtype: Any) -> float:
    """``finfo(acc_dtype).eps ** 2``: the relative size below which ``<d-g, d-g>`` is zero."""
    return float(xp.finfo(acc_dtype).eps) ** 2


def to_numpy(x: Any) -> np.ndarray:
    """Copy any supported array (any device) to a NumPy array on the host."""
    if isinstance(x, np.ndarray):
        return x
    if array_api_compat.is_torch_array(x):
        return x.detach().cpu().numpy()
    if array_api_compat.is_cupy_array(x):
        return x.get()
    try:
        return np.asarray(x)
    except (TypeError, ValueError, RuntimeError):
        return np.from_dlpack(x)


def library_available(name: str) -> bool:
    """Whether the array library ``name`` can be used here.

    The module must be importable; CuPy also needs a visible CUDA device.

    Parameters
    ----------
    name : str
        Module name: ``"numpy"``, ``"array_api_strict"``, ``"torch"``, ``"cupy"``, ...

    Examples
    --------
    >>> library_available("numpy"), library_available("no_such_array_library")
    (True, False)
    """
    if importlib.util.find_spec(name) is None:
        return False
    if name == "cupy":
        try:
            import cupy

            return cupy.cuda.runtime.getDeviceCount() > 0
        except Exception:  # noqa: BLE001 - any CUDA failure means "not available"
            return False
    return True
