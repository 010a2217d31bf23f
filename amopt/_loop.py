"""The loop shared by every ``amopt.minimize`` method.

The objective wrapper (``fun``/``jac``/``args`` or a :class:`~amopt.FiniteSum`),
the map between the user's ``x0`` and the core's tuple of arrays, the mini-batch
sampler, the callback protocol and the status table. Every step itself is a
call into :mod:`amopt._core`, made by the methods in :mod:`amopt._methods`.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import OptimizeResult, OptimizeWarning

from amopt._finite_sum import FiniteSum
from amopt._validation import check_bool, check_int, check_nonnegative
from amopt.backends import array_namespace, is_array

__all__ = ["STATUS_MESSAGES"]

#: Termination reasons: key -> (status, message). The single source of messages.
STATUS_MESSAGES: dict[str, tuple[int, str]] = {
    "gtol": (0, "Optimization terminated successfully: the gradient norm is at most `gtol`."),
    "steps": (0, "Optimization terminated successfully: ran the `maxiter` mini-batch steps."),
    "maxiter": (1, "Maximum number of iterations has been exceeded."),
    "nonfinite": (
        2,
        "NaN or infinite value encountered in the objective, the gradient or the iterate; "
        "returning the last finite iterate.",
    ),
    "callback": (99, "`callback` raised `StopIteration`."),
}

# --------------------------------------------------------------------------- structure


class _Layout:
    """How the user's ``x0`` maps to the tuple of arrays the core works on."""

    def __init__(self, x0: Any):
        if isinstance(x0, list | tuple) and len(x0) > 0 and all(is_array(a) for a in x0):
            self.container: type | None = type(x0)
            arrays = tuple(x0)
        else:
            self.container = None
            if not is_array(x0) or isinstance(x0, np.generic):
                x0 = np.asarray(x0, dtype=np.float64)
            arrays = (x0,)
        self.xp = array_namespace(*arrays)
        self.arrays = tuple(self._as_float(a, i) for i, a in enumerate(arrays))
        self.shapes = [tuple(a.shape) for a in self.arrays]

    def _as_float(self, a: Any, i: int) -> Any:
        xp = self.xp
        name = "x0" if self.container is None else f"x0[{i}]"
        if xp.isdtype(a.dtype, "complex floating"):
            raise TypeError(
                f"{name} has complex dtype {a.dtype}; amopt supports real floating dtypes "
                "(float16, bfloat16, float32, float64). Split complex parameters into real "
                "and imaginary parts."
            )
        if xp.isdtype(a.dtype, "real floating"):
            return a
        if xp.isdtype(a.dtype, ("integral", "bool")):
            info = xp.__array_namespace_info__()
            dtype = info.default_dtypes(device=getattr(a, "device", None))["real floating"]
            return xp.astype(a, dtype)
        raise TypeError(f"{name} must have a real floating dtype; got dtype {a.dtype}")

    def pack(self, arrays: tuple) -> Any:
        """The user's structure from the core's tuple."""
        return arrays[0] if self.container is None else self.container(arrays)

    def unpack(self, obj: Any, what: str) -> tuple:
        """The core's tuple from a user-returned gradient, with shape checks."""
        if self.container is None:
            if type(obj) is np.ndarray and obj.shape == self.shapes[0]:
                return (obj,)  # the common case, checked without the array-API wrappers
            arrays = (obj,)
        else:
            if not isinstance(obj, list | tuple) or len(obj) != len(self.shapes):
                raise ValueError(
                    f"{what} must return a list of {len(self.shapes)} arrays like x0; "
                    f"got {type(obj).__name__}"
                )
            arrays = tuple(obj)
        out = []
        for i, (a, shape) in enumerate(zip(arrays, self.shapes, strict=True)):
            if not is_array(a):
                a = self.xp.asarray(a, dtype=self.arrays[i].dtype)
            if tuple(a.shape) != shape:
                where = "" if self.container is None else f"[{i}]"
                raise ValueError(
                    f"{what} returned an array{where} of shape {tuple(a.shape)}, but x0{where} "
                    f"has shape {shape}; the gradient must have the shape of x"
                )
            out.append(a)
        return tuple(out)

    def max_abs(self, arrays: tuple) -> float:
        """Infinity norm over all arrays (NaN/inf propagate)."""
        xp = self.xp
        if len(arrays) == 1 and type(arrays[0]) is np.ndarray:
            # The common case, without the array-API wrappers. ``argmax`` (the first NaN,
            # else the largest) rather than ``max``: the same value, and on small arrays
            # NumPy's max reduction costs several times more once the loop's objective
            # has pushed it out of the caches.
            a = arrays[0]
            if a.size == 0:
                return 0.0
            mag = np.abs(a)
            return float(mag.flat[np.argmax(mag)])
        return max(float(xp.max(xp.abs(a))) if a.size != 0 else 0.0 for a in arrays)

    def all_finite(self, arrays: tuple) -> bool:
        """No NaN or infinity in any array.

        For NumPy arrays, the cheapest tests: a finite ``sum(a)`` proves that every
        element is finite (a NaN or an infinity makes the sum NaN or infinite); only
        when it is not (an overflowing sum) is ``sum(0 * a)`` needed, which is NaN
        exactly when ``a`` holds a NaN or an infinity.
        """
        if all(type(a) is np.ndarray for a in arrays):
            for a in arrays:
                if not math.isfinite(np.add.reduce(a, axis=None)) and not math.isfinite(
                    np.add.reduce(a * 0.0, axis=None)
                ):
                    return False
            return True
        return math.isfinite(self.max_abs(arrays))


