"""The loop shared by every ``amopt.minimize`` method.

The objective wrapper (``fun``/``jac``/``args`` or a :class:`~amopt.FiniteSum`),
the map between the user's ``x0`` and the core's tuple of arrays, the mini-batch
sampler, the callback protocol, the status table, and the one iteration loop
(:func:`_iterate`) with its readers: how the values it tests are read back, at once
on the host, in one transfer per iteration on a device, or one step behind the
device when pipelined. Every step itself is a call into :mod:`amopt.optimize.steps`, made
by the methods in :mod:`amopt.optimize.methods`.
"""

from __future__ import annotations

import inspect
import math
import numbers
import warnings
from collections.abc import Callable
from typing import Any

import array_api_compat
import numpy as np
from scipy.optimize import OptimizeResult, OptimizeWarning

from amopt.backends import dask as _lazy
from amopt.backends.device import asynchronous, is_device, read, start_read, to_device
from amopt.core.config import check_bool, check_int, check_nonnegative
from amopt.core.xp import array_namespace, is_array
from amopt.optimize.finite_sum import FiniteSum

__all__ = ["STATUS_MESSAGES"]

#: Termination reasons: key -> (status, message). The single source of messages.
STATUS_MESSAGES: dict[str, tuple[int, str]] = {
    "gtol": (0, "Optimization terminated successfully: the gradient norm is at most `gtol`."),
    # scipy's status 1 for every method, full batch and mini-batch alike
    "maxiter": (1, "Maximum number of iterations has been exceeded."),
    "nonfinite": (
        2,
        "NaN or infinite value encountered in the objective, the gradient or the iterate; "
        "returning the last finite iterate.",
    ),
    # a run that ends above where it started has failed, however slowly it diverged
    "increased": (
        2,
        "The objective increased: f at the last iterate is above f(x0). The run diverged "
        "(`lr` too large) or, with momentum, stopped in a transient (`maxiter` too small).",
    ),
    "nonfinite_x0": (2, "NaN or infinite value in `x0`; no step was taken."),
    "callback": (99, "`callback` raised `StopIteration`."),
}

#: Mini-batch size of the sgd-type methods when ``batch_size`` is not given
#: (capped at ``fun.n_samples``).
DEFAULT_BATCH_SIZE = 32

# --------------------------------------------------------------------------- structure


def _type_name(obj: Any) -> str:
    t = type(obj)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _describe(obj: Any) -> str:
    """A short description of a returned value, for error messages."""
    if obj is None:
        return "None"
    if is_array(obj):
        return f"a {_type_name(obj)} of shape {tuple(obj.shape)} and dtype {obj.dtype}"
    text = repr(obj)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({_type_name(obj)})"


def _reject_masked(a: Any, name: str) -> None:
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(
            f"{name} is a numpy.ma.MaskedArray, which amopt does not support (the mask would "
            "be ignored); pass a plain array, e.g. a.filled(value) or the unmasked entries"
        )


def _numeric_kind(xp: Any, dtype: Any) -> str | None:
    """``"real"`` (bool, integer, real floating), ``"complex"``, or None (not numeric)."""
    try:
        if xp.isdtype(dtype, "complex floating"):
            return "complex"
        if xp.isdtype(dtype, ("real floating", "integral", "bool")):
            return "real"
    except (TypeError, ValueError):
        pass
    return None


class _Layout:
    """How the user's ``x0`` maps to the tuple of arrays the core works on.

    The core gets copies of ``x0`` (so that no result aliases the caller's
    arrays), in a real floating dtype, with 0-d arrays handled as shape
    ``(1,)``; :meth:`pack` restores the user's shapes and structure.
    """

    def __init__(self, x0: Any):
        _reject_masked(x0, "x0")
        # NumPy scalars are numbers here, as scipy reads them: [np.float64(1), ...] is a vector
        if (
            isinstance(x0, list | tuple)
            and len(x0) > 0
            and all(is_array(a) and not isinstance(a, np.generic) for a in x0)
        ):
            self.container: type | None = type(x0)
            arrays = tuple(x0)
            for i, a in enumerate(arrays):
                _reject_masked(a, f"x0[{i}]")
        else:
            self.container = None
            if x0 is None:
                raise TypeError("x0 must be an array, a number or a list of numbers; got None")
            if not is_array(x0) or isinstance(x0, np.generic):
                try:
                    x0 = np.asarray(x0)
                except (TypeError, ValueError) as exc:
                    raise ValueError(
                        "x0 must be an array, a number, a (nested) list of numbers or a "
                        f"list/tuple of arrays; got {_describe(x0)}: {exc}"
                    ) from None
            arrays = (x0,)
        self.xp = array_namespace(*arrays)
        # a torch x0 that requires grad: the run works on detached copies (no autograd
        # history is built through the steps, and the result does not require grad)
        arrays = tuple(
            a.detach() if getattr(a, "requires_grad", False) is True else a for a in arrays
        )
        arrays = tuple(self._as_float(a, i) for i, a in enumerate(arrays))
        self.user_shapes = [tuple(a.shape) for a in arrays]
        self.zero_d = any(s == () for s in self.user_shapes)
        xp = self.xp
        self.arrays = tuple(xp.reshape(a, (1,)) if a.ndim == 0 else a for a in self.copy(arrays))
        self.shapes = [tuple(a.shape) for a in self.arrays]
        self.devices = [array_api_compat.device(a) for a in self.arrays]
        self._fast_shape = None if self.zero_d else self.shapes[0]
        #: copy every returned gradient; the device loop copies only the one it returns
        self.copy_grads = True

    def _name(self, i: int) -> str:
        return "x0" if self.container is None else f"x0[{i}]"

    def _as_float(self, a: Any, i: int) -> Any:
        xp = self.xp
        name = self._name(i)
        if xp.isdtype(a.dtype, "complex floating"):
            raise TypeError(
                f"{name} has complex dtype {a.dtype}; amopt supports real floating dtypes "
                "(float16, bfloat16, float32, float64). Split complex parameters into real "
                "and imaginary parts."
            )
        if xp.isdtype(a.dtype, "real floating"):
            return a
        if _numeric_kind(xp, a.dtype) == "real":
            info = xp.__array_namespace_info__()
            dtype = info.default_dtypes(device=getattr(a, "device", None))["real floating"]
            return xp.astype(a, dtype)
        raise TypeError(f"{name} must have a real floating dtype; got dtype {a.dtype}")

    def copy(self, arrays: tuple) -> tuple:
        """Copies of ``arrays``, for what is handed to the caller and kept from the caller."""
        xp = self.xp
        return tuple(
            a.copy() if type(a) is np.ndarray else xp.asarray(a, copy=True) for a in arrays
        )

    def pack(self, arrays: tuple) -> Any:
        """The user's structure (and shapes) from the core's tuple."""
        if self.zero_d:
            arrays = tuple(
                self.xp.reshape(a, ()) if s == () else a
                for a, s in zip(arrays, self.user_shapes, strict=True)
            )
        return arrays[0] if self.container is None else self.container(arrays)

    def unpack(self, obj: Any, what: str) -> tuple:
        """The core's tuple from a user-returned gradient: checked, in x's dtype, and a copy."""
        if self.container is None:
            if (
                type(obj) is np.ndarray
                and obj.shape == self._fast_shape
                and obj.dtype == self.arrays[0].dtype
            ):
                return (obj.copy(),)  # the common case, checked without the array-API wrappers
            arrays = (obj,)
        else:
            if not isinstance(obj, list | tuple) or len(obj) != len(self.shapes):
                raise ValueError(
                    f"{what} must return a list of {len(self.shapes)} arrays like x0; "
                    f"got {_describe(obj)}"
                )
            arrays = tuple(obj)
        return tuple(self._gradient(a, i, what) for i, a in enumerate(arrays))

    def _gradient(self, a: Any, i: int, what: str) -> Any:
        x = self.arrays[i]
        if (
            type(a) is type(x)
            and a.dtype == x.dtype
            and a.shape == x.shape
            and not self.zero_d
            and not self.copy_grads
            and (type(x) is np.ndarray or array_api_compat.device(a) == self.devices[i])
        ):
            # what the device loop gets at every iteration: the checks below would pass
            # (the same array type, hence namespace, dtype, shape and device); the
            # messages they format cost more than the step's host work
            return a
        xp = self.xp
        where = "" if self.container is None else f"[{i}]"
        name = self._name(i)
        shape = self.user_shapes[i]
        expected = f"an array of shape {shape} like {name} ({_type_name(x)}, dtype {x.dtype})"
        if a is None or isinstance(a, str | bytes | dict | set) or callable(a):
            raise TypeError(f"{what} must return {expected}; got {_describe(a)}")
        _reject_masked(a, f"the gradient returned by {what}")
        if is_array(a) and not isinstance(a, np.generic):
            if array_namespace(a) is not xp:
                raise TypeError(
                    f"{what} returned {_describe(a)}{where}, but {name} is a {_type_name(x)}; "
                    "return the gradient as the same array type as x0"
                )
            if array_api_compat.device(a) != self.devices[i]:
                raise ValueError(
                    f"{what} returned an array{where} on device {array_api_compat.device(a)}, "
                    f"but {name} is on device {self.devices[i]}"
                )
            copied = False
        else:
            try:
                a = xp.asarray(a, device=self.devices[i])
            except (TypeError, ValueError, RuntimeError) as exc:
                raise TypeError(f"{what} must return {expected}; got {_describe(a)}") from exc
            copied = True
        kind = _numeric_kind(xp, a.dtype)
        if kind != "real":
            raise TypeError(
                f"{what} must return {expected}; got an array{where} of "
                f"{'complex ' if kind == 'complex' else 'non-numeric '}dtype {a.dtype}"
            )
        if tuple(a.shape) != shape:
            raise ValueError(
                f"{what} returned an array{where} of shape {tuple(a.shape)}, but x0{where} "
                f"has shape {shape}; the gradient must have the shape of x"
            )
        if a.dtype != x.dtype:
            a = xp.astype(a, x.dtype)  # e.g. an integer gradient: promote, never truncate
        elif not copied and self.copy_grads:
            a = a.copy() if type(a) is np.ndarray else xp.asarray(a, copy=True)
        return xp.reshape(a, (1,)) if shape == () else a

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
                if not math.isfinite(np.add.reduce(a, axis=None)):
                    with np.errstate(invalid="ignore"):  # inf * 0 is the NaN looked for
                        if not math.isfinite(np.add.reduce(a * 0.0, axis=None)):
                            return False
            return True
        return math.isfinite(self.max_abs(arrays))

    def sq_norm(self, arrays: tuple) -> float:
        """:math:`\\sum \\|x\\|^2` over all arrays, accumulated in at least float32."""
        xp = self.xp
        total = 0.0
        for a in arrays:
            if type(a) is np.ndarray:
                a = a.reshape(-1).astype(np.float64, copy=False)
                total += float(np.dot(a, a))
            elif a.dtype == xp.float64:
                total += float(xp.sum(a * a))
            else:
                a = xp.astype(a, xp.float32)
                total += float(xp.sum(a * a))
        return total


