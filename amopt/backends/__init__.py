"""The array libraries amopt knows: which are usable here, and each one's kernels.

Everything numeric in amopt is written against the Python array API standard
(:mod:`amopt.core`); this package is the single place that knows about concrete
libraries: NumPy's fast path (:mod:`amopt.backends.numpy`), CuPy's and Triton's
generated kernels (:mod:`amopt.backends.cupy`, :mod:`amopt.backends.torch`,
:mod:`amopt.backends.triton`), dask's sessions (:mod:`amopt.backends.dask`), device
reads (:mod:`amopt.backends.device`) and sparse matrices on a device
(:mod:`amopt.backends.sparse`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import array_api_compat
import numpy as np

__all__ = [
    "library_available",
    "to_numpy",
]


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
