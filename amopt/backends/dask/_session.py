"""The lazy loop: one graph submission per step of :func:`amopt.minimize` on dask arrays.

:class:`LazySession` stands in for three objects of the loop (the structure
of ``x0``, the objective wrapper and the core step) so that the loop itself
runs unchanged. Each of its graph submissions is one ``dask.persist`` call
that persists the arrays the next step starts from and evaluates, in the same
graph, every scalar the loop is about to read. The loop then asks for those
scalars one at a time (``all_finite(new_x)``, ``objective(new_x)``,
``max_abs(g)``, ...); they are answered from a small memo of the values just
computed, matched by the identity of the persisted arrays.

Which values a submission evaluates follows the loop's order of work:

* full batch: the core step gives ``x_{t+1}``, the new state and the
  momentum coefficient; the objective and gradient at ``x_{t+1}`` are built
  on top, and ``max|x_{t+1}|``, ``f(x_{t+1})``, ``max|g(x_{t+1})|`` and
  ``beta_t`` are read together;
* mini-batch: the batch objective and gradient at ``x_t`` and the core step
  that would use them are built together; ``f_B``, ``max|g_B|``,
  ``max|x_{t+1}|`` and ``beta_t`` are read together.

The loop checks these values in its usual order, so a run stops exactly
where the NumPy run stops. The speculative part of a submission (the
objective at ``x_{t+1}``, the step after a batch) is evaluated at a guarded
point: at ``x_t`` when ``x_{t+1}`` is not finite, with a zero gradient when
the batch gradient is not, so user code never sees a non-finite iterate that
the loop would have rejected.

The core's step functions are used as they are: on dask arrays they build
the beta rule's reductions lazily, and nothing in them forces a computation.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import array_api_compat
import dask
import dask.array as da
from dask.callbacks import Callback
from dask.core import flatten

__all__ = ["LazySession", "StepTimings", "record"]

# Entries of the memo: a submission leaves at most five (norms of the iterate and
# of the gradient, the evaluation or the step, and ||x||^2 under weight decay).
_MEMO_SIZE = 10


@dataclass
class StepTimings:
    """Where the time of the lazy loop goes, summed over its graph submissions.

    Attributes
    ----------
    build : float
        Seconds spent building the expressions (core step, objective,
        reductions) in Python: the task graph of each submission.
    persist : float
        Seconds inside ``dask.persist`` other than running the tasks: graph
        optimisation, submission to the scheduler, rebuilding the persisted
        collections.
    compute : float
        Seconds running the tasks and fetching the scalars (on a distributed
        cluster, the wait for the results after submission).
    submissions : int
        Number of ``dask.persist`` calls.
    """

    build: float = 0.0
    persist: float = 0.0
    compute: float = 0.0
    submissions: int = 0


_RECORDERS: list[list[StepTimings]] = []


@contextmanager
def record() -> Iterator[list[StepTimings]]:
    """Collect the :class:`StepTimings` of every lazy run started inside the block.

    Yields
    ------
    list of StepTimings
        One entry per :func:`amopt.minimize` call on dask arrays, filled as the
        runs go.

    Examples
    --------
    >>> import dask.array as da
    >>> import amopt
    >>> from amopt.backends.dask._session import record
    >>> with record() as runs:
    ...     res = amopt.minimize(lambda x: (x * x).sum(), da.ones(4), jac=lambda x: 2 * x,
    ...                          options={"lr": 0.25, "maxiter": 3, "gtol": 0})
    >>> runs[0].submissions  # the first evaluation, then one per step
    4
    """
    runs: list[StepTimings] = []
    _RECORDERS.append(runs)
    try:
        yield runs
    finally:
        _RECORDERS.remove(runs)


class _ExecutionClock(Callback):
    """Time from the start to the end of a local scheduler's run of the tasks."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0
        self._start_time = 0.0

    def _start(self, dsk: Any) -> None:
        self._start_time = time.perf_counter()

    def _finish(self, dsk: Any, state: Any, errored: bool) -> None:
        self.seconds += time.perf_counter() - self._start_time


def _is_dask(a: Any) -> bool:
    return array_api_compat.is_dask_array(a)


def _is_future(v: Any) -> bool:
    distributed = sys.modules.get("distributed")
    return distributed is not None and isinstance(v, distributed.Future)


def _max_abs(arrays: tuple) -> Any:
    """``max|a|`` over all arrays, lazily (NaN propagates; 0 for empty arrays)."""
    parts = [da.max(da.abs(a)) for a in arrays if a.size != 0]
    if not parts:
        return 0.0
    out = parts[0]
    for p in parts[1:]:
        out = da.maximum(out, p)
    return out


