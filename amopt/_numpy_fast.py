"""NumPy fast path of :func:`amopt.am_momentum_step` (AM-MGD / AM-MSGD).

:func:`amopt._core.am_momentum_step` dispatches here when every array is a
plain ``numpy.ndarray`` of one dtype (float32 or float64). The rule and every
elementwise operation, in the same order, are those of the array-API
implementation in :mod:`amopt._core`; what changes is how often memory is
traversed and how many NumPy calls a step makes:

* arrays of at most ``BLOCK`` elements: ``v = d - g`` is formed once and
  reused by the inner products and the update, the new momentum
  ``g + coef * v`` is built in the buffer of ``v`` and ``x - lr * d`` in the
  buffer of ``lr * d``. The inner products are the same pairwise sums of the
  same products as in :mod:`amopt._core`: the result is identical, bit for bit;
* larger arrays are walked in blocks of ``BLOCK`` elements that stay in cache:
  one pass reads ``g`` and ``d`` once and accumulates every inner product of the
  rule, a second pass reads ``g``, ``d``, ``x`` and writes the new ``d`` and
  ``x`` (the array-API code makes about 30 passes over memory with large
  temporaries). Each block's inner products are pairwise sums as before, and
  the block sums are added exactly (``math.fsum``) before rounding to the
  accumulation dtype: the result differs from the single pairwise sum by float
  rounding only, and is at least as accurate;
* with ``lam = 0`` the term ``lam * <v, d>`` of the exact numerator is not
  computed (it is exactly zero whenever it is finite, and when it is not, the
  zero-denominator guard already sets beta to 0);
* the scalar beta rule runs on Python floats (float64, same IEEE operations)
  or NumPy scalars (float32), with the same promotion, comparisons and guard
  as ``_guarded_ratio`` / ``_apply_variant``.

Caller arrays are never modified.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["BLOCK", "eligible", "am_momentum_step_numpy"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_TINY64 = float(np.finfo(np.float64).eps) ** 2
_TINY32 = float(np.finfo(np.float32).eps) ** 2
#: arrays larger than this are processed in blocks of this many elements
BLOCK = 32768

_add = np.add.reduce


def eligible(*groups: tuple[Any, ...]) -> bool:
    """True when every array of every group is an ``ndarray`` of one float32/float64 dtype."""
    dtype = None
    for group in groups:
        for a in group:
            if type(a) is not np.ndarray:
                return False
            if dtype is None:
                dtype = a.dtype
                if dtype not in _FLOATS:
                    return False
            elif a.dtype != dtype:
                return False
    return dtype is not None


# --------------------------------------------------------------------------- inner products


def _sums_small(g: np.ndarray, d: np.ndarray, exact: bool, with_vd: bool, py: bool) -> tuple:
    """``(v, [<v,v>, <g,g>, <d,d>, <v,g>, <v,d>])`` exactly as ``amopt._core._am_beta``.

    Like ``_core._dot``, the products are of the flattened (C-order) arrays, and each
    sum is NumPy's pairwise sum of one row of products (the rows of a ``(k, n)``
    buffer reduced along their contiguous axis: the same sums as one array at a
    time, in one call). ``v`` is returned in the shape of ``g``; the sums as Python
    floats when ``py``, else as NumPy scalars.
    """
    shape = g.shape
    if g.ndim != 1:
        g, d = g.reshape(-1), d.reshape(-1)
    v = np.subtract(d, g)
    rows = 3 + (2 if exact and with_vd else 1 if exact else 0)
    prods = np.empty((rows, g.size), dtype=g.dtype)
    np.multiply(v, v, out=prods[0])
    np.multiply(g, g, out=prods[1])
    np.multiply(d, d, out=prods[2])
    if exact:
        np.multiply(v, g, out=prods[3])
        if with_vd:
            np.multiply(v, d, out=prods[4])
    sums = _add(prods, axis=1)
    out = sums.tolist() if py else list(sums)
    if exact and not with_vd:
        out.append(0.0 if py else g.dtype.type(0.0))
    return v.reshape(shape), out


def _sums_blocked(g: np.ndarray, d: np.ndarray, exact: bool, with_vd: bool) -> list:
    """The same inner products in one cache-blocked pass over ``g`` and ``d``."""
    gf, df = g.reshape(-1), d.reshape(-1)
    n = gf.size
    vbuf = np.empty(BLOCK, dtype=g.dtype)
    pbuf = np.empty(BLOCK, dtype=g.dtype)
    parts: list[list[float]] = [[] for _ in range(5 if exact else 3)]
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        gb, db = gf[start:stop], df[start:stop]
        m = stop - start
        vb, pb = vbuf[:m], pbuf[:m]
        np.subtract(db, gb, out=vb)
        parts[0].append(float(_add(np.multiply(vb, vb, out=pb))))
        parts[1].append(float(_add(np.multiply(gb, gb, out=pb))))
        parts[2].append(float(_add(np.multiply(db, db, out=pb))))
        if exact:
            parts[3].append(float(_add(np.multiply(vb, gb, out=pb))))
            if with_vd:
                parts[4].append(float(_add(np.multiply(vb, db, out=pb))))
    acc = g.dtype.type
    return [acc(math.fsum(p)) for p in parts]


def _update_blocked(
    x: np.ndarray, g: np.ndarray, d: np.ndarray, coef: Any, lr: float
) -> tuple[np.ndarray, np.ndarray]:
    """``d' = g + coef * (d - g)`` and ``x' = x - lr * d'`` in one cache-blocked pass."""
    new_d = np.empty(g.shape, dtype=g.dtype)
    new_x = np.empty(x.shape, dtype=x.dtype)
    xf, gf, df = x.reshape(-1), g.reshape(-1), d.reshape(-1)
    ndf, nxf = new_d.reshape(-1), new_x.reshape(-1)
    n = gf.size
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        gb, nd, nx = gf[start:stop], ndf[start:stop], nxf[start:stop]
        np.subtract(df[start:stop], gb, out=nd)
        np.multiply(nd, coef, out=nd)
        np.add(gb, nd, out=nd)
        np.multiply(nd, lr, out=nx)
        np.subtract(xf[start:stop], nx, out=nx)
    return new_x, new_d


