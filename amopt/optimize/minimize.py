"""``amopt.minimize``: a ``scipy.optimize.minimize``-shaped driver over the array-API core.

The methods live in :mod:`amopt.optimize.methods` (one ``_minimize_<method>`` each,
whose keyword arguments are the method's options) and share the loop of
:mod:`amopt.optimize.loop`.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from scipy.optimize import OptimizeResult

from amopt.core.config import check_nonnegative
from amopt.optimize.finite_sum import FiniteSum
from amopt.optimize.loop import STATUS_MESSAGES, _wrap_callback
from amopt.optimize.methods import METHODS

__all__ = ["minimize", "scipy_method", "show_options", "METHODS", "STATUS_MESSAGES"]


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
        mini-batches from (its methods give the gradients: ``jac`` is not used
        and ``args`` must be empty).
    x0 : array or list/tuple of arrays
        Initial point: a NumPy, CuPy, torch or array-api-strict array (any
        shape, 0-d included), a number or a list of numbers, or a list/tuple of
        arrays (a parameter list: ``fun`` and ``jac`` then take and return such
        lists, and ``per_layer`` gives one beta per array). Integer arrays are
        promoted to the default floating dtype; complex and masked arrays are
        rejected. ``x0`` is copied, never modified. Computation stays on the
        caller's library and device.
    args : tuple
        Extra arguments to ``fun`` and ``jac``. As scipy does, ``fun`` and ``jac``
        get copies of the iterate (what they do to it cannot change the run),
        except on device arrays (CuPy, torch on a GPU), where a copy per call
        would be a pass over device memory: there they must not modify it.
    method : str
        Full batch: ``"gd"``, ``"mgd"`` (damped momentum, an average of the
        gradients: no faster than GD at ``lr = 1/L``), ``"heavy-ball"``
        (Polyak's classical momentum, ``torch.optim.SGD(momentum=beta)``),
        ``"nesterov"``, ``"am-mgd"`` (default), ``"adam"``, ``"adamw"``,
        ``"am-adam"``, ``"am-adamw"``. Mini-batch, on a FiniteSum: ``"sgd"``,
        ``"msgd"``, ``"am-sgd"``, and the Adam family with ``batch_size``.
    jac : callable, True or None
        Gradient ``jac(x, *args)``, an array of the shape and array type of
        ``x`` (a real dtype other than that of ``x`` is converted to it);
        ``True`` if ``fun`` returns ``(f, g)``; ``None``: the gradient of an
        objective object (``fun.value_and_grad(x)``, else ``fun.grad(x)``: every
        :mod:`amopt.problems` class), otherwise forward finite differences with
        the step ``sqrt(eps) * max(1, |x|)`` of the dtype of ``x`` (NumPy only,
        with a warning).
    callback : callable, optional
        ``callback(intermediate_result)`` after each step, where the
        :class:`~scipy.optimize.OptimizeResult` has ``x``, ``fun``, ``nit``,
        ``jac`` (full batch) and ``beta`` (AM methods); the legacy
        ``callback(xk)`` works too. ``x`` and ``jac`` are copies: changing
        them does not change the run. Raising ``StopIteration`` stops the run
        (status 99).
    tol : float, optional
        Shortcut for ``options["gtol"]`` (a ``gtol`` in ``options`` wins), as
        ``scipy.optimize.minimize`` maps ``tol`` to its gradient methods' ``gtol``.
    options : dict, optional
        Method options, each method's listed below with its default;
        :func:`amopt.show_options` prints what each one means (the docstring of
        ``amopt.METHODS[method]``, as ``scipy.optimize.show_options``). Unknown
        options, and ``seed``/``replace`` when nothing is sampled, give an
        ``OptimizeWarning``. With coupled ``weight_decay`` :math:`\mu` (every
        method but ``"adamw"`` and ``"am-adamw"``) the method minimises
        :math:`f + \frac{\mu}{2}\|x\|^2`: ``gtol`` tests its gradient
        :math:`g + \mu x`, while ``res.fun`` and ``res.jac`` stay the values
        of ``fun`` and ``jac`` (see each method's options).

    Returns
    -------
    res : scipy.optimize.OptimizeResult
        ``x`` (the caller's array type, device and shape), ``fun``, ``jac``,
        ``nit``, ``nfev``, ``njev``, ``status``, ``success``, ``message``, and
        for AM methods ``betas``: the :math:`\beta_t` of every step as a NumPy
        array (shape ``(nit,)``, or ``(nit, len(x0))`` with ``per_layer``). A run
        that meets a NaN or infinity stops with status 2 and returns the last
        finite iterate (``x0`` itself, unchanged, when it holds one).

    Notes
    -----
    The methods and their options, with their defaults (``lr=None``: see each
    method; :func:`amopt.show_options` describes every option):

    {METHOD_OPTIONS}

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
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(
            f"options must be a dict of method options or None; got {type(options).__name__}"
        )
    options = dict(options or {})
    _tol_to_gtol(tol, options)
    return meth(fun, x0, args, jac, callback, **options)


def _method_options_doc() -> str:
    """Each method's first docstring line and its options with their defaults."""
    lines = []
    for name, meth in METHODS.items():
        summary = (meth.__doc__ or "").strip().split("\n", 1)[0].rstrip(".")
        params = list(inspect.signature(meth).parameters.values())[5:-1]
        opts = ", ".join(f"{p.name}={p.default!r}" for p in params)
        lines.append(f"``{name!r}``\n        {summary}.\n        Options: {opts}.")
    return "\n    ".join(lines)


