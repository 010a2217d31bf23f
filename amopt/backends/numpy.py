"""NumPy fast path of :func:`amopt.am_momentum_step` (AM-MGD / AM-MSGD).

:func:`amopt.optimize.steps.am_momentum_step` dispatches here when every array is a
plain float64 ``numpy.ndarray``. The rule and every elementwise operation, in the
same order, are those of the array-API implementation in :mod:`amopt.optimize.steps`; what
changes is how often memory is traversed and how many NumPy calls a step makes:

* arrays of at most ``BLOCK`` elements: ``v = d - g`` is formed once and
  reused by the inner products and the update, the new momentum
  ``g + coef * v`` is built in the buffer of ``v`` and ``x - lr * d`` in the
  buffer of ``lr * d``. The inner products are the same pairwise sums of the
  same products as in :mod:`amopt.optimize.steps`: the result is identical, bit for bit;
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
* the sums of each scope are stacked as the array-API reduce stacks them and go
  through the one rule, :func:`amopt.core.rule.momentum_beta`; this module holds
  no beta math.

Caller arrays are never modified.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from amopt.core import rule as _rule
from amopt.core import tape as _tape

__all__ = ["BLOCK", "eligible", "momentum_step"]

# float64 only: float32 scopes accumulate their sums in float64
# (amopt.core.reduce.accumulation_dtype),
# which the array-API path does with its own casts
_FLOAT64 = np.dtype(np.float64)
#: arrays larger than this are processed in blocks of this many elements
BLOCK = 32768

_add = np.add.reduce


def eligible(*groups: tuple[Any, ...]) -> bool:
    """True when every array of every group is a float64 ``ndarray`` (and there is one)."""
    arrays = [a for group in groups for a in group]
    return bool(arrays) and all(type(a) is np.ndarray and a.dtype == _FLOAT64 for a in arrays)


# --------------------------------------------------------------------------- reduce


def _sums_small(g: np.ndarray, d: np.ndarray, exact: bool, with_vd: bool) -> tuple:
    """``(v, sums)``: ``v = d - g`` and ``[<v,v>, <g,g>, <d,d>(, <v,g>, <v,d>)]``.

    Like ``amopt.core.reduce``, the products are of the flattened (C-order) arrays, and
    each sum is NumPy's pairwise sum of one row of products (the rows of a ``(k, n)``
    buffer reduced along their contiguous axis: the same sums as one array at a
    time, in one call). ``v`` is returned in the shape of ``g``.
    """
    shape = g.shape
    if g.ndim != 1:
        g, d = g.reshape(-1), d.reshape(-1)
    v = np.subtract(d, g)
    # without with_vd the row of <v,d> is never written: it must hold zeros
    alloc = np.zeros if exact and not with_vd else np.empty
    prods = alloc((5 if exact else 3, g.size), dtype=g.dtype)
    np.multiply(v, v, out=prods[0])
    np.multiply(g, g, out=prods[1])
    np.multiply(d, d, out=prods[2])
    if exact:
        np.multiply(v, g, out=prods[3])
        if with_vd:
            np.multiply(v, d, out=prods[4])
    return v.reshape(shape), _add(prods, axis=1)


def _sums_blocked(g: np.ndarray, d: np.ndarray, exact: bool, with_vd: bool) -> np.ndarray:
    """The same sums in one cache-blocked pass over ``g`` and ``d``."""
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
    return np.array([math.fsum(p) for p in parts], dtype=g.dtype)


# --------------------------------------------------------------------------- apply


def _update_blocked(
    x: np.ndarray, g: np.ndarray, d: np.ndarray, coef: Any, lr: float
) -> tuple[np.ndarray, np.ndarray]:
    """``d' = g + coef (d - g)`` and ``x' = x - lr d'`` in blocks, into new arrays."""
    xf, gf, df = x.reshape(-1), g.reshape(-1), d.reshape(-1)
    new_x = np.empty_like(xf)
    new_d = np.empty_like(df)
    n = xf.size
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        db = new_d[start:stop]
        np.subtract(df[start:stop], gf[start:stop], out=db)
        np.multiply(db, coef, out=db)
        np.add(gf[start:stop], db, out=db)
        xb = new_x[start:stop]
        np.multiply(db, lr, out=xb)
        np.subtract(xf[start:stop], xb, out=xb)
    return new_x.reshape(x.shape), new_d.reshape(d.shape)


# --------------------------------------------------------------------------- the rule


def _exact_rule(xp: Any, sums: Any, base: Any, cfg: Any, lr: float) -> Any:
    """``base`` (:func:`amopt.core.rule.momentum_beta`) with ``f_decrease`` a sixth input."""
    return base(xp, sums, cfg, lr=lr, f_decrease=sums[..., 5])


