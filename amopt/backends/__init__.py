"""The array libraries amopt knows: the one registry of which are usable here, and of
each one's kernels.

Everything numeric in amopt is written against the Python array API standard
(:mod:`amopt.core`); this package is the single place that knows about concrete
libraries: NumPy's fast path (:mod:`amopt.backends.numpy`), CuPy's and Triton's
generated kernels (:mod:`amopt.backends.cupy`, :mod:`amopt.backends.torch`,
:mod:`amopt.backends.triton`), dask's sessions (:mod:`amopt.backends.dask`), device
reads (:mod:`amopt.backends.device`) and sparse matrices on a device
(:mod:`amopt.backends.sparse`).

Here every question about a library is answered once: :func:`library_available` probes
a library once per process (CuPy's device count, whether Triton imports),
:func:`library_of` names the library of an array or a namespace, :func:`kernel` finds a
library's kernel by name (looked up in its module at every call, so that a test can
replace one), and :func:`plain_namespace` is the library behind a compat namespace.
What happens when a kernel fails is :class:`amopt.backends.fallback.KernelCache`'s.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import types
from collections.abc import Callable
from typing import Any

import array_api_compat
import numpy as np

__all__ = [
    "kernel",
    "library_available",
    "library_of",
    "plain_namespace",
    "to_numpy",
]

#: Each library's kernels by name: the module that defines one and its name there.
#: Every kernel returns None where it declines (a dtype it has no kernel for, a kernel
#: that failed once), and the caller then runs the array operations it stands for.
KERNELS: dict[tuple[str, str], tuple[str, str]] = {
    ("numpy", "momentum_step"): ("amopt.backends.numpy", "momentum_step"),
    ("cupy", "momentum_rule"): ("amopt.backends.cupy.rule", "momentum_rule"),
    ("cupy", "momentum_apply"): ("amopt.backends.cupy.apply", "momentum_apply"),
    ("cupy", "logistic_loss"): ("amopt.backends.cupy.logistic", "loss_and_residual"),
    ("torch", "momentum_rule"): ("amopt.backends.torch.rule", "momentum_rule"),
    ("torch", "momentum_apply"): ("amopt.backends.torch.apply", "momentum_apply"),
}


def library_of(x: Any) -> str:
    """The name of the array library of ``x``, an array or a namespace: ``"numpy"``,
    ``"cupy"``, ``"torch"``, ``"dask"``, ``"array_api_strict"``, ...

    A compat namespace (``array_api_compat.torch``) names the library it wraps. An array's
    library is its type's, found once per type.
    """
    if isinstance(x, types.ModuleType):
        return x.__name__.removeprefix("array_api_compat.").partition(".")[0]
    name = _LIBRARY_OF_TYPE.get(type(x))
    if name is None:
        name = _LIBRARY_OF_TYPE[type(x)] = _library_of_array(x)
    return name


#: library names by array type (a step asks at every call: a dict lookup then)
_LIBRARY_OF_TYPE: dict[type, str] = {}


def _library_of_array(x: Any) -> str:
    if array_api_compat.is_cupy_array(x):
        return "cupy"
    if array_api_compat.is_torch_array(x):
        return "torch"
    if array_api_compat.is_dask_array(x):
        return "dask"
    if isinstance(x, np.ndarray | np.generic):
        return "numpy"
    return type(x).__module__.partition(".")[0]


def kernel(library: str, name: str) -> Callable[..., Any] | None:
    """The kernel ``name`` of ``library`` (:data:`KERNELS`), or None where the library
    has none. It is read from its module at every call, so that a replacement there
    (a test's) is what runs."""
    where = KERNELS.get((library, name))
    if where is None:
        return None
    module = _MODULES.get(where[0])
    if module is None:
        module = _MODULES[where[0]] = importlib.import_module(where[0])
    return getattr(module, where[1])


#: the kernels' modules, imported at their first use
_MODULES: dict[str, types.ModuleType] = {}


def plain_namespace(xp: Any) -> Any:
    """The library behind a compat namespace of torch or CuPy, for the rule on a device.

    The rule (:mod:`amopt.core.rule`) is a few elementwise operations on 0-d arrays; its
    functions are the library's own there, without the compat layer's wrappers: a
    Python call less each, and for CuPy a ``clip`` without boolean-mask assignments,
    each of which reads the mask's count back to the host. Any other ``xp`` is
    returned as it is.
    """
    if array_api_compat.is_torch_namespace(xp):
        import torch

        return torch
    if array_api_compat.is_cupy_namespace(xp):
        import cupy

        return cupy
    return xp


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


@functools.cache
def library_available(name: str) -> bool:
    """Whether the array library ``name`` can be used here, probed once per process.

    The module must be importable; CuPy also needs a visible CUDA device, and Triton
    must import (an installation without its compiler backend does not).

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
    if name == "triton":
        try:
            import triton  # noqa: F401
            import triton.language  # noqa: F401
        except ImportError:
            return False
    return True