def _scalar(f: Any, what: str) -> float:
    if type(f) is float or type(f) is np.float64:
        return float(f)
    if is_array(f):
        if math.prod(f.shape) != 1:
            raise ValueError(f"{what} must return a scalar; got an array of shape {f.shape}")
        f = f.reshape(()) if hasattr(f, "reshape") else f
    try:
        return float(f)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must return a real scalar; got {type(f).__name__}") from None


class _Objective:
    """Wraps ``fun``/``jac``/``args`` (or a FiniteSum) and counts evaluations."""

    def __init__(self, fun, jac, args, layout: _Layout):
        self.layout = layout
        self.args = args if isinstance(args, tuple) else (args,)
        self.nfev = 0
        self.njev = 0
        self.finite_sum = isinstance(fun, FiniteSum)
        if self.finite_sum:
            self.n_samples = check_int("fun.n_samples", fun.n_samples, 1)
        elif not callable(fun):
            raise TypeError(f"fun must be callable or a FiniteSum; got {type(fun).__name__}")
        self.fun = fun
        self.fd = False
        if self.finite_sum or jac is True:
            self.jac = None
        elif callable(jac):
            self.jac = jac
        elif jac is None or jac is False:
            if layout.xp is not array_namespace(np.empty(0)):
                raise ValueError(
                    "jac=None (finite differences) is supported only for NumPy arrays; "
                    f"x0 is a {type(layout.arrays[0]).__module__} array. Pass jac= (a callable, "
                    "or True when fun returns (f, g)), e.g. from autograd."
                )
            warnings.warn(
                "jac is None: the gradient is estimated by forward finite differences "
                "(scipy.optimize.approx_fprime, n + 1 evaluations of fun per iteration). "
                "Pass jac= for speed and accuracy.",
                OptimizeWarning,
                stacklevel=4,
            )
            self.jac = None
            self.fd = True
        else:
            raise TypeError(f"jac must be callable, True or None; got jac={jac!r}")
        self.jac_is_true = jac is True and not self.finite_sum

    def __call__(self, arrays: tuple) -> tuple[float, tuple]:
        """Full objective value and gradient at ``arrays``."""
        x = self.layout.pack(arrays)
        if self.finite_sum:
            self.nfev += 1
            self.njev += 1
            f, g = self.fun.value_and_grad(x)
            return _scalar(f, "fun.value_and_grad"), self.layout.unpack(g, "fun.value_and_grad")
        if self.jac_is_true:
            self.nfev += 1
            self.njev += 1
            out = self.fun(x, *self.args)
            try:
                f, g = out
            except (TypeError, ValueError):
                raise TypeError("with jac=True, fun must return a pair (f, g)") from None
            return _scalar(f, "fun"), self.layout.unpack(g, "fun (jac=True)")
        if self.fd:
            return self._finite_difference(arrays)
        self.nfev += 1
        self.njev += 1
        f = _scalar(self.fun(x, *self.args), "fun")
        return f, self.layout.unpack(self.jac(x, *self.args), "jac")

    def batch(self, arrays: tuple, indices: np.ndarray) -> tuple[float, tuple]:
        x = self.layout.pack(arrays)
        self.nfev += 1
        self.njev += 1
        f, g = self.fun.batch_value_and_grad(x, indices)
        return _scalar(f, "fun.batch_value_and_grad"), self.layout.unpack(
            g, "fun.batch_value_and_grad"
        )

    def _finite_difference(self, arrays: tuple) -> tuple[float, tuple]:
        from scipy.optimize import approx_fprime

        sizes = [a.size for a in arrays]
        splits = np.cumsum(sizes)[:-1]
        shapes, dtypes = self.layout.shapes, [a.dtype for a in arrays]

        z0 = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])
        f0 = None

        def flat_fun(z):
            # approx_fprime evaluates f at z0 again: answer it from f0, uncounted.
            if f0 is not None and np.array_equal(z, z0):
                return f0
            self.nfev += 1
            parts = np.split(z, splits)
            xs = tuple(
                p.reshape(s).astype(dt) for p, s, dt in zip(parts, shapes, dtypes, strict=True)
            )
            return _scalar(self.fun(self.layout.pack(xs), *self.args), "fun")

        f0 = flat_fun(z0)
        g = approx_fprime(z0, flat_fun, math.sqrt(np.finfo(np.float64).eps))
        parts = np.split(g, splits)
        return f0, tuple(
            p.reshape(s).astype(dt) for p, s, dt in zip(parts, shapes, dtypes, strict=True)
        )