# --------------------------------------------------------------------------- the scalar rule


def _beta(num: Any, den: Any, ref: Any, beta_max: float, tiny: float) -> Any:
    """``amopt._core._guarded_ratio`` on NumPy scalars (same promotion and comparisons)."""
    degenerate = den <= tiny * ref
    ratio = num / (np.ones_like(den)[()] if degenerate else den)
    dt = np.asarray(ratio).dtype.type
    if np.isnan(ratio):
        ratio = dt(0.0)
    # compat clip: the bounds are cast to the dtype of ratio, then strict comparisons
    if ratio < dt(0.0):
        ratio = dt(0.0)
    if ratio > dt(beta_max):
        ratio = dt(beta_max)
    return dt(0.0) if degenerate else ratio


def _beta_float(num: float, den: float, ref: float, beta_max: float, tiny: float) -> float:
    """``_beta`` for finite float64 values with ``den > 0``, on Python floats (same IEEE ops)."""
    if den <= tiny * ref:
        return 0.0
    ratio = num / den
    if ratio < 0.0:
        return 0.0
    return float(beta_max) if ratio > beta_max else ratio


def _variant(
    beta: Any,
    variant: str | None,
    beta_min: float,
    theta: float,
    beta_high: float,
    beta_low: float,
) -> Any:
    """``amopt._core._apply_variant`` on a NumPy scalar or a Python float (float64)."""
    if variant is None:
        return beta
    dt = float if type(beta) is float else np.asarray(beta).dtype.type
    if variant == "clip":
        return dt(beta_min) if beta < dt(beta_min) else beta
    if variant == "restart":
        return dt(beta_high) if beta >= theta else dt(beta_low)
    raise ValueError(f"variant must be one of (None, 'clip', 'restart'); got {variant!r}")


# --------------------------------------------------------------------------- the step


