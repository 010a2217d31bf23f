"""What happens when a generated kernel cannot be built or run: one policy for all.

The fused kernels of the device loops (:mod:`amopt.backends.cupy.rule`,
:mod:`amopt.backends.cupy.apply`, :mod:`amopt.backends.cupy.logistic`,
:mod:`amopt.backends.torch.rule`, :mod:`amopt.backends.torch.apply`) fall back to the
array operations they replace when a compiler rejects them: the run goes on with the
same values, the user hears of it once, and that kernel is not tried again in this
process. Each keeps its kernels in a :class:`KernelCache`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["KernelCache", "kernel_failed"]

_WARNED: set[str] = set()


def kernel_failed(kernel: str, exc: BaseException, instead: str) -> None:
    """Warn (``RuntimeWarning``, once per ``kernel``) that ``kernel`` failed with ``exc``
    and that ``instead`` runs."""
    if kernel in _WARNED:
        return
    _WARNED.add(kernel)
    warnings.warn(
        f"{kernel} failed ({type(exc).__name__}: {exc}); {instead}", RuntimeWarning, stacklevel=4
    )


class KernelCache:
    """One kind of kernel, built once per key; a key whose kernel could not be made, or
    failed, holds None from then on.

    Parameters
    ----------
    kernel : str
        What the kernels are, for the warning (``"the AM rule's fused CuPy kernel"``).
    instead : str
        What runs in their place (``"the rule runs as array operations"``).
    """

    def __init__(self, kernel: str, instead: str) -> None:
        self.kernel = kernel
        self.instead = instead
        self._kernels: dict[Hashable, Any] = {}

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The kernel of ``key``, made by ``build()`` the first time (None: none can be)."""
        if key not in self._kernels:
            self._kernels[key] = build()
        return self._kernels[key]

    def off(self, key: Hashable) -> bool:
        """Whether ``key`` is known to have no kernel (it failed, or none could be made)."""
        return key in self._kernels and self._kernels[key] is None

    def failed(self, key: Hashable, exc: BaseException) -> None:
        """``key``'s kernel failed with ``exc``: never again here, and one warning."""
        self._kernels[key] = None
        kernel_failed(self.kernel, exc, self.instead)