class _Sampler:
    """Mini-batch indices: i.i.d. with replacement, or epochs of random reshuffling."""

    def __init__(self, n: int, batch_size: int, seed: Any, replace: bool):
        self.n, self.batch_size, self.replace = n, batch_size, replace
        self.rng = np.random.default_rng(seed)
        self.perm = np.empty(0, dtype=np.int64)
        self.pos = 0

    def __call__(self) -> np.ndarray:
        if self.replace:
            return self.rng.integers(0, self.n, size=self.batch_size)
        if self.pos >= self.perm.size:
            self.perm = self.rng.permutation(self.n)
            self.pos = 0
        # The last batch of an epoch may be smaller (torch's drop_last=False).
        idx = self.perm[self.pos : self.pos + self.batch_size]
        self.pos += self.batch_size
        return idx


def _beta_to_numpy(beta: Any) -> Any:
    if isinstance(beta, tuple):
        return np.array([float(b) for b in beta])
    return float(beta)


def _wrap_callback(callback: Callable | None) -> Callable | None:
    if callback is None:
        return None
    try:
        params = set(inspect.signature(callback).parameters)
    except (TypeError, ValueError):
        params = set()
    if params == {"intermediate_result"}:
        return lambda res: callback(intermediate_result=res)
    return lambda res: callback(res.x)


# --------------------------------------------------------------------------- driver


