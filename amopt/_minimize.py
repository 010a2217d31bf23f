"""``amopt.minimize``: a ``scipy.optimize.minimize``-shaped driver over the array-API core.

One private ``_minimize_<method>`` per method; its keyword arguments are the
method's options. The iteration loop, the objective wrapper and the status
table are shared, and every step is a call into :mod:`amopt._core`.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import OptimizeResult, OptimizeWarning

from amopt import _core
from amopt._finite_sum import FiniteSum
from amopt._validation import (
    check_am_options,
    check_betas,
    check_bool,
    check_int,
    check_interval,
    check_nonnegative,
    check_positive,
    check_weight_decay_mode,
)
from amopt.backends import array_namespace, is_array

__all__ = ["minimize", "scipy_method", "METHODS", "STATUS_MESSAGES"]

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


# --------------------------------------------------------------------------- methods


def _minimize_gd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    weight_decay=0.0,
    maxiter=1000,
    gtol=1e-5,
    **unknown_options,
) -> OptimizeResult:
    r"""Gradient descent, :math:`x_{t+1} = x_t - \eta \nabla f(x_t)`.

    Options
    -------
    lr : float
        Step size :math:`\eta > 0` (``1/L`` for an L-smooth f).
    weight_decay : float
        Coupled L2 weight decay: the gradient used is ``g + weight_decay * x``.
    maxiter : int
        Maximum number of steps.
    gtol : float
        Stop when ``max|g| <= gtol``; 0 disables the test.
    """
    _check_unknown_options(unknown_options)
    lr = check_positive("lr", lr)
    wd = check_nonnegative("weight_decay", weight_decay)

    def step(xs, gs, f, state):
        return _core.gd_step(xs, gs, lr=lr, weight_decay=wd), None, None

    return _run(fun, x0, args, jac, callback, step=step, maxiter=maxiter, gtol=gtol, is_am=False)


def _heavy_ball(lr, beta, wd):
    def step(xs, gs, f, state):
        state = _core.heavy_ball_init(xs) if state is None else state
        xs, state = _core.heavy_ball_step(xs, gs, state, lr=lr, beta=beta, weight_decay=wd)
        return xs, state, None

    return step


def _minimize_mgd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    beta=0.9,
    weight_decay=0.0,
    maxiter=1000,
    gtol=1e-5,
    **unknown_options,
) -> OptimizeResult:
    r"""Damped heavy ball (MGD) with fixed momentum ``beta``.

    .. math::

        d_0 = g_0,\quad d_{t+1} = \beta d_t + (1-\beta) g_t,\quad x_{t+1} = x_t - \eta d_{t+1}

    Options
    -------
    lr : float
        Step size :math:`\eta > 0`.
    beta : float
        Momentum coefficient in [0, 1].
    weight_decay : float
        Coupled L2 weight decay.
    maxiter : int
        Maximum number of steps.
    gtol : float
        Stop when ``max|g| <= gtol``; 0 disables the test.
    """
    _check_unknown_options(unknown_options)
    step = _heavy_ball(
        check_positive("lr", lr),
        check_interval("beta", beta, 0.0, 1.0),
        check_nonnegative("weight_decay", weight_decay),
    )
    return _run(fun, x0, args, jac, callback, step=step, maxiter=maxiter, gtol=gtol, is_am=False)


def _am_momentum(lr, beta_max, wd, am):
    def step(xs, gs, f, state):
        state = _core.am_momentum_init(xs) if state is None else state
        return _core.am_momentum_step(
            xs, gs, state, lr=lr, beta_max=beta_max, f=f, weight_decay=wd, **am
        )

    return step


def _minimize_am_mgd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    lam=0.0,
    beta_max=1.0,
    numerator="exact",
    weight_decay=0.0,
    per_layer=False,
    variant=None,
    beta_min=0.5,
    theta=0.7,
    beta_high=0.9,
    beta_low=0.1,
    maxiter=1000,
    gtol=1e-5,
    **unknown_options,
) -> OptimizeResult:
    r"""Adaptive Memory momentum gradient descent (AM-MGD).

    .. math::

        \beta_t &= \operatorname{clip}\Big(
            \frac{(f(x_{t-1}) - f(x_t))(1+\lambda)/\eta
                  - \langle d_t - g_t, g_t + \lambda d_t\rangle}
                 {\|d_t - g_t\|^2}, 0, \beta_{\max}\Big) \\
        d_{t+1} &= g_t + \tfrac{\beta_t+\lambda}{1+\lambda}(d_t - g_t), \qquad
        x_{t+1} = x_t - \eta\, d_{t+1}

    with :math:`d_0 = g_0` and :math:`\beta_t = 0` when the denominator vanishes.

    Options
    -------
    lr : float
        Step size :math:`\eta > 0` (the paper uses ``1/L``).
    lam : float
        Proximal regularisation :math:`\lambda \ge 0`.
    beta_max : float
        Upper bound of :math:`\beta_t`, in [0, 1].
    numerator : {"exact", "linear"}
        ``"exact"`` uses the decrease of f (needs f values); ``"linear"`` the
        linearised numerator :math:`(1+\lambda)\|g\|^2 - \lambda\|d-g\|^2`.
    weight_decay : float
        Coupled L2 weight decay.
    per_layer : bool
        With a list of arrays as ``x0``: one beta per array instead of one global beta.
    variant : {None, "clip", "restart"}
        ``"clip"``: :math:`\max(\beta_t, \beta_{\min})`; ``"restart"``:
        ``beta_high`` if :math:`\beta_t \ge \theta` else ``beta_low``.
    beta_min, theta, beta_high, beta_low : float
        Variant parameters, in [0, 1].
    maxiter : int
        Maximum number of steps.
    gtol : float
        Stop when ``max|g| <= gtol``; 0 disables the test.
    """
    _check_unknown_options(unknown_options)
    am = check_am_options(
        lam=lam,
        numerator=numerator,
        variant=variant,
        beta_min=beta_min,
        theta=theta,
        beta_high=beta_high,
        beta_low=beta_low,
        per_layer=per_layer,
    )
    step = _am_momentum(
        check_positive("lr", lr),
        check_interval("beta_max", beta_max, 0.0, 1.0),
        check_nonnegative("weight_decay", weight_decay),
        am,
    )
    return _run(fun, x0, args, jac, callback, step=step, maxiter=maxiter, gtol=gtol, is_am=True)


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


def _minimize_sgd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    weight_decay=0.0,
    maxiter=1000,
    batch_size=None,
    seed=None,
    replace=False,
    gtol=0.0,
    **unknown_options,
) -> OptimizeResult:
    r"""Stochastic gradient descent on a :class:`~amopt.FiniteSum` (or a stochastic oracle).

    Options
    -------
    lr : float
        Step size.
    weight_decay : float
        Coupled L2 weight decay.
    maxiter : int
        Number of mini-batch steps.
    batch_size : int
        Mini-batch size (default 32) when ``fun`` is a FiniteSum.
    seed : int, numpy.random.Generator or None
        Seed of the sampler; the same seed gives the same trajectory.
    replace : bool
        ``False`` (default): epochs of random reshuffling, every sample once per
        epoch. ``True``: i.i.d. uniform indices with replacement (the theory setting).
    gtol : float
        Stop when the mini-batch ``max|g| <= gtol``; 0 (default) disables the test.

    Notes
    -----
    With a plain callable ``fun``, it is treated as a (possibly stochastic)
    oracle: each step evaluates it once at the current iterate.
    """
    _check_unknown_options(unknown_options)
    lr = check_positive("lr", lr)
    wd = check_nonnegative("weight_decay", weight_decay)

    def step(xs, gs, f, state):
        return _core.gd_step(xs, gs, lr=lr, weight_decay=wd), None, None

    sampling = _sampling(fun, batch_size, seed, replace, gtol, always=True)
    return _run(fun, x0, args, jac, callback, step=step, maxiter=maxiter, is_am=False, **sampling)


def _minimize_msgd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    beta=0.9,
    weight_decay=0.0,
    maxiter=1000,
    batch_size=None,
    seed=None,
    replace=False,
    gtol=0.0,
    **unknown_options,
) -> OptimizeResult:
    r"""Stochastic damped heavy ball (MSGD) with fixed ``beta``.

    Options
    -------
    lr, beta, weight_decay
        As for ``"mgd"``.
    maxiter, batch_size, seed, replace, gtol
        As for ``"sgd"``.
    """
    _check_unknown_options(unknown_options)
    step = _heavy_ball(
        check_positive("lr", lr),
        check_interval("beta", beta, 0.0, 1.0),
        check_nonnegative("weight_decay", weight_decay),
    )
    sampling = _sampling(fun, batch_size, seed, replace, gtol, always=True)
    return _run(fun, x0, args, jac, callback, step=step, maxiter=maxiter, is_am=False, **sampling)


def _minimize_am_sgd(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    lam=0.1,
    beta_max=0.9,
    numerator="linear",
    weight_decay=0.0,
    per_layer=False,
    variant=None,
    beta_min=0.5,
    theta=0.7,
    beta_high=0.9,
    beta_low=0.1,
    maxiter=1000,
    batch_size=None,
    seed=None,
    replace=False,
    gtol=0.0,
    **unknown_options,
) -> OptimizeResult:
    r"""Adaptive Memory momentum SGD (AM-MSGD), the paper's stochastic rule.

    .. math::

        \beta_t = \operatorname{clip}\Big(
            \frac{(1+\lambda)\|g_t\|^2 - \lambda \|d_t - g_t\|^2}{\|d_t - g_t\|^2},
            0, \beta_{\max}\Big), \quad
        d_{t+1} = g_t + \tfrac{\beta_t+\lambda}{1+\lambda}(d_t - g_t), \quad
        x_{t+1} = x_t - \eta\, d_{t+1}

    Options
    -------
    lr, lam, beta_max, numerator, weight_decay, per_layer, variant
        As for ``"am-mgd"``, with defaults ``lam=0.1``, ``beta_max=0.9``,
        ``numerator="linear"`` (the exact numerator would compare f on two
        different mini-batches).
    beta_min, theta, beta_high, beta_low
        As for ``"am-mgd"``.
    maxiter, batch_size, seed, replace, gtol
        As for ``"sgd"``.
    """
    _check_unknown_options(unknown_options)
    am = check_am_options(
        lam=lam,
        numerator=numerator,
        variant=variant,
        beta_min=beta_min,
        theta=theta,
        beta_high=beta_high,
        beta_low=beta_low,
        per_layer=per_layer,
    )
    step = _am_momentum(
        check_positive("lr", lr),
        check_interval("beta_max", beta_max, 0.0, 1.0),
        check_nonnegative("weight_decay", weight_decay),
        am,
    )
    sampling = _sampling(fun, batch_size, seed, replace, gtol, always=True)
    return _run(fun, x0, args, jac, callback, step=step, maxiter=maxiter, is_am=True, **sampling)


def _adam_family(
    fun,
    x0,
    args,
    jac,
    callback,
    *,
    lr,
    betas,
    eps,
    weight_decay,
    decoupled,
    maxiter,
    gtol,
    batch_size,
    seed,
    replace,
):
    lr = check_positive("lr", lr)
    betas = check_betas("betas", betas)
    eps = check_nonnegative("eps", eps)
    wd = check_nonnegative("weight_decay", weight_decay)

    def step(xs, gs, f, state):
        state = _core.adam_init(xs) if state is None else state
        xs, state = _core.adam_step(
            xs, gs, state, lr=lr, betas=betas, eps=eps, weight_decay=wd, decoupled=decoupled
        )
        return xs, state, None

    sampling = _sampling(fun, batch_size, seed, replace, gtol, always=False)
    return _run(fun, x0, args, jac, callback, step=step, maxiter=maxiter, is_am=False, **sampling)


def _minimize_adam(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    maxiter=1000,
    gtol=None,
    batch_size=None,
    seed=None,
    replace=False,
    **unknown_options,
) -> OptimizeResult:
    r"""Adam, exactly as ``torch.optim.Adam`` (L2 weight decay added to the gradient).

    .. math::

        m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\;
        v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2,\;
        x_t = x_{t-1} - \frac{\eta}{1-\beta_1^t}\frac{m_t}{\sqrt{v_t/(1-\beta_2^t)}+\epsilon}

    Options
    -------
    lr : float
        Learning rate.
    betas : (float, float)
        :math:`(\beta_1, \beta_2)`, each in [0, 1).
    eps : float
        Denominator term :math:`\epsilon \ge 0`.
    weight_decay : float
        L2 penalty added to the gradient.
    maxiter : int
        Maximum number of steps.
    gtol : float
        Stop when ``max|g| <= gtol``; default 1e-5 full batch, 0 (off) with ``batch_size``.
    batch_size, seed, replace
        With a :class:`~amopt.FiniteSum` ``fun``: mini-batch steps (see ``"sgd"``);
        ``batch_size=None`` uses the full gradient.
    """
    _check_unknown_options(unknown_options)
    return _adam_family(
        fun,
        x0,
        args,
        jac,
        callback,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        decoupled=False,
        maxiter=maxiter,
        gtol=gtol,
        batch_size=batch_size,
        seed=seed,
        replace=replace,
    )


def _minimize_adamw(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=1e-2,
    maxiter=1000,
    gtol=None,
    batch_size=None,
    seed=None,
    replace=False,
    **unknown_options,
) -> OptimizeResult:
    r"""AdamW, exactly as ``torch.optim.AdamW`` (decoupled weight decay).

    Options
    -------
    lr, betas, eps, maxiter, gtol, batch_size, seed, replace
        As for ``"adam"``.
    weight_decay : float
        Decoupled weight decay: :math:`x \leftarrow (1 - \eta\mu) x` before the step.
    """
    _check_unknown_options(unknown_options)
    return _adam_family(
        fun,
        x0,
        args,
        jac,
        callback,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        decoupled=True,
        maxiter=maxiter,
        gtol=gtol,
        batch_size=batch_size,
        seed=seed,
        replace=replace,
    )


def _am_adam_family(
    fun,
    x0,
    args,
    jac,
    callback,
    *,
    lr,
    betas,
    eps,
    weight_decay,
    mode,
    maxiter,
    gtol,
    batch_size,
    seed,
    replace,
    am,
):
    lr = check_positive("lr", lr)
    betas = check_betas("betas", betas)
    eps = check_nonnegative("eps", eps)
    wd = check_nonnegative("weight_decay", weight_decay)
    l2 = mode == "l2"

    def step(xs, gs, f, state):
        state = _core.am_adam_init(xs) if state is None else state
        if l2 and wd != 0:
            gs = tuple(g + wd * x for g, x in zip(gs, xs, strict=True))
        return _core.am_adam_step(
            xs,
            gs,
            state,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=0.0 if l2 else wd,
            weight_decay_mode="decoupled" if l2 else mode,
            f=f,
            **am,
        )

    sampling = _sampling(fun, batch_size, seed, replace, gtol, always=False)
    return _run(fun, x0, args, jac, callback, step=step, maxiter=maxiter, is_am=True, **sampling)


def _minimize_am_adam(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=0.0,
    lam=0.1,
    numerator="linear",
    per_layer=True,
    variant=None,
    beta_min=0.5,
    theta=0.7,
    beta_high=0.9,
    beta_low=0.1,
    maxiter=1000,
    gtol=None,
    batch_size=None,
    seed=None,
    replace=False,
    **unknown_options,
) -> OptimizeResult:
    r"""AM-Adam: Adam whose first-moment coefficient is the Adaptive Memory beta.

    .. math::

        p_t &= (1 - \beta_{1,\max}\textstyle\prod_{s<t}\beta_s)(\epsilon + \sqrt{\hat v_t}), \quad
        \beta_t = \operatorname{clip}(N_t / D_t, 0, \beta_{1,\max}) \\
        d_{t+1} &= g_t + \frac{\beta_t + \lambda p_t}{1 + \lambda p_t}(d_t - g_t), \quad
        x_{t+1} = x_t - \eta\, d_{t+1} / p_t

    (``N``, ``D`` as in :func:`amopt.am_adam_beta`; algorithms.md section 3.)

    Options
    -------
    lr : float
        Learning rate.
    betas : (float, float)
        :math:`(\beta_{1,\max}, \beta_2)`, each in [0, 1).
    eps : float
        Denominator term.
    weight_decay : float
        L2 penalty added to the gradient (AM-Adam has no decoupled decay).
    lam : float
        Proximal regularisation :math:`\lambda \ge 0` (default 0.1).
    numerator : {"linear", "exact"}
        ``"exact"`` uses the decrease of f (full batch only makes sense).
    per_layer : bool
        One beta per array of ``x0`` (default) or one global beta.
    variant, beta_min, theta, beta_high, beta_low
        As for ``"am-mgd"``.
    maxiter, gtol, batch_size, seed, replace
        As for ``"adam"``.
    """
    _check_unknown_options(unknown_options)
    am = check_am_options(
        lam=lam,
        numerator=numerator,
        variant=variant,
        beta_min=beta_min,
        theta=theta,
        beta_high=beta_high,
        beta_low=beta_low,
        per_layer=per_layer,
    )
    return _am_adam_family(
        fun,
        x0,
        args,
        jac,
        callback,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        mode="l2",
        maxiter=maxiter,
        gtol=gtol,
        batch_size=batch_size,
        seed=seed,
        replace=replace,
        am=am,
    )


def _minimize_am_adamw(
    fun,
    x0,
    args=(),
    jac=None,
    callback=None,
    *,
    lr=1e-3,
    betas=(0.9, 0.999),
    eps=1e-8,
    weight_decay=1e-2,
    weight_decay_mode="decoupled",
    lam=0.1,
    numerator="linear",
    per_layer=True,
    variant=None,
    beta_min=0.5,
    theta=0.7,
    beta_high=0.9,
    beta_low=0.1,
    maxiter=1000,
    gtol=None,
    batch_size=None,
    seed=None,
    replace=False,
    **unknown_options,
) -> OptimizeResult:
    r"""AM-AdamW: AM-Adam with decoupled (or proximal) weight decay.

    .. math::

        x_{t+1} = (1 - \eta\mu)\, x_t - \eta\, d_{t+1}/p_t \quad\text{(decoupled)},\qquad
        x_{t+1} = \frac{x_t - \eta\, d_{t+1}/p_t}{1 + \eta\mu} \quad\text{(proximal)}

    The beta rule includes the weight-decay terms of algorithms.md section 3;
    with ``numerator="exact"`` it is the paper's general formula with
    :math:`f(x_{t-1}) - f(x_t)`.

    Options
    -------
    weight_decay : float
        :math:`\mu \ge 0` (default 1e-2, as ``torch.optim.AdamW``).
    weight_decay_mode : {"decoupled", "proximal"}
        How the decay is applied.
    lr, betas, eps, lam, numerator, per_layer, variant, beta_min, theta, beta_high, beta_low
        As for ``"am-adam"``.
    maxiter, gtol, batch_size, seed, replace
        As for ``"adam"``.
    """
    _check_unknown_options(unknown_options)
    am = check_am_options(
        lam=lam,
        numerator=numerator,
        variant=variant,
        beta_min=beta_min,
        theta=theta,
        beta_high=beta_high,
        beta_low=beta_low,
        per_layer=per_layer,
    )
    mode = check_weight_decay_mode(weight_decay_mode)
    return _am_adam_family(
        fun,
        x0,
        args,
        jac,
        callback,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        mode=mode,
        maxiter=maxiter,
        gtol=gtol,
        batch_size=batch_size,
        seed=seed,
        replace=replace,
        am=am,
    )


METHODS: dict[str, Callable[..., OptimizeResult]] = {
    "gd": _minimize_gd,
    "mgd": _minimize_mgd,
    "am-mgd": _minimize_am_mgd,
    "adam": _minimize_adam,
    "adamw": _minimize_adamw,
    "am-adam": _minimize_am_adam,
    "am-adamw": _minimize_am_adamw,
    "sgd": _minimize_sgd,
    "msgd": _minimize_msgd,
    "am-sgd": _minimize_am_sgd,
}


def _method(method: Any) -> Callable[..., OptimizeResult]:
    if not isinstance(method, str) or method.lower() not in METHODS:
        raise ValueError(f"Unknown method {method!r}; method must be one of: {', '.join(METHODS)}")
    return METHODS[method.lower()]


def minimize(
    fun: Callable | FiniteSum,
    x0: Any,
    args: tuple = (),
    method: str = "am-mgd",
    jac: Callable | bool | None = None,
    callback: Callable | None = None,
    tol: float | None = None,
    options: dict | None = None,
) -> OptimizeResult:
    r"""Minimise a function with Adaptive Memory momentum or a baseline, scipy-style.

    Parameters
    ----------
    fun : callable or FiniteSum
        ``fun(x, *args) -> float`` (or ``(float, grad)`` with ``jac=True``), or a
        :class:`~amopt.FiniteSum` object, which the stochastic methods sample
        mini-batches from.
    x0 : array or list/tuple of arrays
        Initial point: a NumPy, CuPy, torch or array-api-strict array (any
        shape), a list of Python numbers, or a list/tuple of arrays (a
        parameter list: ``fun`` and ``jac`` then take and return such lists,
        and ``per_layer`` gives one beta per array). Computation stays on the
        caller's library and device.
    args : tuple
        Extra arguments to ``fun`` and ``jac``.
    method : str
        Full batch: ``"gd"``, ``"mgd"``, ``"am-mgd"`` (default), ``"adam"``,
        ``"adamw"``, ``"am-adam"``, ``"am-adamw"``. Mini-batch, on a FiniteSum:
        ``"sgd"``, ``"msgd"``, ``"am-sgd"``, and the Adam family with
        ``batch_size``.
    jac : callable, True or None
        Gradient ``jac(x, *args)``; ``True`` if ``fun`` returns ``(f, g)``;
        ``None``: forward finite differences (NumPy only, with a warning).
    callback : callable, optional
        ``callback(intermediate_result)`` after each step, where the
        :class:`~scipy.optimize.OptimizeResult` has ``x``, ``fun``, ``nit``,
        ``jac`` (full batch) and ``beta`` (AM methods); the legacy
        ``callback(xk)`` works too. Raising ``StopIteration`` stops the run
        (status 99).
    tol : float, optional
        Shortcut for ``options["gtol"]``.
    options : dict, optional
        Method options: see ``show_options`` in each ``_minimize_<method>``
        docstring (``lr``, ``lam``, ``beta_max``, ``beta``, ``betas``, ``eps``,
        ``weight_decay``, ``weight_decay_mode``, ``numerator``, ``variant``,
        ``beta_min``, ``theta``, ``beta_high``, ``beta_low``, ``per_layer``,
        ``maxiter``, ``gtol``, ``batch_size``, ``seed``, ``replace``). Unknown
        options raise an ``OptimizeWarning``.

    Returns
    -------
    res : scipy.optimize.OptimizeResult
        ``x`` (the caller's array type and device), ``fun``, ``jac``, ``nit``,
        ``nfev``, ``njev``, ``status``, ``success``, ``message``, and for AM
        methods ``betas``: the :math:`\beta_t` of every step as a NumPy array
        (shape ``(nit,)``, or ``(nit, len(x0))`` with ``per_layer``). A run that
        meets a NaN or infinity stops with status 2 and returns the last finite
        iterate.

    Examples
    --------
    >>> import numpy as np
    >>> import amopt
    >>> A = np.diag([1.0, 10.0])
    >>> res = amopt.minimize(lambda x: 0.5 * x @ A @ x, np.array([1.0, 1.0]),
    ...                      jac=lambda x: A @ x, options={"lr": 0.1, "gtol": 1e-8})
    >>> res.success, bool(np.allclose(res.x, 0.0, atol=1e-7))
    (True, True)
    """
    meth = _method(method)
    options = dict(options or {})
    if tol is not None:
        options.setdefault("gtol", tol)
    return meth(fun, x0, args, jac, callback, **options)


def scipy_method(name: str) -> Callable[..., OptimizeResult]:
    """A custom ``method=`` for :func:`scipy.optimize.minimize` (NumPy arrays).

    Parameters
    ----------
    name : str
        One of the :func:`amopt.minimize` methods.

    Returns
    -------
    callable
        ``f(fun, x0, args=(), jac=None, callback=None, **options)`` accepting and
        ignoring scipy's extra keywords (``hess``, ``hessp``, ``bounds``,
        ``constraints`` when empty).

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.optimize import minimize
    >>> import amopt
    >>> res = minimize(lambda x: float(x @ x), np.ones(3), jac=lambda x: 2 * x,
    ...                method=amopt.scipy_method("am-mgd"), options={"lr": 0.25})
    >>> res.success
    True
    """
    meth = _method(name)

    def _custom(
        fun,
        x0,
        args=(),
        jac=None,
        hess=None,
        hessp=None,
        bounds=None,
        constraints=(),
        callback=None,
        **options,
    ):
        if bounds is not None:
            raise ValueError(f"method {name!r} does not support bounds; got bounds={bounds!r}")
        if constraints not in (None, (), []):
            raise ValueError(f"method {name!r} does not support constraints")
        cb = callback
        if callback is not None:
            # scipy wraps the user's callback to take an OptimizeResult and reads
            # `stop_iteration` afterwards to set status 99 itself.
            def cb(intermediate_result):
                try:
                    callback(intermediate_result)
                except StopIteration:
                    callback.stop_iteration = True
                    raise

        return meth(fun, x0, args, jac, cb, **options)

    _custom.__name__ = f"amopt_{name.replace('-', '_')}"
    _custom.__doc__ = meth.__doc__
    return _custom