def _scalar(f: Any, what: str) -> float:
    """``float(f)`` for a real scalar (or a one-element real array) returned by ``what``."""
    if type(f) is float or type(f) is np.float64:
        return float(f)
    if isinstance(f, numbers.Real) and not isinstance(f, bool):
        return float(f)
    if is_array(f) and not isinstance(f, np.generic):
        if math.prod(f.shape) != 1:
            raise ValueError(f"{what} must return a scalar; got an array of shape {f.shape}")
        kind = _numeric_kind(array_namespace(f), f.dtype)
        if kind == "real" and f.dtype != getattr(array_namespace(f), "bool", None):
            return float(f.reshape(()) if hasattr(f, "reshape") else f)
    raise TypeError(f"{what} must return a real scalar; got {_describe(f)}")


def _deferred_scalar(f: Any, what: str, xp: Any, like: Any = None) -> Any:
    """:func:`_scalar` without reading a 0-d array of ``xp``: checked, returned as 0-d.

    ``like`` (an array of ``xp``): a 0-d ``f`` of its type and dtype passes as it is.
    """
    if like is not None and type(f) is type(like) and f.ndim == 0 and f.dtype == like.dtype:
        return f
    if is_array(f) and not isinstance(f, np.generic) and array_namespace(f) is xp:
        if math.prod(f.shape) != 1:
            raise ValueError(f"{what} must return a scalar; got an array of shape {f.shape}")
        if _numeric_kind(xp, f.dtype) != "real" or f.dtype == xp.bool:
            raise TypeError(f"{what} must return a real scalar; got {_describe(f)}")
        return f if f.ndim == 0 else xp.reshape(f, ())
    return _scalar(f, what)


def _method_of(obj: Any, name: str) -> Callable | None:
    """``obj.<name>`` when ``obj`` is an object (not a plain function) with that method."""
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isbuiltin(obj):
        return None
    method = getattr(type(obj), name, None)
    return getattr(obj, name) if callable(method) else None