def _run(
    fun,
    x0,
    args,
    jac,
    callback,
    *,
    step,
    maxiter,
    gtol,
    is_am,
    stochastic=False,
    batch_size=None,
    seed=None,
    replace=False,
) -> OptimizeResult:
    """The loop shared by every method.

    ``step(xs, gs, f, state) -> (xs, state, beta)`` is one core step; ``state``
    starts as ``None``.
    """
    maxiter = check_int("maxiter", maxiter, 0)
    gtol = check_nonnegative("gtol", gtol)
    layout = _Layout(x0)
    obj = _Objective(fun, jac, args, layout)
    cb = _wrap_callback(callback)
    sampler = None
    if batch_size is not None:
        if not obj.finite_sum:
            raise ValueError(
                f"batch_size={batch_size!r} needs fun to be a FiniteSum (an object with "
                "n_samples, value_and_grad and batch_value_and_grad); got a callable"
            )
        batch_size = check_int("batch_size", batch_size, 1, obj.n_samples)
        sampler = _Sampler(obj.n_samples, batch_size, seed, check_bool("replace", replace))

    def gnorm_of(arrays: tuple) -> float:
        # max|g| for the gtol test; without one, only whether g is finite matters
        if gtol > 0:
            return layout.max_abs(arrays)
        return 0.0 if layout.all_finite(arrays) else math.nan

    xs = layout.arrays
    state = None
    betas: list[Any] = []
    nit = 0
    reason = None

    if sampler is None:
        f, gs = obj(xs)
        gnorm = gnorm_of(gs)
        if not (math.isfinite(f) and math.isfinite(gnorm)):
            reason = "nonfinite"
    else:
        f, gs, gnorm = math.nan, None, math.nan

    while reason is None:
        if sampler is None and gtol > 0 and gnorm <= gtol:
            reason = "gtol"
            break
        if nit >= maxiter:
            reason = "steps" if stochastic else "maxiter"
            break
        if sampler is not None:
            f_b, g_b = obj.batch(xs, sampler())
            gnorm_b = gnorm_of(g_b)
            if not (math.isfinite(f_b) and math.isfinite(gnorm_b)):
                reason = "nonfinite"
                break
            if gtol > 0 and gnorm_b <= gtol:
                reason = "gtol"
                break
            f_step, g_step = f_b, g_b
        else:
            f_step, g_step = f, gs
        new_xs, state, beta = step(xs, g_step, f_step, state)
        if not layout.all_finite(new_xs):
            reason = "nonfinite"
            break
        if sampler is None:
            f_new, g_new = obj(new_xs)
            gnorm_new = gnorm_of(g_new)
            if not (math.isfinite(f_new) and math.isfinite(gnorm_new)):
                reason = "nonfinite"
                break
            f, gs, gnorm = f_new, g_new, gnorm_new
        else:
            f = f_step
        xs = new_xs
        nit += 1
        if is_am:
            betas.append(beta)
        if cb is not None:
            inter = OptimizeResult(x=layout.pack(xs), fun=f, nit=nit)
            if sampler is None:
                inter["jac"] = layout.pack(gs)
            if is_am:
                inter["beta"] = _beta_to_numpy(beta)
            try:
                cb(inter)
            except StopIteration:
                reason = "callback"

    if sampler is not None:
        # The result reports the full objective at the returned iterate.
        f, gs = obj(xs) if obj.finite_sum else (f, gs)
    status, message = STATUS_MESSAGES[reason]
    res = OptimizeResult(
        x=layout.pack(xs),
        fun=f,
        jac=None if gs is None else layout.pack(gs),
        nit=nit,
        nfev=obj.nfev,
        njev=obj.njev,
        status=status,
        success=status == 0,
        message=message,
    )
    if is_am:
        if betas:
            res["betas"] = np.stack([np.asarray(_beta_to_numpy(b)) for b in betas])
            if layout.container is None and res["betas"].ndim == 2:
                res["betas"] = res["betas"][:, 0]
        else:
            res["betas"] = np.empty((0,), dtype=np.float64)
    return res


def _check_unknown_options(unknown: dict) -> None:
    if unknown:
        msg = ", ".join(map(str, unknown))
        warnings.warn(f"Unknown solver options: {msg}", OptimizeWarning, stacklevel=4)


def _sampling(fun, batch_size, seed, replace, gtol, *, always: bool) -> dict:
    """Mini-batch settings for ``_run``.

    The sgd-type methods (``always``) sample any FiniteSum, 32 per batch unless
    told otherwise; the Adam family samples only when given ``batch_size``.
    Mini-batch runs default to ``gtol=0``, full-batch runs to ``1e-5``.
    """
    if always and batch_size is None and isinstance(fun, FiniteSum):
        batch_size = 32
    stochastic = always or batch_size is not None
    if gtol is None:
        gtol = 0.0 if stochastic else 1e-5
    return {
        "batch_size": batch_size,
        "seed": seed,
        "replace": replace,
        "gtol": gtol,
        "stochastic": stochastic,
    }
