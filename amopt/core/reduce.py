"""The reduce stage of the array-API core: per-scope sums of the AM rules.

Each function returns one stacked array of shape ``(n_scopes, n_sums)`` in the
accumulation dtype (:func:`accumulation_dtype`: float64 wherever the arrays' device has
it, so that squares neither overflow nor underflow in the input dtype); scopes of
different accumulation dtypes give a list of rows instead. The order of the sums is that of
:data:`amopt.core.rule.MOMENTUM_SUMS` / :data:`amopt.core.rule.ADAM_SUMS`; the rule in
:mod:`amopt.core.rule` maps them to beta. Also here: the array helpers the core's
step functions share (parameter lists, scopes) and the one dtype policy: the
accumulation dtype of sums (:func:`accumulation_dtype`) and the compute dtype of
elementwise updates (:func:`compute_dtype`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "Array",
    "accumulation_dtype",
    "cast",
    "compute_dtype",
    "adam_sums",
    "as_tuple",
    "momentum_sums",
    "restore",
    "row",
    "scopes",
]

Array = Any


def as_tuple(params: Any) -> tuple[tuple[Array, ...], bool]:
    """``(arrays, was_single)`` for one array or a parameter list."""
    if isinstance(params, list | tuple):
        return tuple(params), False
    return (params,), True


def restore(arrays: tuple[Array, ...], single: bool) -> Any:
    return arrays[0] if single else arrays


def scopes(n: int, per_layer: bool) -> list[tuple[int, ...]]:
    """Index groups forming the beta scopes."""
    return [(i,) for i in range(n)] if per_layer else [tuple(range(n))]


def accumulation_dtype(xp: Any, arrays: Sequence[Array]) -> Any:
    """Accumulation dtype of a scope's sums: float64 wherever the arrays' device has it.

    The rule is scale-invariant (at ``lam = 0`` beta depends only on the direction of
    ``g`` and ``d``), but the squares it sums are not: in float32 they underflow for
    ``|g|`` below about 1e-19 and overflow above about 1e19, and beta would then be
    reset to 0. Products formed in float64 keep the float32 range's whole ratio. A
    device without float64 (Apple MPS) accumulates in float32.
    """
    if any(a.dtype == xp.float64 for a in arrays):
        return xp.float64
    device = getattr(arrays[0], "device", None)
    if getattr(device, "type", None) == "mps":
        return compute_dtype(xp, arrays[0])
    return xp.float64


def compute_dtype(xp: Any, array: Array) -> Any:
    """The dtype elementwise updates are computed in: float32 for half precision (float16
    and bfloat16 would overflow at 256 when squared and lose the small terms), else the
    array's own (float32 or float64)."""
    return xp.float64 if array.dtype == xp.float64 else xp.float32


def cast(xp: Any, a: Array, dtype: Any) -> Array:
    """``a`` in ``dtype`` (no copy when it already is); also for the plain ``torch`` and
    ``cupy`` modules (:func:`amopt.backends.plain_namespace`)."""
    if a.dtype == dtype:
        return a
    astype = getattr(xp, "astype", None)
    if astype is not None:
        return astype(a, dtype)
    return a.to(dtype) if hasattr(a, "to") else a.astype(dtype)


def _dot(xp: Any, a: Array, b: Array) -> Array:
    """``sum(a * b)`` over all coordinates (both already in the accumulation dtype)."""
    return xp.sum(xp.reshape(a, (-1,)) * xp.reshape(b, (-1,)))


def _stack(xp: Any, rows: list[Array]) -> Any:
    """One ``(n_scopes, k)`` array; a list of rows when scopes differ in dtype."""
    if all(r.dtype == rows[0].dtype for r in rows):
        return xp.stack(rows)
    return rows


def row(sums: Any, k: int) -> Array:
    """The sums of scope ``k`` (from the stacked array or the list of rows)."""
    return sums[k] if isinstance(sums, list) else sums[k, ...]


def momentum_sums(
    xp: Any,
    gs: Sequence[Array],
    ds: Sequence[Array],
    scope_list: Sequence[tuple[int, ...]],
    *,
    exact: bool,
) -> Array:
    """AM-MGD / AM-MSGD sums ``<v,v>, <g,g>, <d,d>[, <v,g>, <v,d>]`` of each scope.

    Returns the stacked sums, shape ``(n_scopes, 5 if exact else 3)``, with ``v = d - g``
    formed in the accumulation dtype. Within a scope each sum starts from its first
    array's and adds the others'.
    """
    rows = []
    for scope in scope_list:
        acc = accumulation_dtype(xp, [gs[i] for i in scope])
        cols: list[Array] = []
        for i in scope:
            g = cast(xp, gs[i], acc)
            d = cast(xp, ds[i], acc)
            v = d - g
            part = [_dot(xp, v, v), _dot(xp, g, g), _dot(xp, d, d)]
            if exact:
                part += [_dot(xp, v, g), _dot(xp, v, d)]
            cols = part if not cols else [a + b for a, b in zip(cols, part, strict=True)]
        rows.append(xp.stack(cols))
    return _stack(xp, rows)


def adam_sums(
    xp: Any,
    gs: Sequence[Array],
    ds: Sequence[Array],
    xs: Sequence[Array],
    ps: Sequence[Array],
    scope_list: Sequence[tuple[int, ...]],
    *,
    lam: float,
    weights: Sequence[float],
    exact: bool,
) -> Array:
    """AM-Adam(W) sums ``N, D, ref`` of each scope, shape ``(n_scopes, 3)``.

    ``ps`` is the preconditioner of every array; ``weights`` (from
    :func:`amopt.core.rule.adam_weights`) weigh the elementwise terms of the numerator,
    :data:`amopt.core.rule.ADAM_TERMS` or, with ``exact``,
    :data:`amopt.core.rule.ADAM_EXACT_TERMS`.
    A zero weight skips its term.
    """
    rows = []
    for scope in scope_list:
        acc = accumulation_dtype(xp, [gs[i] for i in scope])
        num = den = ref = None
        for i in scope:
            g, d, x, p = (cast(xp, a[i], acc) for a in (gs, ds, xs, ps))
            u = 1.0 / (1.0 + lam * p)
            w = u / p
            v = d - g
            if exact:
                terms = [w * v * g, u * v * d, x * v]
            else:
                terms = [g * g / p, u * v * v, g * d / p, g * x, d * x]
            total = weights[0] * terms[0]
            for a_k, term in zip(weights[1:], terms[1:], strict=True):
                if a_k != 0:
                    total = total + a_k * term
            n_k = xp.sum(total)
            d_k = xp.sum(w * v * v)
            r_k = xp.sum(w * d * d) + xp.sum(w * g * g)
            num = n_k if num is None else num + n_k
            den = d_k if den is None else den + d_k
            ref = r_k if ref is None else ref + r_k
        rows.append(xp.stack([num, den, ref]))
    return _stack(xp, rows)