class _Objective:
    """Wraps ``fun``/``jac``/``args`` (or a FiniteSum) and counts evaluations.

    With ``defer`` set (device arrays), a value returned as a 0-d array of ``x0``'s
    library is checked but not read: it stays on the device for :func:`read`.
    """

    defer = False

    def __init__(self, fun, jac, args, layout: _Layout):
        self.layout = layout
        self.args = args if isinstance(args, tuple) else (args,)
        self.nfev = 0
        self.njev = 0
        self.finite_sum = isinstance(fun, FiniteSum)
        if self.finite_sum:
            self.n_samples = check_int("fun.n_samples", fun.n_samples, 1)
            if self.args:
                raise ValueError(
                    f"args={self.args!r} cannot be used with a FiniteSum fun: its "
                    "value_and_grad and batch_value_and_grad take no extra arguments "
                    "(store them on the object instead)"
                )
            # jac, a method of the FiniteSum object itself (jac=fun.grad), agrees with it
            if jac is not None and jac is not True and getattr(jac, "__self__", None) is not fun:
                warnings.warn(
                    f"jac={jac!r} is ignored: with a FiniteSum fun the gradients come from "
                    "fun.value_and_grad and fun.batch_value_and_grad",
                    OptimizeWarning,
                    stacklevel=5,
                )
        elif not callable(fun):
            raise TypeError(f"fun must be callable or a FiniteSum; got {type(fun).__name__}")
        self.fun = fun
        self.fd = False
        #: ``fun.value_and_grad`` when ``fun`` is an objective object that gives it
        self.pair = None
        if jac is None and not self.finite_sum:
            # an objective object (every amopt.problems class, or any object with a
            # ``value_and_grad`` or ``grad`` method) gives its own gradient: finite
            # differences would cost n + 1 calls of fun per step for a worse gradient
            pair, grad = _method_of(fun, "value_and_grad"), _method_of(fun, "grad")
            if pair is not None:
                self.pair = pair
            elif grad is not None:
                jac = grad
        if self.finite_sum or jac is True or self.pair is not None:
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
                "(n + 1 evaluations of fun per iteration, relative step sqrt(eps) of the "
                "dtype of x0). Pass jac= for speed and accuracy.",
                OptimizeWarning,
                stacklevel=4,
            )
            self.jac = None
            self.fd = True
        else:
            raise TypeError(f"jac must be callable, True or None; got jac={jac!r}")
        self.jac_is_true = jac is True and not self.finite_sum

    def scalar(self, f: Any, what: str) -> Any:
        """The objective value ``f`` returned by ``what``, checked (a float, or deferred)."""
        if self.defer:
            return _deferred_scalar(f, what, self.layout.xp, self.layout.arrays[0])
        return _scalar(f, what)

    def point(self, arrays: tuple) -> Any:
        """A copy of the iterate for ``fun`` or ``jac``, as scipy hands them: what they do
        to it cannot change the run.

        Device arrays (``defer``) are handed as they are: a copy per evaluation would be
        a pass over device memory each (the device loop's traffic is budgeted); there
        ``fun`` and ``jac`` must not modify their argument, as a torch ``closure``.
        """
        if self.defer:
            return self.layout.pack(arrays)
        return self.layout.pack(self.layout.copy(arrays))

    def __call__(self, arrays: tuple) -> tuple[float, tuple]:
        """Full objective value and gradient at ``arrays``."""
        x = self.point(arrays)
        if self.finite_sum:
            self.nfev += 1
            self.njev += 1
            f, g = self._pair(self.fun.value_and_grad(x), "fun.value_and_grad")
            f = self.scalar(f, "fun.value_and_grad")
            return f, self.layout.unpack(g, "fun.value_and_grad")
        if self.jac_is_true:
            self.nfev += 1
            self.njev += 1
            f, g = self._pair(self.fun(x, *self.args), "with jac=True, fun")
            return self.scalar(f, "fun"), self.layout.unpack(g, "fun (jac=True)")
        if self.pair is not None:
            self.nfev += 1
            self.njev += 1
            f, g = self._pair(self.pair(x, *self.args), "fun.value_and_grad")
            return self.scalar(f, "fun.value_and_grad"), self.layout.unpack(
                g, "fun.value_and_grad"
            )
        if self.fd:
            return self._finite_difference(arrays)
        self.nfev += 1
        self.njev += 1
        f = self.scalar(self.fun(x, *self.args), "fun")
        return f, self.layout.unpack(self.jac(self.point(arrays), *self.args), "jac")

    @staticmethod
    def _pair(out: Any, what: str) -> tuple[Any, Any]:
        try:
            f, g = out
        except (TypeError, ValueError):
            raise TypeError(f"{what} must return a pair (f, g); got {_describe(out)}") from None
        return f, g

    def batch(self, arrays: tuple, indices: np.ndarray) -> tuple[float, tuple]:
        x = self.point(arrays)
        self.nfev += 1
        self.njev += 1
        what = "fun.batch_value_and_grad"
        f, g = self._pair(self.fun.batch_value_and_grad(x, indices), what)
        return self.scalar(f, what), self.layout.unpack(g, what)

    def _finite_difference(self, arrays: tuple) -> tuple[float, tuple]:
        """Forward differences with scipy's ``approx_derivative`` step rule.

        The step is :math:`h = \\sqrt{\\epsilon}\\,\\max(1, |x|)` with the sign of x,
        :math:`\\epsilon` that of the dtype of x (a float64 step is below float32
        resolution); the quotient divides by the step actually taken in that dtype.
        """

        def value(xs: tuple) -> float:
            self.nfev += 1
            return _scalar(self.fun(self.point(xs), *self.args), "fun")

        # one gradient evaluation (scipy's njev), of n + 1 values of fun (its nfev)
        self.njev += 1
        f0 = value(arrays)
        grads = []
        for i, a in enumerate(arrays):
            dtype = a.dtype
            x = a.reshape(-1).astype(np.float64)
            sign = np.where(x >= 0, 1.0, -1.0)
            h = math.sqrt(float(np.finfo(dtype).eps)) * sign * np.maximum(1.0, np.abs(x))
            x_h = (x + h).astype(dtype)
            dx = x_h.astype(np.float64) - x
            g = np.empty(x.size, dtype=np.float64)
            for j in range(x.size):
                perturbed = a.reshape(-1).copy()
                perturbed[j] = x_h[j]
                xs = arrays[:i] + (perturbed.reshape(a.shape),) + arrays[i + 1 :]
                g[j] = (value(xs) - f0) / dx[j]
            grads.append(g.reshape(a.shape).astype(dtype))
        return f0, tuple(grads)


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