def _lazy_scalar(f: Any, what: str, scalar: Any) -> Any:
    """The objective value as a 0-d dask array, or, checked by ``scalar`` (the loop's
    check of a returned value), a float when it came back computed."""
    if not _is_dask(f):
        return scalar(f, what)
    if math.prod(f.shape) != 1:
        raise ValueError(f"{what} must return a scalar; got an array of shape {f.shape}")
    if f.dtype.kind not in "iuf":
        raise TypeError(f"{what} must return a real scalar; got a dask array of dtype {f.dtype}")
    return f.reshape(()) if f.ndim else f


def _names(arrays: tuple) -> tuple:
    """The memo key of dask arrays: their names, which identify their content."""
    return tuple(a.name if _is_dask(a) else id(a) for a in arrays)


def _sq_norm(arrays: tuple) -> Any:
    """``sum |a|^2`` over all arrays, lazily, accumulated in at least float32 (as the loop)."""
    total = 0.0
    for a in arrays:
        if a.dtype != "float64":
            a = a.astype("float32")
        total = total + da.sum(a * a)
    return total


def _fetch(collections: tuple) -> list[float]:
    """The values of persisted 0-d arrays, without another graph submission.

    A local scheduler leaves the values themselves in the persisted graphs; a
    distributed one leaves futures, gathered here in one round trip.
    """
    raw = []
    for c in collections:
        key = next(iter(flatten(c.__dask_keys__())))
        value = c.__dask_graph__()[key]
        # a graph may hold the value wrapped in a data node
        raw.append(value.value if type(value).__name__ == "DataNode" else value)
    futures = [v for v in raw if _is_future(v)]
    if futures:
        gathered = iter(futures[0].client.gather(futures))
        raw = [next(gathered) if _is_future(v) else v for v in raw]
    return [float(v) for v in raw]


def _beta_parts(beta: Any) -> list:
    if beta is None:
        return []
    return list(beta) if isinstance(beta, tuple) else [beta]


def _beta_like(beta: Any, values: list[float]) -> Any:
    import numpy as np

    if beta is None:
        return None
    if isinstance(beta, tuple):
        return tuple(np.float64(v) for v in values)
    return np.float64(values[0])


class _StandIn:
    """Stands in for one of the loop's objects: what it does not define, the object answers."""

    def __init__(self, session: LazySession, wrapped: Any):
        self._session = session
        self._wrapped = wrapped

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


class _Layout(_StandIn):
    """The loop's view of ``x0``: the persisted starting point, and memoised reductions."""

    @property
    def arrays(self) -> tuple:
        return self._session.x0

    def max_abs(self, arrays: tuple) -> float:
        return self._session.reduce("max_abs", arrays)

    def all_finite(self, arrays: tuple) -> bool:
        return math.isfinite(self._session.reduce("max_abs", arrays))

    def sq_norm(self, arrays: tuple) -> float:
        return self._session.reduce("sq_norm", arrays)


class _Objective(_StandIn):
    """The loop's objective: counts like the eager wrapper, answers from the memo."""

    def _count(self) -> None:
        self._wrapped.nfev += 1
        self._wrapped.njev += 1

    def __call__(self, arrays: tuple) -> tuple[float, tuple]:
        self._count()
        return self._session.evaluate(arrays)

    def batch(self, arrays: tuple, indices: Any) -> tuple[float, tuple]:
        self._count()
        return self._session.batch(arrays, indices)


_REDUCTIONS = {"max_abs": _max_abs, "sq_norm": _sq_norm}