if minimize.__doc__ is not None:  # None under python -OO
    minimize.__doc__ = minimize.__doc__.replace("{METHOD_OPTIONS}", _method_options_doc())


def show_options(method: str | None = None, disp: bool = True) -> str | None:
    """The documentation of the options of one method of :func:`minimize`, or of all.

    Shaped as ``scipy.optimize.show_options("minimize", method, disp)``.

    Parameters
    ----------
    method : str, optional
        One of ``amopt.METHODS``; None: every method.
    disp : bool
        True: print the text (and return None); False: return it.

    Returns
    -------
    str or None
        The text, when ``disp`` is False.

    Examples
    --------
    >>> import amopt
    >>> text = amopt.show_options("gd", disp=False)
    >>> "lr : float" in text and "gtol : float" in text
    True
    """
    if method is None:
        parts = []
        for name in METHODS:
            parts.extend(["\n\n" + name, "\n" + "=" * len(name) + "\n\n"])
            parts.append(show_options(name, disp=False) or "")
        text = "".join(parts)
    else:
        doc = _method(method).__doc__
        text = "" if doc is None else inspect.cleandoc(doc)
    if disp:
        print(text)
        return None
    return text


def _tol_to_gtol(tol: Any, options: dict[str, Any]) -> None:
    """``tol`` as the default of ``options["gtol"]`` (scipy's mapping for gradient methods)."""
    if tol is not None:
        options.setdefault("gtol", check_nonnegative("tol", tol))


def scipy_method(name: str) -> Callable[..., OptimizeResult]:
    """A custom ``method=`` for :func:`scipy.optimize.minimize` (NumPy arrays).

    Parameters
    ----------
    name : str
        One of the :func:`amopt.minimize` methods.

    Returns
    -------
    callable
        ``f(fun, x0, args=(), jac=None, callback=None, **options)``. ``tol`` (which
        scipy passes to a custom method among the options) is ``gtol``, as in
        :func:`amopt.minimize`; ``hess`` and ``hessp`` are not used (a
        ``RuntimeWarning``, as scipy's gradient methods give); ``bounds`` and
        non-empty ``constraints`` are a ``ValueError``.

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
        for key, value in (("hess", hess), ("hessp", hessp)):
            if value is not None:
                warnings.warn(
                    f"Method {name} does not use Hessian information ({key}).",
                    RuntimeWarning,
                    stacklevel=3,
                )
        _tol_to_gtol(options.pop("tol", None), options)
        cb = callback
        if callback is not None:
            # scipy hands a custom method the user's callback as given: either form,
            # callback(xk) or callback(intermediate_result) by its parameter's name,
            # dispatched as amopt.minimize does; scipy's own wrapper reads
            # `stop_iteration` to set status 99, where the callback can hold it
            user = _wrap_callback(callback)

            def cb(intermediate_result):
                try:
                    user(intermediate_result)
                except StopIteration:
                    with contextlib.suppress(AttributeError, TypeError):
                        callback.stop_iteration = True
                    raise

        return meth(fun, x0, args, jac, cb, **options)

    _custom.__name__ = f"amopt_{name.replace('-', '_')}"
    _custom.__doc__ = meth.__doc__
    return _ScipyMethod(_custom, name)


class _MethodName(str):
    """The name scipy's ``show_options`` looks up: its ``Unknown method`` error names
    :func:`amopt.show_options`, which documents the method."""

    def __repr__(self) -> str:
        return (
            f"{str.__repr__(self)} (an amopt method: its options are shown by "
            f"amopt.show_options({self.removeprefix('amopt-')!r}))"
        )


class _ScipyMethod:
    """The callable of :func:`scipy_method`, with the string methods scipy's helpers call.

    ``scipy.optimize.show_options("minimize", method)`` lower-cases ``method`` (a
    callable has no ``lower``: an ``AttributeError``); here it gets a name that scipy
    does not know, and its ``ValueError`` points to :func:`amopt.show_options`.
    """

    def __init__(self, custom: Callable[..., OptimizeResult], name: str):
        self._custom = custom
        self.method = name
        self.__name__ = self.__qualname__ = custom.__name__
        self.__doc__ = custom.__doc__
        self.__wrapped__ = custom

    def __call__(self, *args: Any, **kwargs: Any) -> OptimizeResult:
        return self._custom(*args, **kwargs)

    def lower(self) -> str:
        return _MethodName(f"amopt-{self.method}")

    def __repr__(self) -> str:
        return f"amopt.scipy_method({self.method!r})"