class _DeviceSampler:
    """The indices of :class:`_Sampler`, drawn on the host and moved to the device in blocks.

    The same draws as the host sampler (hence the same batches as a NumPy run with the
    same seed), moved once per epoch (without replacement) or once per block of up to
    an epoch's worth of steps (with replacement, at most the steps left, so that a run
    that ends at ``maxiter`` draws what the host sampler draws). Each step slices the
    device array.
    """

    def __init__(self, sampler: _Sampler, xp: Any, like: Any, steps: int):
        self.sampler, self.xp, self.like, self.left = sampler, xp, like, steps
        self.block: Any = None
        self.pos = self.size = 0

    def __call__(self) -> Any:
        s = self.sampler
        if self.pos >= self.size:
            if s.replace:
                k = max(1, min(self.left, -(-s.n // s.batch_size)))
                host = np.concatenate([s() for _ in range(k)])
            else:
                host = s.rng.permutation(s.n)
            self.block = to_device(self.xp, host, self.like)
            self.pos, self.size = 0, host.size
        idx = self.block[self.pos : min(self.pos + s.batch_size, self.size)]
        self.pos += s.batch_size
        self.left -= 1
        return idx


def _beta_to_numpy(beta: Any) -> Any:
    if isinstance(beta, tuple):
        return np.array([float(b) for b in beta])
    return float(beta)


def _wrap_callback(callback: Callable | None) -> Callable | None:
    if callback is None:
        return None
    if not callable(callback):
        raise TypeError(
            "callback must be callable (callback(intermediate_result) or callback(xk)) "
            f"or None; got callback={callback!r}"
        )
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
    default_batch=False,
    seed=None,
    replace=False,
    weight_decay=0.0,
    decay_in_f=False,
    split=None,
    growth=None,
    counted=None,
) -> OptimizeResult:
    """The loop shared by every method.

    ``step(xs, gs, f, state) -> (xs, state, beta)`` is one core step; ``state``
    starts as ``None``.

    ``weight_decay`` is coupled decay :math:`\\mu` applied here: ``step`` and the
    ``gtol`` test get the gradient :math:`g + \\mu x` of
    :math:`F = f + \\frac{\\mu}{2}\\|x\\|^2`, and ``f`` is :math:`F` when
    ``decay_in_f`` (for an exact numerator), else :math:`f`. The result and the
    callback report :math:`f` and :math:`g`, the values of ``fun`` and ``jac``.
    ``default_batch``: sample ``min(DEFAULT_BATCH_SIZE, fun.n_samples)`` per batch
    when ``fun`` is a FiniteSum and ``batch_size`` is None. ``split``: the AM step
    cut at its rule, for device arrays (:class:`_DeviceReader`); ``growth``: ``(kind,
    lr)`` of :class:`_Bound` for the methods whose steps it bounds.
    """
    maxiter = check_int("maxiter", maxiter, 0)
    gtol = check_nonnegative("gtol", gtol)
    replace = check_bool("replace", replace)
    layout = _Layout(x0)
    obj = _Objective(fun, jac, args, layout)
    if counted is not None:  # the evaluations that chose the step size (amopt.optimize.step_size)
        obj.nfev, obj.njev = counted
    cb = _wrap_callback(callback)
    sampler = None
    if default_batch and batch_size is None and obj.finite_sum:
        batch_size = min(DEFAULT_BATCH_SIZE, obj.n_samples)
    if batch_size is not None:
        if not obj.finite_sum:
            raise ValueError(
                f"batch_size={batch_size!r} needs fun to be a FiniteSum (an object with "
                "n_samples, value_and_grad and batch_value_and_grad); got a callable"
            )
        batch_size = check_int("batch_size", batch_size, 1)
        n = obj.n_samples
        if batch_size > n and not replace:
            raise ValueError(
                f"batch_size must be an integer in [1, {n}]; got batch_size={batch_size}: "
                f"without replacement a mini-batch holds at most fun.n_samples = {n} "
                "samples (replace=True samples with replacement)"
            )
        sampler = _Sampler(n, batch_size, seed, replace)
    else:
        ignored = [
            name for name, given in (("seed", seed is not None), ("replace", replace)) if given
        ]
        if ignored:
            warnings.warn(
                f"{' and '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored: "
                "only mini-batch sampling uses them, and it needs a FiniteSum fun (and, for "
                "the Adam family, batch_size)",
                OptimizeWarning,
                stacklevel=4,
            )
    wd = weight_decay
    lazy = _lazy.session(
        layout, obj, step, full_batch=sampler is None, weight_decay=wd, decay_in_f=decay_in_f
    )
    if lazy is not None:  # dask arrays: one graph submission per step, see amopt.backends.dask
        layout, obj, step = lazy.layout, lazy.objective, lazy.step
        reader = _HostReader(layout, obj, step, sampler, gtol, wd, decay_in_f)
    elif is_device(layout.arrays):  # one host transfer per step, see amopt.backends.device
        obj.defer = True
        # a returned gradient is used before the next evaluation and never modified:
        # only the result's is copied (each copy is a pass over memory on a device)
        layout.copy_grads = False
        if sampler is not None:
            sampler = _DeviceSampler(sampler, layout.xp, layout.arrays[0], maxiter)
        reader = _device_reader(
            layout, obj, step, split, sampler, cb,
            maxiter=maxiter, gtol=gtol, wd=wd, decay_in_f=decay_in_f, growth=growth,
        )  # fmt: skip
    else:
        reader = _HostReader(layout, obj, step, sampler, gtol, wd, decay_in_f)
    return _iterate(
        reader, layout, obj, cb,
        maxiter=maxiter, gtol=gtol, is_am=is_am, batches=sampler is not None, wd=wd,
    )  # fmt: skip


def _regularised(f: Any, sq: Any, wd: float) -> Any:
    """:math:`F = f + \\frac{\\mu}{2}\\|x\\|^2` from ``sq`` :math:`= \\|x\\|^2` (host
    floats, or 0-d device arrays for the pipelined loop), the method's f under coupled
    decay with ``decay_in_f``."""
    return f + 0.5 * wd * sq


def _coupled(gs: tuple, xs: tuple, wd: float) -> tuple:
    """:math:`g + \\mu x`, the gradient of :math:`F` under coupled decay."""
    return gs if wd == 0 else tuple(g + wd * x for g, x in zip(gs, xs, strict=True))


class _Point:
    """An iterate and what the loop knows of it.

    ``x_ok``: the iterate is finite (True while a :class:`_DeviceReader` has not read
    it yet, ``unchecked``, with ``prev`` the point it was stepped from); ``f``, ``gs``:
    the objective and gradient there (full batch), or the mini-batch's once
    :meth:`sample` drew one there (before: the mini-batch value the step to it used,
    the callback's ``fun``); ``f_c``, ``g_c``: the method's (coupled decay);
    ``gnorm``: the ``gtol`` test's value of ``g_c`` (NaN when not finite); ``finite``:
    f and ``gnorm`` finite; ``state`` and ``beta``: the method's after the step that
    made it. The device readers keep their reads here too (``sums``, ``pending``,
    ``g_hi``, and the pipelined loop's ``f_dev`` and ``read``).
    """

    x_ok = finite = True
    unchecked = per_layer = False
    f = gnorm = g_hi = math.nan
    gs = g_c = f_c = f_dev = pending = read = prev = beta = None
    sums: tuple | list = ()

    def __init__(self, xs: tuple, state: Any = None, beta: Any = None):
        self.xs, self.state, self.beta = xs, state, beta


def _iterate(reader, layout, obj, cb, *, maxiter, gtol, is_am, batches, wd) -> OptimizeResult:
    """The iteration loop of every method, on every array library.

    The tests, in this order: ``x0`` finite, then (full batch) the objective and the
    gradient at ``x0`` finite; at each iteration ``gtol`` (full batch), ``maxiter``,
    then (mini-batch) the mini-batch drawn at the iterate finite and ``gtol`` on it;
    the step; the new iterate finite, and (full batch) the objective and gradient
    there finite; then the callback. A run that ends on a non-finite value returns the
    last finite iterate. The ``reader`` (:class:`_HostReader`, :class:`_DeviceReader`,
    :class:`_PipelinedReader`) makes the evaluations and the steps and says when each
    value the tests need is known: at once on the host, in one transfer per iteration
    on a device, one step behind the device when pipelined. A device reader may learn
    that an iterate was not finite one iteration late (``unchecked``): the loop then
    takes that iterate back.
    """
    cur = reader.first()
    reason = None if cur.x_ok else "nonfinite_x0"
    if reason is None and not batches and not cur.finite:
        reason = "nonfinite"
    # f(x0), for the test of a run that ended above it (of f itself: under coupled
    # decay the method minimises F, which f need not follow)
    f0 = None if batches or wd != 0 else cur.f
    betas: list[Any] = []
    nit = 0
    while reason is None:
        if not batches and gtol > 0 and cur.gnorm <= gtol:
            reason = "gtol"
            break
        if nit >= maxiter:
            reason = "maxiter"
            break
        if batches:
            reader.sample(cur)
            if not cur.x_ok:  # read with the mini-batch: the step to it is taken back below
                break
            # a mini-batch that is not finite ends the run at the (finite) iterate it
            # was drawn at
            if not cur.finite:
                reason = "nonfinite"
                break
            if gtol > 0 and cur.gnorm <= gtol:
                reason = "gtol"
                break
        nxt = reader.advance(cur, maxiter - nit)
        # full batch: an iterate whose objective is not finite is not taken
        if not nxt.x_ok or not (batches or nxt.finite):
            reason = "nonfinite"
            break
        cur = nxt
        nit += 1
        if is_am:
            betas.append(cur.beta)
        if cb is not None:
            gs = None if batches else cur.gs
            if _call_back(cb, layout, cur.xs, cur.f, gs, nit, cur.beta, is_am):
                reason = "callback"
    if cur.unchecked:  # the last iterate's finiteness, not read yet
        cur.x_ok = reader.confirm(cur)
    if not cur.x_ok and cur.prev is not None:  # found non-finite late: the step is taken back
        cur, nit, reason = cur.prev, nit - 1, "nonfinite"
        if is_am:
            betas.pop()
    if batches:
        # The result reports the full objective at the returned iterate.
        f, gs = obj(cur.xs)
        f = reader.value(f)
    else:
        f, gs = cur.f, cur.gs
    gs = reader.result_grads(gs)
    return _result(layout, obj, cur.xs, f, gs, nit, reason, betas if is_am else None, f0)


class _HostReader:
    """The loop's values read as soon as they are formed (NumPy, and dask through the
    stand-ins of :mod:`amopt.backends.dask`, which submit a step's reductions together).

    ``weight_decay`` is coupled decay :math:`\\mu` applied here: the step and the
    ``gtol`` test get :math:`g + \\mu x`, and the step's f is :math:`F` with
    ``decay_in_f``.
    """

    def __init__(self, layout, obj, step, sampler, gtol, wd, decay_in_f):
        self.layout, self.obj, self.step, self.sampler = layout, obj, step, sampler
        self.gtol, self.wd, self.sq = gtol, wd, wd != 0 and decay_in_f

    def _evaluated(self, pt: _Point, f: float, gs: tuple) -> None:
        layout, wd = self.layout, self.wd
        pt.f, pt.gs = f, gs
        if wd == 0:
            pt.f_c, pt.g_c = f, gs
        else:
            pt.f_c = _regularised(f, layout.sq_norm(pt.xs), wd) if self.sq else f
            pt.g_c = _coupled(gs, pt.xs, wd)
        # max|g| for the gtol test; without one, only whether g is finite matters
        if self.gtol > 0:
            pt.gnorm = layout.max_abs(pt.g_c)
        else:
            pt.gnorm = 0.0 if layout.all_finite(pt.g_c) else math.nan
        pt.finite = math.isfinite(f) and math.isfinite(pt.gnorm)

    def first(self) -> _Point:
        pt = _Point(self.layout.arrays)
        pt.x_ok = self.layout.all_finite(pt.xs)
        if self.sampler is None:
            self._evaluated(pt, *self.obj(pt.xs))
        return pt

    def sample(self, pt: _Point) -> None:
        """The mini-batch at ``pt``, drawn and evaluated."""
        self._evaluated(pt, *self.obj.batch(pt.xs, self.sampler()))

    def advance(self, pt: _Point, left: int) -> _Point:
        """The step from ``pt`` and, full batch, the evaluation at the new iterate when
        it is finite (``left``: the steps ``maxiter`` leaves, this one included)."""
        new = _Point(*self.step(pt.xs, pt.g_c, pt.f_c, pt.state))
        new.x_ok = self.layout.all_finite(new.xs)
        if self.sampler is not None:
            new.f = pt.f
        elif new.x_ok:
            self._evaluated(new, *self.obj(new.xs))
        return new

    @staticmethod
    def value(f: Any) -> Any:
        return f

    @staticmethod
    def result_grads(gs: tuple) -> tuple:
        return gs  # copies already (_Layout.copy_grads)


def _result(layout, obj, xs, f, gs, nit, reason, betas, f0=None) -> OptimizeResult:
    """The ``OptimizeResult`` of a run; ``betas`` None for a method without AM betas.

    ``f0``: f(x0) of a full-batch run; a run that used its ``maxiter`` steps and ends
    above it has diverged, however slowly (status 2, not 1).
    """
    if reason == "maxiter" and f0 is not None and f > f0:
        reason = "increased"
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
    if betas is not None:
        if betas:
            res["betas"] = np.stack([np.asarray(_beta_to_numpy(b)) for b in betas])
            if layout.container is None and res["betas"].ndim == 2:
                res["betas"] = res["betas"][:, 0]
        else:
            res["betas"] = np.empty((0,), dtype=np.float64)
    return res


# --------------------------------------------------------------------------- device driver


def _min_max(xp: Any, like: Any) -> Callable[[Any], list]:
    """``[min(a), max(a)]`` as 0-d arrays (NaN propagates) for arrays like ``like``.

    ``max|a| = max(max(a), -min(a))``, formed on the host: two reads of ``a`` instead of
    the three passes of ``max(abs(a))`` (``abs`` writes a temporary), and one with
    torch's ``aminmax``.
    """
    if array_api_compat.is_torch_array(like):
        import torch

        return lambda a: list(torch.aminmax(a))
    return lambda a: [xp.min(a), xp.max(a)]


def _max_of(values: list[float]) -> float:
    """The largest of ``values``, NaN if any is NaN; 0 for none (an empty iterate)."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values, default=0.0)


def _max_abs_of(pairs: list[float]) -> float:
    """``max|a|`` from the ``[min, max]`` pairs of :func:`_min_max`; NaN if any is NaN."""
    if any(math.isnan(v) for v in pairs):
        return math.nan
    return max((max(hi, -lo) for lo, hi in zip(pairs[::2], pairs[1::2], strict=True)), default=0.0)


class _Bound:
    r"""A host bound of ``max|x_t|`` that proves the iterates finite without reading them.

    For the methods whose step is :math:`x_{t+1} = x_t - \eta d_{t+1}` with
    :math:`|d_{t+1}|` bounded by the gradients read so far (``kind``: ``"gd"``,
    :math:`d = g`; ``"heavy_ball"``, a convex combination of :math:`d_t` and
    :math:`g_t`; ``"am"``, :math:`g + \gamma (d - g)` with :math:`0 \le \gamma \le 1`;
    ``"classical"`` and ``"nesterov"``, :math:`\beta d + g`, with ``beta``):
    :math:`\max|x_{t+1}| \le \max|x_t| + \eta D_{t+1}`, each bound widened by the
    rounding of the step's operations. While the bound stays far below the largest
    value of the dtype, no operation of the step can overflow and the new iterate is
    finite (its inputs are); past it, the loop reads the iterate's finiteness again.
    """

    def __init__(self, kind: str, lr: float, xp: Any, arrays: tuple, beta: float = 0.0):
        self.kind, self.lr, self.beta = kind, lr, beta
        infos = [xp.finfo(a.dtype) for a in arrays]
        self.limit = min(float(i.max) for i in infos) / 16
        self.slack = 1.0 + 8 * max(float(i.eps) for i in infos)
        self.x = math.inf
        self.d = 0.0
        self.steps = 0

    def step(self, g_max: float) -> bool:
        """Account for one step whose gradient has ``max|g| = g_max``; True when the
        new iterate is proven finite."""
        if self.kind in ("classical", "nesterov"):
            # undamped: |d_{t+1}| <= beta |d_t| + |g_t|; Nesterov steps along g + beta d
            d = (self.beta * self.d + g_max) * self.slack
            move = d if self.kind == "classical" else (g_max + self.beta * d) * self.slack
            self.steps += 1
            self.d = d
            self.x = (self.x + self.lr * move) * self.slack
            return self.x <= self.limit  # False for NaN
        if self.kind == "gd" or self.steps == 0:  # the first step sets d = g
            d = g_max
        elif self.kind == "heavy_ball":
            d = max(self.d, g_max)
        else:
            d = 2.0 * g_max + self.d
        self.steps += 1
        self.d = d * self.slack
        self.x = (self.x + self.lr * self.d) * self.slack
        return self.x <= self.limit  # False for NaN


def _all_finite(values: list[float]) -> float:
    """0.0 when every value is finite, else NaN."""
    return 0.0 if all(math.isfinite(v) for v in values) else math.nan


class _Reads:
    r"""The device values of one point, read with everything else the step needs in one go.

    What the loop tests costs one read pass over an array where it can: the finiteness
    of an array is that of its sum (a NaN or an infinity makes the sum NaN or infinite;
    only a sum that overflows, or a genuinely non-finite array, is checked again exactly,
    in a second transfer). Where ``max|g|`` is wanted (``gtol > 0``, or for a
    :class:`_Bound`), :math:`\|g\|^2` stands in for it: :math:`\|g\|_2` bounds
    ``max|g|`` from above and :math:`\|g\|_2/\sqrt{n}` from below, which settles the
    ``gtol`` test except in between, where that point's ``max|g|`` is read in a second
    transfer and every later point's with the values (formed from ``min(g)`` and
    ``max(g)``), once per run. A step whose sums hold :math:`\|g\|^2` (``g_sq`` of
    their values: the AM momentum methods) reads nothing more for the gradient; the
    others read ``g @ g``, one pass over ``g``. Half precision, or a dot whose rounding
    could reach 1e-3 (:math:`n\epsilon`), reads ``min(g)`` and ``max(g)`` instead.
    """

    def __init__(
        self,
        xp: Any,
        arrays: tuple,
        wd: float,
        decay_in_f: bool,
        exact_g: bool,
        gtol: float,
        g_sq: Callable[[list], float] | None,
    ):
        self.xp, self.wd, self.sq = xp, wd, wd != 0 and decay_in_f
        self.min_max = _min_max(xp, arrays[0])
        self.exact_g, self.gtol = exact_g, gtol
        n = sum(math.prod(a.shape) for a in arrays)
        eps = max(float(xp.finfo(xp.float64 if a.dtype == xp.float64 else xp.float32).eps)
                  for a in arrays)  # fmt: skip
        # a dot's relative error is at most n eps; past 1e-3 max|g| is read instead
        wide = all(a.dtype in (xp.float64, xp.float32) for a in arrays)
        self.dots = n * eps <= 1e-3 and (g_sq is not None or wide)
        self.g_sq = g_sq
        self.n, self.dot_slack = max(n, 1), 1.0 + 2.0 * n * eps

    def _from_dots(self, gg: float, g_c: tuple) -> tuple[float, float]:
        """(the ``gtol`` test's value, an upper bound of ``max|g_c|``) from ``|g_c|^2``."""
        if not math.isfinite(gg):  # non-finite, or an overflowing sum of squares
            g = self._exact_max_abs(g_c)
            return g, g
        hi = math.sqrt(gg * self.dot_slack)
        if self.gtol == 0 or hi <= self.gtol:
            return hi, hi
        lo = math.sqrt(gg / (self.dot_slack * self.n))
        if lo > self.gtol:
            return lo, hi
        self.dots = False  # near gtol: read max|g| from now on
        g = self._exact_max_abs(g_c)
        return g, g

    def _sums(self, arrays: tuple) -> list:
        # empty arrays by their shape: torch's ``size`` is a method; half precision summed
        # in float32, where a sum of finite values rarely overflows
        xp = self.xp
        return [
            xp.sum(a) if a.dtype in (xp.float64, xp.float32) else xp.sum(a, dtype=xp.float32)
            for a in arrays
            if math.prod(a.shape) != 0
        ]

    def _squares(self, arrays: tuple) -> list:
        """``a @ a`` of each (flattened) array: one read of it."""
        xp = self.xp
        return [
            (b := (a if a.ndim == 1 else xp.reshape(a, (-1,)))) @ b
            for a in arrays
            if math.prod(a.shape) != 0
        ]

    def _min_max(self, arrays: tuple) -> list:
        return [m for a in arrays if math.prod(a.shape) != 0 for m in self.min_max(a)]

    def _exact_max_abs(self, arrays: tuple) -> float:
        """``max|a|`` over ``arrays``, read in a transfer of its own."""
        xp = self.xp
        parts = [xp.max(xp.abs(a)) for a in arrays if math.prod(a.shape) != 0]
        return _max_of(read(xp, parts))

    def _sq(self, arrays: tuple) -> list:
        """:meth:`_Layout.sq_norm`'s per-array terms, left on the device."""
        xp = self.xp
        out = []
        for a in arrays:
            if a.dtype != xp.float64:
                a = xp.astype(a, xp.float32)
            out.append(xp.sum(a * a))
        return out

    def point(self, *args: Any, **kwargs: Any) -> dict:
        """:meth:`start` then :meth:`finish`: the values read at once."""
        return self.finish(self.start(*args, **kwargs))

    def start(
        self,
        xs: tuple | None,
        f: Any,
        g_c: tuple,
        sums: list,
        x_only: bool = False,
        at: tuple | None = None,
        x_max: bool = False,
        sq: bool | None = None,
        extra: list = (),
    ) -> tuple:
        """Start reading the finiteness of ``xs`` (unless None), ``f``, ``max|g_c|``,
        ``|at|^2`` and ``sums`` (:func:`start_read`); :meth:`finish` waits for the
        values.

        In the result, ``"x"`` is 0.0 when ``xs`` is finite, else NaN (``max|xs|`` with
        ``x_max``); ``"g"`` is ``max|g_c|`` with ``exact_g`` (or a value on the same side
        of ``gtol``, see ``g_sq``), else 0.0 when ``g_c`` is finite and NaN when not;
        ``"g_hi"`` an upper bound of ``max|g_c|`` (with ``exact_g``). ``at`` is the point
        of ``f`` (default ``xs``), whose squared norm is read when the method's f includes
        the decay (``sq=False``: not read). ``extra`` values are read too (``"extra"``).
        """
        if xs is None:
            x_parts = []
        else:
            x_parts = self._min_max(xs) if x_max else self._sums(xs)
        exact_g = self.exact_g
        dots = exact_g and self.dots and not x_only and (self.g_sq is None or bool(sums))
        if x_only:
            g_parts, sq_parts, f_part = [], [], []
        else:
            if dots:
                g_parts = [] if self.g_sq is not None else self._squares(g_c)
            else:
                g_parts = self._min_max(g_c) if exact_g else self._sums(g_c)
            with_sq = self.sq if sq is None else sq
            sq_parts = self._sq(xs if at is None else at) if with_sq else []
            f_part = [f]
        i, j = len(x_parts), len(x_parts) + len(f_part)
        k, m = j + len(g_parts), j + len(g_parts) + len(sq_parts)
        pending = start_read(self.xp, [*x_parts, *f_part, *g_parts, *sq_parts, *sums, *extra])
        return pending, (i, j, k, m, m + len(sums)), xs, g_c, dots, x_max, bool(f_part)

    def finish(self, started: tuple) -> dict:
        """The values of a :meth:`start`; waits for its transfer."""
        pending, (i, j, k, m, n), xs, g_c, dots, x_max, with_f = started
        values = pending.values()
        total = 0.0
        for v in values[k:m]:
            total += v
        if x_max:
            x_ok = _max_abs_of(values[:i])
        else:
            x_ok = _all_finite(values[:i])
            if not math.isfinite(x_ok):  # the sum's test tripped: look at the elements
                x_ok = _all_finite([self._exact_max_abs(xs)])
        g_hi = math.nan
        if dots:
            gg = math.fsum(values[j:k]) if self.g_sq is None else self.g_sq(values[m:n])
            g, g_hi = self._from_dots(gg, g_c)
        elif self.exact_g:
            g = g_hi = _max_abs_of(values[j:k])
        else:
            g = _all_finite(values[j:k])
            if not math.isfinite(g):
                g = _all_finite([self._exact_max_abs(g_c)])
        return {
            "x": x_ok,
            "f": values[i] if with_f else math.nan,
            "g": g,
            "g_hi": g_hi,
            "sq": total,
            "sums": values[m:n],
            "extra": values[n:],
        }


#: Whether runs on device arrays are pipelined (:class:`_PipelinedReader`): None chooses
#: by the arrays (an asynchronous device, no callback).
_PIPELINE: bool | None = None


class _DeviceReader:
    """The loop's values of one iteration read in one host transfer (device arrays).

    Every value the loop tests is read with :func:`amopt.backends.device.read` in one
    transfer per iteration (:class:`_Reads`), and an AM step is cut at its rule
    (``split``, see :class:`amopt.optimize.methods._Split`) so that the rule's sums travel in
    the same transfer and the rule runs on the host. The tests and their order are
    those of the host loop; what changes is when a value is known:

    * full batch: the objective at :math:`x_{t+1}` is evaluated before the finiteness
      of :math:`x_{t+1}` is known (both are read together), so ``fun`` may see a
      non-finite iterate that then ends the run (the result is the last finite one);
    * mini-batch: the finiteness of :math:`x_{t+1}` is read with the next batch's
      values (so that batch is evaluated at it) or at the end of the run; a
      non-finite one is then taken back (``nit``, betas). With a ``callback``
      (``each``) it is read before the callback sees the iterate, one more transfer
      per iteration.

    With a ``bound`` (:class:`_Bound`) the finiteness of an iterate is read only when
    the bound no longer proves it.
    """

    def __init__(self, layout, obj, step, split, sampler, reads, bound, gtol, wd, each):
        self.layout, self.obj, self.step, self.split = layout, obj, step, split
        self.sampler, self.reads, self.bound = sampler, reads, bound
        self.gtol, self.wd, self.each = gtol, wd, each

    def _sums(self, pt: _Point, g_c: tuple, state: Any) -> list:
        """Queue the AM rule's sums at ``pt`` (none without a ``split``)."""
        pt.state = state
        if self.split is None:
            return []
        pt.state, pt.pending, sums = self.split.sums(pt.xs, g_c, state)
        return sums if isinstance(sums, list) else [sums]

    def _evaluated(self, pt: _Point, got: dict, gs: tuple | None, g_c: tuple) -> None:
        pt.f, pt.gs, pt.g_c = got["f"], gs, g_c
        pt.gnorm = _gnorm(self.gtol, got["g"])
        pt.finite = math.isfinite(pt.f) and math.isfinite(pt.gnorm)
        pt.sums, pt.g_hi = got["sums"], got["g_hi"]
        pt.f_c = _regularised(pt.f, got["sq"], self.wd) if self.reads.sq else pt.f

    def _point(self, pt: _Point, check: tuple | None, state: Any, **kw: Any) -> dict:
        """Evaluate the full objective at ``pt`` and read it (with ``check``'s finiteness)."""
        f, gs = self.obj(pt.xs)
        g_c = _coupled(gs, pt.xs, self.wd)
        got = self.reads.point(check, f, g_c, self._sums(pt, g_c, state), **kw)
        self._evaluated(pt, got, gs, g_c)
        return got

    def first(self) -> _Point:
        pt = _Point(self.layout.arrays)
        x_max = self.bound is not None
        if self.sampler is None:
            x = self._point(pt, pt.xs, None, x_max=x_max)["x"]
        else:
            x = self.reads.point(pt.xs, None, (), [], x_only=True, x_max=x_max)["x"]
        if self.bound is not None:
            self.bound.x = x
        pt.x_ok = math.isfinite(x)
        return pt

    def sample(self, pt: _Point) -> None:
        """The mini-batch at ``pt`` and, when unchecked, whether ``pt`` is finite."""
        f, gs = self.obj.batch(pt.xs, self.sampler())
        g_c = _coupled(gs, pt.xs, self.wd)
        check = pt.xs if pt.unchecked else None
        got = self.reads.point(check, f, g_c, self._sums(pt, g_c, pt.state), at=pt.xs)
        if pt.unchecked:
            pt.x_ok, pt.unchecked = math.isfinite(got["x"]), False
            if pt.x_ok:
                pt.prev = None  # kept for the loop to go back to when not
        self._evaluated(pt, got, None, g_c)

    def advance(self, pt: _Point, left: int) -> _Point:
        if self.split is None:
            new_xs, state, beta = self.step(pt.xs, pt.g_c, pt.f_c, pt.state)
        else:
            new_xs, state, beta = self.split.apply(
                pt.xs, pt.g_c, pt.f_c, pt.state, pt.pending, pt.sums
            )
        sure = self.bound is not None and self.bound.step(pt.g_hi)
        new = _Point(new_xs, state, beta)
        if self.sampler is None:
            new.x_ok = math.isfinite(
                self._point(new, None if sure else new_xs, state, at=new_xs)["x"]
            )
        else:
            new.f = pt.f  # the callback's: the mini-batch value the step used
            if not sure and self.each:  # read before the callback sees the iterate
                new.x_ok = self.confirm(new)
            elif not sure:  # read with the next mini-batch, or at the end of the run
                new.unchecked, new.prev = True, pt
        return new

    def confirm(self, pt: _Point) -> bool:
        """Whether ``pt`` is finite, read in a transfer of its own."""
        return math.isfinite(self.reads.point(pt.xs, None, (), [], True)["x"])

    def value(self, f: Any) -> float:
        return read(self.layout.xp, [f])[0]

    def result_grads(self, gs: tuple) -> tuple:
        return self.layout.copy(gs)  # the caller's gradient, not aliased by the result


class _PipelinedReader(_DeviceReader):
    r"""The reads of :class:`_DeviceReader` with the device one iteration ahead.

    The values of iterate :math:`x_{t+1}` (its finiteness, the objective and gradient
    test of its evaluation, full or on its mini-batch, and, for AM, the beta of the step
    that made it) are read while the step from :math:`x_{t+1}` to :math:`x_{t+2}` is
    already queued: the host waits for the device at most one step behind it, so the
    host's work for one iteration overlaps the device's work for the previous one
    instead of adding to it. The AM rule therefore runs on the device
    (``split.on_device``, or the whole core step), on the same float64 values as the
    host rule of :class:`_DeviceReader`.

    The tests, their order and the result are those of :class:`_DeviceReader`:
    ``nit``, the status, the returned iterate and the mini-batches drawn are the same.
    A run that stops on ``gtol`` or on a non-finite value has evaluated ``fun`` once
    more (and drawn one more mini-batch), at the step queued past the stopping point
    (counted in ``nfev``); a ``maxiter`` run has not. Mini-batch runs need
    ``maxiter >= 1``.
    """

    ahead: _Point | None = None

    def _evaluate(self, pt: _Point) -> None:
        """Queue the evaluation at ``pt`` (full, or a mini-batch drawn there)."""
        if self.sampler is None:
            pt.f_dev, pt.gs = self.obj(pt.xs)
        else:
            pt.f_dev, pt.gs = self.obj.batch(pt.xs, self.sampler())
        pt.g_c = _coupled(pt.gs, pt.xs, self.wd)
        pt.sums = self._sums(pt, pt.g_c, pt.state)

    def _method_f(self, f: Any, at: tuple) -> Any:
        # the device F = f + wd/2 |x|^2 of the step, on the float64 values the host adds
        if not self.reads.sq:
            return f
        xp = self.layout.xp
        total = xp.astype(f, xp.float64) if f.dtype != xp.float64 else f
        sq = None
        for part in self.reads._sq(at):
            part = part if part.dtype == xp.float64 else xp.astype(part, xp.float64)
            sq = part if sq is None else sq + part
        return total if sq is None else _regularised(total, sq, self.wd)

    def _launch(self, pt: _Point, last: bool) -> _Point:
        """Queue the step from ``pt``, the evaluation at the new iterate and their reads."""
        f_c = self._method_f(pt.f_dev, pt.xs)
        if self.split is not None:
            new_xs, state, beta = self.split.apply(
                pt.xs, pt.g_c, f_c, pt.state, pt.pending, pt.sums
            )
        else:
            new_xs, state, beta = self.step(pt.xs, pt.g_c, f_c, pt.state)
        new = _Point(new_xs, state)
        new.per_layer = isinstance(beta, tuple)
        betas = list(beta) if new.per_layer else [] if beta is None else [beta]
        # with a bound, the finiteness of x is proven on the host when the bound allows
        check = new_xs if self.bound is None else None
        if last and self.sampler is not None:
            # no mini-batch is drawn at the last iterate: x is all to read
            new.read = self.reads.start(check, None, (), [], x_only=True, extra=betas)
            return new
        self._evaluate(new)
        new.read = self.reads.start(
            check, new.f_dev, new.g_c, new.sums, at=new_xs, sq=False, extra=betas
        )
        return new

    def first(self) -> _Point:
        pt = _Point(self.layout.arrays)
        self._evaluate(pt)
        x_max = self.bound is not None
        got = self.reads.finish(
            self.reads.start(pt.xs, pt.f_dev, pt.g_c, pt.sums, x_max=x_max, sq=False)
        )
        if self.bound is not None:
            self.bound.x = got["x"]
        pt.x_ok = math.isfinite(got["x"])
        self._read(pt, got)
        return pt

    def _read(self, pt: _Point, got: dict) -> None:
        pt.f, pt.gnorm, pt.g_hi = got["f"], _gnorm(self.gtol, got["g"]), got["g_hi"]
        pt.finite = math.isfinite(pt.f) and math.isfinite(pt.gnorm)

    def sample(self, pt: _Point) -> None:
        """Nothing: the mini-batch at ``pt`` was drawn and read with ``pt``."""

    def advance(self, pt: _Point, left: int) -> _Point:
        new = self.ahead if self.ahead is not None else self._launch(pt, left <= 1)
        # queued before waiting for new's values: the device works while the host waits
        self.ahead = self._launch(new, left <= 2) if left > 1 else None
        got = self.reads.finish(new.read)
        if self.bound is not None and not self.bound.step(pt.g_hi):
            x = self.reads.point(new.xs, None, (), [], x_only=True)["x"]
        else:
            x = got["x"]
        new.x_ok = math.isfinite(x)
        if new.f_dev is None:  # the last iterate of a mini-batch run: nothing evaluated
            new.f, new.gnorm, new.g_hi = got["f"], math.inf, got["g_hi"]
        else:
            self._read(new, got)
        if got["extra"]:
            values = tuple(np.float64(v) for v in got["extra"])
            new.beta = values if new.per_layer else values[0]
        return new


def _device_reader(
    layout, obj, step, split, sampler, cb, *, maxiter, gtol, wd, decay_in_f, growth
):
    """The reader of a run on device arrays: one host transfer per iteration; on an
    asynchronous device (:func:`amopt.backends.device.asynchronous`) a run without a
    callback, full-batch or mini-batch, pipelined (:class:`_PipelinedReader`)."""
    xp = layout.xp
    # with a bound on the iterates (``growth``, see _Bound) their finiteness is read only
    # when the bound no longer proves it; the bound needs max|g|
    bound = None if growth is None else _Bound(*growth[:2], xp, layout.arrays, *growth[2:])
    g_sq = None if split is None else split.g_sq
    exact_g = gtol > 0 or bound is not None
    reads = _Reads(xp, layout.arrays, wd, decay_in_f, exact_g, gtol, g_sq)
    pipelined = _PIPELINE if _PIPELINE is not None else asynchronous(layout.arrays)
    if cb is None and pipelined and (sampler is None or maxiter > 0):
        on_device = split if split is not None and split.on_device else None
        if on_device is None and split is not None:  # the whole step, its rule on the device
            reads = _Reads(xp, layout.arrays, wd, decay_in_f, exact_g, gtol, None)
        return _PipelinedReader(
            layout, obj, step, on_device, sampler, reads, bound, gtol, wd, False
        )
    return _DeviceReader(layout, obj, step, split, sampler, reads, bound, gtol, wd, cb is not None)


def _gnorm(gtol: float, g_max: float) -> float:
    """The ``gtol`` test's value: ``max|g|``, or, without a test, 0 if finite, else NaN."""
    return g_max if gtol > 0 else (0.0 if math.isfinite(g_max) else math.nan)


def _call_back(cb, layout, xs, f, gs, nit, beta, is_am) -> bool:
    """Call the callback with copies (what it does to them cannot change the run);
    True when it raised ``StopIteration``."""
    inter = OptimizeResult(x=layout.pack(layout.copy(xs)), fun=f, nit=nit)
    if gs is not None:
        inter["jac"] = layout.pack(layout.copy(gs))
    if is_am:
        inter["beta"] = _beta_to_numpy(beta)
    try:
        cb(inter)
    except StopIteration:
        return True
    return False


def _check_unknown_options(unknown: dict) -> None:
    if unknown:
        msg = ", ".join(map(str, unknown))
        warnings.warn(f"Unknown solver options: {msg}", OptimizeWarning, stacklevel=4)


def _sampling(fun, batch_size, seed, replace, gtol, *, always: bool, method: str = "") -> dict:
    """Mini-batch settings for ``_run``.

    The sgd-type methods (``always``) sample any FiniteSum, ``min(32, n_samples)``
    per batch unless told otherwise, and refuse any other ``fun`` (their steps
    would be full-batch steps, reported as a success); the Adam family samples only
    when given ``batch_size``. Mini-batch runs default to ``gtol=0``, full-batch
    runs to ``1e-5``.
    """
    if always and not isinstance(fun, FiniteSum):
        raise ValueError(
            f"method {method!r} takes mini-batches of a FiniteSum fun (an object with "
            "n_samples, value_and_grad and batch_value_and_grad, such as the "
            f"amopt.problems finite sums); got fun={_describe(fun)}. For full-batch "
            "steps use method 'gd', 'mgd', 'heavy-ball', 'nesterov' or 'am-mgd'."
        )
    stochastic = always or batch_size is not None
    if gtol is None:
        gtol = 0.0 if stochastic else 1e-5
    return {
        "batch_size": batch_size,
        "default_batch": always,
        "seed": seed,
        "replace": replace,
        "gtol": gtol,
        "stochastic": stochastic,
    }
