"""Lazy (dask) arrays in :func:`amopt.minimize` and :mod:`amopt.problems`.

A dask array is a task graph, not data: every arithmetic operation on it adds
tasks, and ``float(a)`` runs the whole graph behind ``a``. Run naively, an
iteration builds ``x_{t+1}`` on top of the graph of ``x_t``, so step ``t``
recomputes all ``t`` steps before it and every scalar the loop reads (the
objective, the rule's sums, the gradient norm) is one more such run.

Here the loop keeps the cost of a step constant instead:

* the iterate, the method's state (momentum buffers) and the gradient are
  persisted after every step, so the graph of step ``t + 1`` starts from data
  held in memory (in the process, or on the workers of a
  ``dask.distributed`` cluster);
* everything the loop needs to read for a step (the finiteness of the new
  iterate, the objective and the gradient norm there, and the momentum
  coefficient of the shared beta rule of :mod:`amopt.optimize.steps`) is evaluated by
  the same single ``dask.persist`` call that persists the arrays.

:func:`session` is the hook called by the loop; it returns ``None`` (and
imports nothing) unless the starting point holds dask arrays, recognised by
``array_api_compat.is_dask_array``. dask is an optional dependency
(``pip install amopt[dask]``).

Device arrays (CuPy, torch, any array library other than NumPy and dask) are
deferred too: a value read on the host waits for the device's queue. Their loop
(``amopt.optimize.loop._run_device``) reads a step's values in one transfer with
:func:`amopt.backends.device.read`. Nothing in this package imports the loop.
"""

from __future__ import annotations

from typing import Any

import array_api_compat

__all__ = ["design", "is_lazy", "session"]


def is_lazy(arrays: Any) -> bool:
    """True when any of ``arrays`` is a dask array."""
    return any(array_api_compat.is_dask_array(a) for a in arrays)


def session(layout: Any, objective: Any, step: Any, **options: Any) -> Any:
    r"""The loop's hook: a :class:`~amopt.backends.dask._session.LazySession` for dask arrays.

    Parameters
    ----------
    layout, objective, step
        The loop's structure of ``x0``, objective wrapper and core step.
    **options
        ``full_batch``, ``weight_decay`` and ``decay_in_f``: see
        :class:`~amopt.backends.dask._session.LazySession`.

    Returns
    -------
    LazySession or None
        ``None`` when ``x0`` holds no dask array: the loop then runs unchanged.
        Otherwise an object whose ``layout``, ``objective`` and ``step`` stand in
        for the loop's own.
    """
    if not is_lazy(layout.arrays):
        return None
    from amopt.backends.dask._session import LazySession

    return LazySession(layout, objective, step, **options)


def design(X: Any, targets: Any) -> Any:
    """A chunked design for the problems when ``X`` is a dask array, else ``None``.

    Parameters
    ----------
    X : array_like
        The design matrix given to a problem.
    targets : numpy.ndarray or dask.array.Array
        Its targets (regression values or encoded labels).

    Returns
    -------
    DaskDesign or None
        See :class:`amopt.backends.dask._design.DaskDesign`.
    """
    if not array_api_compat.is_dask_array(X):
        return None
    from amopt.backends.dask._design import DaskDesign

    return DaskDesign(X, targets)
