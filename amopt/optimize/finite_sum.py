"""The finite-sum protocol accepted by the stochastic methods of `amopt.minimize`."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["FiniteSum"]


@runtime_checkable
class FiniteSum(Protocol):
    r"""An objective :math:`f(x) = \frac{1}{n} \sum_{i=1}^{n} f_i(x) + r(x)`.

    Any object with these three members can be passed as ``fun`` to
    :func:`amopt.minimize`. The stochastic methods (``"sgd"``, ``"msgd"``,
    ``"am-sgd"``, and ``"adam"``/``"adamw"``/``"am-adam"``/``"am-adamw"`` with
    ``batch_size``) call :meth:`batch_value_and_grad` on sampled index arrays
    (``min(32, n_samples)`` indices per batch unless ``batch_size`` says
    otherwise); the full value and gradient are used for the final result and
    by the deterministic methods. The gradients come from the object: ``jac``
    is not used (a ``jac`` other than one of the object's own methods gives an
    ``OptimizeWarning``) and ``args`` must be empty.

    Attributes
    ----------
    n_samples : int
        The number of terms ``n``.

    Methods
    -------
    value_and_grad(x)
        Full objective value (a scalar) and gradient (same shape and array
        type as ``x``).
    batch_value_and_grad(x, indices)
        Mean of :math:`f_i` over ``indices`` (plus the regulariser ``r``, if
        any) and its gradient. ``indices`` is a 1-D integer array of the
        library and device of ``x``: a NumPy array for NumPy (and dask) ``x``;
        for CuPy, torch and other array libraries an array on ``x``'s device
        (int64, a slice of a permutation moved there once per epoch), so that
        the rows can be gathered there without a copy from the host per step.

    Examples
    --------
    >>> import numpy as np
    >>> import amopt
    >>> class Mean:
    ...     n_samples = 3
    ...     a = np.array([1.0, 2.0, 6.0])
    ...     def value_and_grad(self, x):
    ...         return self.batch_value_and_grad(x, np.arange(3))
    ...     def batch_value_and_grad(self, x, indices):
    ...         r = x - self.a[indices]
    ...         return 0.5 * float(np.mean(r**2)), np.array([np.mean(r)])
    >>> isinstance(Mean(), amopt.FiniteSum)
    True
    >>> res = amopt.minimize(Mean(), np.zeros(1), method="sgd",
    ...                      options={"lr": 0.5, "maxiter": 60, "seed": 0})
    >>> res.x  # the minimiser, the mean of a
    array([3.])
    """

    n_samples: int

    def value_and_grad(self, x: Any) -> tuple[Any, Any]: ...

    def batch_value_and_grad(self, x: Any, indices: Any) -> tuple[Any, Any]: ...
