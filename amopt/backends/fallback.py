"""One warning per process for a fused kernel that could not be built or run.

The fused kernels of the device loops (:mod:`amopt.backends.cupy.rule`, :mod:`amopt.backends.cupy.apply`,
:mod:`amopt.backends.torch.rule`, :mod:`amopt.backends.torch.apply`, the CuPy logistic loss) fall back to
the array operations they replace when a compiler rejects them: the run goes on with the
same values, and the user hears of it once.
"""

from __future__ import annotations

import warnings

__all__ = ["kernel_failed"]

_WARNED: set[str] = set()


def kernel_failed(kernel: str, exc: BaseException, instead: str) -> None:
    """Warn (``RuntimeWarning``, once per ``kernel``) that ``kernel`` failed with ``exc``
    and that ``instead`` runs."""
    if kernel in _WARNED:
        return
    _WARNED.add(kernel)
    warnings.warn(
        f"{kernel} failed ({type(exc).__name__}: {exc}); {instead}", RuntimeWarning, stacklevel=3
    )