def _rule(
    sums: list[Any],
    f_decrease: Any,
    lr: float,
    lam: float,
    beta_max: float,
    variant: str | None,
    beta_min: float,
    theta: float,
    beta_high: float,
    beta_low: float,
    py: bool,
    acc: type,
    dtype: Any,
) -> tuple[Any, Any]:
    """The scalar rule of ``_core._am_beta`` and the step: ``(beta, coef)`` of one scope."""
    tiny = _TINY64 if acc is np.float64 else _TINY32
    den, gg, dd = sums[0], sums[1], sums[2]
    if f_decrease is not None:
        num = f_decrease * (1.0 + lam) / lr - (sums[3] + lam * sums[4])
    else:
        num = (1.0 + lam) * gg - lam * den
    ref = dd + gg
    if py and den > 0.0 and math.isfinite(num) and math.isfinite(den + ref):
        beta = _beta_float(num, den, ref, beta_max, tiny)
        if variant is not None:
            beta = _variant(beta, variant, beta_min, theta, beta_high, beta_low)
        return beta, (beta + lam) / (1.0 + lam)
    if py:
        num, den, ref = np.float64(num), np.float64(den), np.float64(ref)
    elif f_decrease is not None and np.asarray(num).dtype != acc:
        num = acc(num)  # as _core: a float64 f_decrease must not promote the scope
    beta = _beta(num, den, ref, beta_max, tiny)
    beta = _variant(beta, variant, beta_min, theta, beta_high, beta_low)
    return beta, np.asarray((beta + lam) / (1.0 + lam)).astype(dtype)[()]


def _beta_out(beta: Any, variant: str | None) -> Any:
    """The type of the array-API path: a 0-d array, a NumPy scalar after the clip variant."""
    beta = np.asarray(beta)
    return beta[()] if variant == "clip" else beta


def am_momentum_step_numpy(
    xs: tuple[np.ndarray, ...],
    gs: tuple[np.ndarray, ...],
    ds: tuple[np.ndarray, ...],
    per_layer: bool,
    *,
    lr: float,
    lam: float,
    beta_max: float,
    f_decrease: Any,
    variant: str | None,
    beta_min: float,
    theta: float,
    beta_high: float,
    beta_low: float,
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], list[np.ndarray]]:
    """One AM step on NumPy arrays: ``(new_x, new_d, betas)``, one beta per scope.

    ``gs`` already includes coupled weight decay; ``ds`` is ``gs`` on step 0. The
    scopes are the arrays (``per_layer``) or all of them together, as in ``_core``.
    """
    f64 = xs[0].dtype == np.float64
    acc = np.float64 if f64 else np.float32
    exact = f_decrease is not None
    with_vd = lam != 0  # lam * <v, d> is otherwise 0 (see the module docstring)
    # float64 with a Python-float decrease: the scalar rule on Python floats is the same
    # IEEE double arithmetic as on float64 NumPy scalars, without their call overhead.
    py = f64 and (f_decrease is None or type(f_decrease) is float)
    rule = (f_decrease, lr, lam, beta_max, variant, beta_min, theta, beta_high, beta_low)
    rule += (py, acc, xs[0].dtype)
    if len(xs) == 1 and xs[0].size <= BLOCK:
        # the common case of minimize, in straight-line code
        x, g = xs[0], gs[0]
        v, sums = _sums_small(g, ds[0], exact, with_vd, py)
        beta, coef = _rule(sums, *rule)
        np.multiply(v, coef, out=v)
        np.add(g, v, out=v)
        step = np.multiply(v, lr)
        return (np.subtract(x, step, out=step),), (v,), [_beta_out(beta, variant)]

    new_x: list[np.ndarray] = list(xs)
    new_d: list[np.ndarray] = list(ds)
    betas: list[np.ndarray] = []
    n = len(xs)
    scopes = [(i,) for i in range(n)] if per_layer else [tuple(range(n))]
    for scope in scopes:
        small: dict[int, np.ndarray] = {}  # v of the small arrays, reused by the update
        sums: list[Any] = []
        for i in scope:
            g, d = gs[i], ds[i]
            if g.size <= BLOCK:
                small[i], parts = _sums_small(g, d, exact, with_vd, py)
            else:
                parts = _sums_blocked(g, d, exact, with_vd)
                if py:
                    parts = [float(p) for p in parts]
            # the scope sums start from the first array's, as in _core._scope_sum
            sums = parts if not sums else [a + b for a, b in zip(sums, parts, strict=True)]
        beta, coef = _rule(sums, *rule)
        for i in scope:
            v = small.get(i)
            if v is None:
                new_x[i], new_d[i] = _update_blocked(xs[i], gs[i], ds[i], coef, lr)
                continue
            # d = g + coef * (d - g), formed in the buffer of v; x - lr * d in that of lr * d
            np.multiply(v, coef, out=v)
            np.add(gs[i], v, out=v)
            new_d[i] = v
            step = np.multiply(v, lr)
            new_x[i] = np.subtract(xs[i], step, out=step)
        betas.append(_beta_out(beta, variant))
    return tuple(new_x), tuple(new_d), betas
