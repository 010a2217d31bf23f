"""Array-namespace resolution and dtype helpers over the Python array API.

Everything numeric in amopt is written against the Python array API standard; these
helpers need only ``array_api_compat``. What is particular to a concrete library
lives in :mod:`amopt.backends`.
"""

from __future__ import annotations

from typing import Any

import array_api_compat

__all__ = [
    "array_namespace",
    "is_array",
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


def tiny(xp: Any, dtype: Any) -> float:
    """``finfo(dtype).eps ** 2``: the relative size below which ``<d-g, d-g>`` is zero."""
    return float(xp.finfo(dtype).eps) ** 2