#: (rule, config, lr, exact, Python function) of the last call: minimize calls with the
#: same ones every iteration. One tuple, rebound whole, so that threads read consistent
#: ones. The rule is looked up in amopt.core.rule at every call, so that a replaced rule is
#: the one that runs.
_last_rule: tuple[Any, ...] = (None, None, None, None, None)


def _one_scope_rule(
    sums: np.ndarray, config: Any, lr: float, f_decrease: Any, lr_ratio: float = 1.0
) -> tuple:
    """``momentum_beta(np, sums, ...)`` of one scope, as 0-d float64 arrays.

    Run as the rule's tape in Python floats (the same IEEE operations, bit for bit,
    without NumPy's cost per operation on 0-d arrays) when ``f_decrease`` is None or a
    float64 number; otherwise by the rule itself.
    """
    global _last_rule
    rule = _rule.momentum_beta
    if lr_ratio != 1.0:  # a learning-rate schedule: the rule itself, with r
        return rule(np, sums, config, lr=lr, f_decrease=f_decrease, lr_ratio=lr_ratio)
    values = sums.tolist()
    exact = f_decrease is not None
    if exact and type(f_decrease) not in (float, np.float64):
        fn = None
    else:
        last = _last_rule
        if last[0] is rule and last[1] is config and last[2] == lr and last[3] == exact:
            fn = last[4]
        else:
            if exact:
                fn = _tape.python_rule(_exact_rule, 6, base=rule, cfg=config, lr=float(lr))
            else:
                fn = _tape.python_rule(rule, 3, cfg=config)
            _last_rule = (rule, config, lr, exact, fn)
        if exact:
            values.append(float(f_decrease))
    if fn is None:
        return rule(np, sums, config, lr=lr, f_decrease=f_decrease)
    beta, gamma = fn(values)
    return np.array(beta), np.array(gamma)


# --------------------------------------------------------------------------- the step


def momentum_step(
    xs: tuple[np.ndarray, ...],
    gs: tuple[np.ndarray, ...],
    ds: tuple[np.ndarray, ...],
    config: Any,
    *,
    lr: float,
    weight_decay: float,
    first: bool,
    f_decrease: Any,
    lr_ratio: float = 1.0,
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], list[np.ndarray]] | None:
    """:func:`amopt.am_momentum_step` on plain float64 NumPy arrays: ``(new_x, new_d,
    betas)``, one beta per scope; None where an array is not one (:func:`eligible`).

    ``ds`` is the state's momentum, the gradients in its place at a ``first`` step;
    coupled weight decay joins the gradients first. The scopes are the arrays
    (``config.per_layer``) or all of them together, as in
    :mod:`amopt.optimize.steps`; the rule is :func:`amopt.core.rule.momentum_beta`.
    """
    if not eligible(xs, gs, ds):
        return None
    if weight_decay != 0:
        gs = tuple(g + weight_decay * x for g, x in zip(gs, xs, strict=True))
    if first:
        ds = gs
    exact = f_decrease is not None
    with_vd = config.lam != 0  # lam * <v, d> is otherwise 0 (see the module docstring)
    if len(xs) == 1 and xs[0].size <= BLOCK:
        # the common case of minimize, in straight-line code
        x, g = xs[0], gs[0]
        v, sums = _sums_small(g, ds[0], exact, with_vd)
        beta, gamma = _one_scope_rule(sums, config, lr, f_decrease, lr_ratio)
        np.multiply(v, gamma.astype(v.dtype, copy=False), out=v)
        np.add(g, v, out=v)
        step = np.multiply(v, lr)
        return (np.subtract(x, step, out=step),), (v,), [beta]

    new_x: list[np.ndarray] = list(xs)
    new_d: list[np.ndarray] = list(ds)
    betas: list[np.ndarray] = []
    n = len(xs)
    scope_list = [(i,) for i in range(n)] if config.per_layer else [tuple(range(n))]
    for scope in scope_list:
        small: dict[int, np.ndarray] = {}  # v of the small arrays, reused by the update
        sums: Any = None
        for i in scope:
            g, d = gs[i], ds[i]
            if g.size <= BLOCK:
                small[i], parts = _sums_small(g, d, exact, with_vd)
            else:
                parts = _sums_blocked(g, d, exact, with_vd)
            # the scope sums start from the first array's, as in amopt.core.reduce
            sums = parts if sums is None else sums + parts
        beta, gamma = _rule.momentum_beta(
            np, sums, config, lr=lr, f_decrease=f_decrease, lr_ratio=lr_ratio
        )
        coef = gamma.astype(xs[scope[0]].dtype, copy=False)
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
        betas.append(beta)
    return tuple(new_x), tuple(new_d), betas