class LazySession:
    r"""Stand-ins for the loop's layout, objective and step on dask arrays.

    Parameters
    ----------
    layout : amopt.optimize.loop._Layout
        The structure of ``x0`` (its arrays are dask arrays).
    objective : amopt.optimize.loop._Objective
        The objective wrapper; its function and gradient are called on dask
        arrays and their results are left lazy.
    step : callable
        ``step(xs, gs, f, state) -> (xs, state, beta)``, one core step.
    full_batch : bool
        Whether the loop evaluates the full objective after each step (else it
        evaluates mini-batches before every step).
    weight_decay : float
        The loop's coupled decay :math:`\mu`: it tests and steps with
        :math:`g + \mu x`, built here the same way so that its norm is read in
        the same submission.
    decay_in_f : bool
        Whether the loop adds :math:`\frac{\mu}{2}\|x\|^2` to ``f`` (then
        :math:`\|x\|^2` is read in the same submission too).

    Attributes
    ----------
    layout, objective, step
        What the loop uses in place of its own.
    x0 : tuple of dask arrays
        The persisted starting point.
    timings : StepTimings
        Where the time went.
    """

    def __init__(
        self,
        layout: Any,
        objective: Any,
        step: Any,
        *,
        full_batch: bool,
        weight_decay: float = 0.0,
        decay_in_f: bool = False,
    ):
        self._layout = layout
        self._objective = objective
        self._step = step
        self._full_batch = full_batch
        self._wd = weight_decay
        self._sq = weight_decay != 0 and decay_in_f
        self._state: Any = None
        self._memo: list[tuple[str, tuple, Any]] = []
        self.timings = StepTimings()
        for runs in _RECORDERS:
            runs.append(self.timings)
        self.layout = _Layout(self, layout)
        self.objective = _Objective(self, objective)

        start = time.perf_counter()
        x0 = layout.arrays
        if full_batch:
            # The loop's first evaluation, submitted together with the starting point.
            f, gs = self._evaluate(x0)
            x0, _ = self._settle_point(x0, f, gs, start)
        else:
            scalars = {"max_abs": _max_abs(x0)}
            if self._sq:
                scalars["sq_norm"] = _sq_norm(x0)
            (x0,), values = self._settle((x0,), scalars, start)
            for kind, value in values.items():
                self._remember(kind, x0, value)
        self.x0 = x0

    # ------------------------------------------------------------------ memo
    def _remember(self, kind: str, arrays: tuple, value: Any, key: tuple | None = None) -> None:
        self._memo.append((kind, _names(arrays) if key is None else key, value))
        del self._memo[:-_MEMO_SIZE]

    def _recall(self, kind: str, key: tuple) -> Any:
        for k, known, value in reversed(self._memo):
            if k == kind and known == key:
                return value
        return None

    def _coupled(self, xs: tuple, gs: tuple) -> tuple:
        """The loop's gradient of the method, built as the loop builds it (same names)."""
        if self._wd == 0:
            return gs
        wd = self._wd
        return tuple(g + wd * x for g, x in zip(gs, xs, strict=True))

    # ------------------------------------------------------------------ submissions
    def _settle(self, arrays: Any, scalars: dict, start: float) -> tuple[Any, dict]:
        """Persist ``arrays`` and evaluate ``scalars`` in one ``dask.persist`` call.

        ``start`` is when building this submission's expressions began. Returns
        the persisted ``arrays`` (same nesting) and the scalars as floats.
        """
        names = list(scalars)
        lazy = [k for k in names if _is_dask(scalars[k])]
        clock = _ExecutionClock() if _RECORDERS else None
        t_build = time.perf_counter()
        with clock if clock is not None else nullcontext():
            persisted = dask.persist(arrays, *(scalars[k] for k in lazy))
        t_persist = time.perf_counter()
        fetched = dict(zip(lazy, _fetch(persisted[1:]), strict=True))
        t_done = time.perf_counter()

        values = {k: fetched[k] if k in fetched else float(scalars[k]) for k in names}
        t = self.timings
        t.submissions += 1
        t.build += t_build - start
        executed = clock.seconds if clock is not None else 0.0
        t.persist += t_persist - t_build - executed
        t.compute += executed + (t_done - t_persist)
        return persisted[0], values

    def _settle_point(
        self, xs: tuple, f: Any, gs: tuple, start: float, extra: Any = (), more: dict | None = None
    ) -> tuple[tuple, dict]:
        """Persist ``xs``, ``gs`` (and ``extra``) and read what the loop asks at this point."""
        g_c = self._coupled(xs, gs)
        scalars = {"f": f, "x_max_abs": _max_abs(xs), "g_max_abs": _max_abs(g_c)}
        if self._sq:
            scalars["sq_norm"] = _sq_norm(xs)
        scalars.update(more or {})
        (xs, gs, extra), values = self._settle((xs, gs, extra), scalars, start)
        self._remember("max_abs", xs, values["x_max_abs"])
        self._remember("evaluate", xs, (values["f"], gs))
        self._remember("max_abs", g_c, values["g_max_abs"])
        if self._sq:
            self._remember("sq_norm", xs, values["sq_norm"])
        values["persisted"] = extra
        return xs, values

    # ------------------------------------------------------------------ objective
    def _evaluate(self, arrays: tuple, indices: Any = None) -> tuple[Any, tuple]:
        """``(f, gs)`` at ``arrays`` as the loop's objective computes them, left lazy."""
        obj = self._objective
        x = obj.layout.pack(arrays)
        if obj.finite_sum:
            if indices is None:
                what = "fun.value_and_grad"
                f, g = obj._pair(obj.fun.value_and_grad(x), what)
            else:
                what = "fun.batch_value_and_grad"
                f, g = obj._pair(obj.fun.batch_value_and_grad(x, indices), what)
            return _lazy_scalar(f, what, obj.scalar), obj.layout.unpack(g, what)
        if obj.pair is not None:
            what = "fun.value_and_grad"
            f, g = obj._pair(obj.pair(x, *obj.args), what)
            return _lazy_scalar(f, what, obj.scalar), obj.layout.unpack(g, what)
        if obj.jac_is_true:
            f, g = obj._pair(obj.fun(x, *obj.args), "with jac=True, fun")
            return _lazy_scalar(f, "fun", obj.scalar), obj.layout.unpack(g, "fun (jac=True)")
        f = _lazy_scalar(obj.fun(x, *obj.args), "fun", obj.scalar)
        return f, obj.layout.unpack(obj.jac(x, *obj.args), "jac")

    def evaluate(self, arrays: tuple) -> tuple[float, tuple]:
        """The full objective and the persisted gradient at ``arrays``."""
        hit = self._recall("evaluate", _names(arrays))
        if hit is not None:
            return hit
        start = time.perf_counter()
        f, gs = self._evaluate(arrays)
        self._settle_point(arrays, f, gs, start)
        return self._recall("evaluate", _names(arrays))

    def reduce(self, kind: str, arrays: tuple) -> float:
        """``max_abs`` or ``sq_norm`` of ``arrays``, from the memo when just computed."""
        hit = self._recall(kind, _names(arrays))
        if hit is not None:
            return hit
        _, values = self._settle((), {kind: _REDUCTIONS[kind](arrays)}, time.perf_counter())
        return values[kind]

    # ------------------------------------------------------------------ steps
    def step(self, xs: tuple, gs: tuple, f: float, state: Any) -> tuple[tuple, Any, Any]:
        """One core step; in full batch, submitted with the evaluation at the new point."""
        hit = self._recall("step", (*_names(xs), *_names(gs), id(state)))
        if hit is not None:
            self._state = hit[1]
            return hit
        start = time.perf_counter()
        new_xs, new_state, beta = self._step(xs, gs, f, state)
        betas = {f"beta{i}": b for i, b in enumerate(_beta_parts(beta))}
        if self._full_batch:
            # the objective at the new point, or at the old one when the new one is not finite
            finite = da.isfinite(_max_abs(new_xs))
            at = tuple(da.where(finite, new, old) for new, old in zip(new_xs, xs, strict=True))
            f_new, g_new = self._evaluate(at)
            new_xs, values = self._settle_point(
                new_xs, f_new, g_new, start, extra=new_state, more=betas
            )
            new_state = values["persisted"]
        else:
            scalars = {"max_abs": _max_abs(new_xs), **betas}
            (new_xs, new_state), values = self._settle((new_xs, new_state), scalars, start)
            self._remember("max_abs", new_xs, values["max_abs"])
        self._state = new_state
        return new_xs, new_state, _beta_like(beta, [values[k] for k in betas])

    def batch(self, xs: tuple, indices: Any) -> tuple[float, tuple]:
        """A mini-batch evaluation at ``xs``, submitted with the step that would follow it."""
        start = time.perf_counter()
        f_b, g_b = self._evaluate(xs, indices)
        # what the loop will step with: the method's (f, g), coupled to the decay as it does
        g_step = self._coupled(xs, g_b)
        scalars = {"f": f_b, "g_max_abs": _max_abs(g_step)}
        f_step = f_b
        if self._sq:
            scalars["sq_norm"] = _sq_norm(xs)
            # in float64, as the loop adds Python floats
            f_step = da.asarray(f_b).astype("float64") + 0.5 * self._wd * scalars[
                "sq_norm"
            ].astype("float64")
        # the step, from a zero gradient when the batch is not finite (the loop then stops)
        usable = da.isfinite(scalars["g_max_abs"]) & da.isfinite(f_b)
        safe_g = tuple(da.where(usable, g, 0.0) for g in g_step)
        state = self._state
        new_xs, new_state, beta = self._step(xs, safe_g, da.where(usable, f_step, 0.0), state)
        scalars["x_max_abs"] = _max_abs(new_xs)
        betas = {f"beta{i}": b for i, b in enumerate(_beta_parts(beta))}
        scalars.update(betas)
        (g_b, new_xs, new_state), values = self._settle((g_b, new_xs, new_state), scalars, start)
        self._remember("max_abs", g_step, values["g_max_abs"])
        self._remember("max_abs", new_xs, values["x_max_abs"])
        if self._sq:
            self._remember("sq_norm", xs, values["sq_norm"])
        key = (*_names(xs), *_names(g_step), id(state))
        result = (new_xs, new_state, _beta_like(beta, [values[k] for k in betas]))
        self._remember("step", (), result, key=key)
        return values["f"], g_b
