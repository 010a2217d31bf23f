r"""A rule of :mod:`amopt.core.rule` recorded as a tape of scalar operations.

The rules are branch-free array-API functions, so running one on a recording
namespace (:func:`trace`) gives the exact sequence of elementwise operations it
performs on one scope's sums. A kernel that cannot call back into Python between its
reduce and apply passes (the fused CPU kernels, which interleave the two per chunk of
tensors while the chunk is still in cache) evaluates that tape per scope instead. The
math still exists once: the tape is recorded from the rule that is in
:mod:`amopt.core.rule` when the step runs, and holds only IEEE operations (``+ - * /``,
comparisons, ``where``, ``isnan``, ``maximum``, ``minimum``), evaluated in float64 one
rounding each, as NumPy evaluates the rule on float64 sums.

A rule that does anything else (a Python ``if`` on a value, an operation not recorded
here, any exception) cannot be traced: :func:`trace` returns ``None`` and the caller
runs the rule itself (where a genuine error then surfaces).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from amopt.core import rule as _rule

__all__ = [
    "INSN",
    "OPS",
    "Tape",
    "c_source",
    "input_rule",
    "python_rule",
    "trace",
    "traced",
]

#: Operation codes (``amopt/torch/csrc/am_fused_common.h`` has the same table).
OPS = (
    "in", "const", "add", "sub", "mul", "div", "le", "ge", "lt", "gt", "eq", "ne",
    "where", "isnan", "maximum", "minimum", "neg",
)  # fmt: skip
_CODE = {name: k for k, name in enumerate(OPS)}
#: One instruction: ``r[i] = op(r[a], r[b], r[c])`` (``in``: input ``a``; ``const``: k).
INSN = np.dtype([("op", "<i4"), ("a", "<i4"), ("b", "<i4"), ("c", "<i4"), ("k", "<f8")])
#: The most instructions a kernel evaluates (its register file).
MAX_LENGTH = 256


class _Untraceable(Exception):
    """The rule did something the tape cannot record."""


class Tape:
    """Instructions in SSA form (register ``i`` is the result of instruction ``i``)."""

    def __init__(self, dtype: Any = np.float64) -> None:
        self.rows: list[tuple[int, int, int, int, float]] = []
        self._consts: dict[float, int] = {}
        self.outputs: tuple[int, ...] = ()
        self.dtype = np.dtype(dtype)  # every operation rounds once in it

    def emit(self, op: str, a: int = 0, b: int = 0, c: int = 0, k: float = 0.0) -> _Value:
        self.rows.append((_CODE[op], a, b, c, k))
        return _Value(self, len(self.rows) - 1)

    def reg(self, x: Any) -> int:
        """The register holding ``x``: a traced value or a Python / NumPy real number."""
        if isinstance(x, _Value):
            if x.tape is not self:
                raise _Untraceable("a value of another tape")
            return x.index
        if isinstance(x, (bool, np.bool_)):
            x = float(x)
        if isinstance(x, (int, float, np.integer, np.floating)):
            k = float(x)
            key = k if k == k else "nan"
            if key not in self._consts:
                self._consts[key] = self.emit("const", k=k).index
            return self._consts[key]
        raise _Untraceable(f"cannot record an operand of type {type(x).__name__}")

    def array(self) -> np.ndarray:
        return np.array(self.rows, dtype=INSN)


class _Value:
    """A traced float64 scalar."""

    __slots__ = ("tape", "index")
    shape: tuple[int, ...] = ()
    ndim = 0

    @property
    def dtype(self) -> np.dtype:
        return self.tape.dtype

    def __init__(self, tape: Tape, index: int) -> None:
        self.tape, self.index = tape, index

    def _binary(self, op: str, other: Any, swap: bool = False) -> _Value:
        a, b = self.index, self.tape.reg(other)
        return self.tape.emit(op, *((b, a) if swap else (a, b)))

    def __neg__(self) -> _Value:
        return self.tape.emit("neg", self.index)

    def __pos__(self) -> _Value:
        return self

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise _Untraceable("the truth value of a traced value (a Python branch on data)")

    def __float__(self) -> float:
        raise _Untraceable("a traced value converted to a Python number")


def _binary(op: str, swap: bool = False) -> Callable[[_Value, Any], _Value]:
    def method(self: _Value, other: Any) -> _Value:
        return self._binary(op, other, swap)

    return method


# the operators the rules use: + - * / with Python numbers on either side, comparisons
for _name, _op in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div")):
    setattr(_Value, f"__{_name}__", _binary(_op))
    setattr(_Value, f"__r{_name}__", _binary(_op, swap=True))
for _op in ("le", "ge", "lt", "gt", "eq", "ne"):
    setattr(_Value, f"__{_op}__", _binary(_op))


class _Sums:
    """The rule's input: ``sums[..., k]`` is sum ``k`` of the scope."""

    def __init__(self, tape: Tape, n: int) -> None:
        self.tape, self.n = tape, n
        self.shape = (n,)
        self.dtype = tape.dtype

    def __getitem__(self, key: Any) -> _Value:
        if not (isinstance(key, tuple) and len(key) == 2 and key[0] is Ellipsis):
            raise _Untraceable(f"sums indexed with {key!r}")
        k = int(key[1])
        if not -self.n <= k < self.n:
            raise _Untraceable(f"sum {k} of {self.n}")
        return self.tape.emit("in", k % self.n)


class _Namespace:
    """The part of the array API the rules use, recording instead of computing."""

    float64 = np.float64
    finfo = staticmethod(np.finfo)

    def __init__(self, tape: Tape) -> None:
        self.tape = tape

    def _r(self, x: Any) -> int:
        return self.tape.reg(x)

    def where(self, cond: Any, a: Any, b: Any) -> _Value:
        return self.tape.emit("where", self._r(cond), self._r(a), self._r(b))

    def isnan(self, a: Any) -> _Value:
        return self.tape.emit("isnan", self._r(a))

    def maximum(self, a: Any, b: Any) -> _Value:
        return self.tape.emit("maximum", self._r(a), self._r(b))

    def minimum(self, a: Any, b: Any) -> _Value:
        return self.tape.emit("minimum", self._r(a), self._r(b))

    def clip(self, a: Any, lo: Any = None, hi: Any = None) -> Any:
        out = a
        if lo is not None:
            out = self.maximum(out, lo)
        if hi is not None:
            out = self.minimum(out, hi)
        return out

    def zeros_like(self, a: Any) -> _Value:
        return _Value(self.tape, self.tape.reg(0.0))

    def ones_like(self, a: Any) -> _Value:
        return _Value(self.tape, self.tape.reg(1.0))

    def full_like(self, a: Any, value: Any) -> _Value:
        return _Value(self.tape, self.tape.reg(value))

    def astype(self, a: Any, dtype: Any) -> Any:
        if np.dtype(dtype) != self.tape.dtype:
            raise _Untraceable(f"a cast to {dtype}")
        return a


def trace(
    rule: Callable[..., Any], n_sums: int, *, dtype: Any = np.float64, **kwargs: Any
) -> Tape | None:
    """``rule(xp, sums, **kwargs)`` recorded for one scope of ``n_sums`` sums of ``dtype``
    (float64, or float32 for a kernel that evaluates the tape in float32).

    Returns the tape with ``outputs`` (one register per output of the rule), or
    ``None`` when the rule cannot be recorded or needs more than :data:`MAX_LENGTH`
    instructions.
    """
    tape = Tape(dtype)
    try:
        out = rule(_Namespace(tape), _Sums(tape, n_sums), **kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        tape.outputs = tuple(tape.reg(o) for o in outs)
    except Exception:  # noqa: BLE001 - not recordable: the caller runs the rule itself,
        return None  # where a genuine error surfaces
    if len(tape.rows) > MAX_LENGTH:
        return None
    return tape


def input_rule(xp: Any, sums: Any, cfg: Any, *, base: Any, name: str, **kwargs: Any) -> Any:
    """``base(xp, sums, cfg, name=sums[..., 3], **kwargs)``: a rule whose keyword argument
    ``name`` is recorded as the scope's fourth input, after its three sums.

    What changes from step to step without changing the rule (the learning-rate ratio of
    the linearised numerators, AM-Adam's first-step flag) is then an input of the tape
    rather than a constant: one kernel serves every step. ``base`` is the rule looked
    up in :mod:`amopt.core.rule` by the caller when the step runs (and part of the cache
    key), so a replaced rule is the one recorded.
    """
    return base(xp, sums, cfg, **{name: sums[..., 3]}, **kwargs)


@functools.lru_cache(maxsize=64)
def _cached(rule: Callable[..., Any], n_sums: int, items: tuple) -> tuple | None:
    tape = trace(rule, n_sums, **dict(items))
    if tape is None:
        return None
    return tape.array(), np.array(tape.outputs, dtype=np.int64)


def _key(kwargs: dict[str, Any]) -> tuple | None:
    """The rule's keyword arguments as a cache key, or None when they are not hashable."""
    items = tuple(sorted(kwargs.items()))
    try:
        hash(items)
    except TypeError:
        return None
    return items


def traced(rule: Callable[..., Any], n_sums: int, **kwargs: Any) -> tuple | None:
    """:func:`trace`, cached by the rule and its arguments: ``(code, outputs)`` arrays."""
    items = _key(kwargs)
    if items is None:
        tape = trace(rule, n_sums, **kwargs)
        return None if tape is None else (tape.array(), np.array(tape.outputs, dtype=np.int64))
    return _cached(rule, n_sums, items)


# --------------------------------------------------------------------------- Python

#: One line of straight-line Python per operation; every value is a Python float, whose
#: arithmetic is IEEE double with one rounding per operation, as NumPy's on float64.
_PYTHON = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b} if {b} else _div0({a}, {b})",
    "le": "1.0 if {a} <= {b} else 0.0",
    "ge": "1.0 if {a} >= {b} else 0.0",
    "lt": "1.0 if {a} < {b} else 0.0",
    "gt": "1.0 if {a} > {b} else 0.0",
    "eq": "1.0 if {a} == {b} else 0.0",
    "ne": "1.0 if {a} != {b} else 0.0",
    "where": "{b} if {a} != 0.0 else {c}",
    "isnan": "1.0 if {a} != {a} else 0.0",
    # NumPy's maximum / minimum: a NaN operand gives NaN, ties give the first operand
    "maximum": "{a} if {a} != {a} or {a} >= {b} else {b}",
    "minimum": "{a} if {a} != {a} or {a} <= {b} else {b}",
    "neg": "-{a}",
}


def _div0(a: float, b: float) -> float:
    """``a / b`` for ``b = +-0`` as IEEE (NumPy) divides: +-inf, or NaN for 0/0 and NaN/0."""
    if a != a or a == 0.0:
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _literal(k: float) -> str:
    if k != k:
        return "_NAN"
    if math.isinf(k):
        return "_INF" if k > 0 else "-_INF"
    return repr(k)


def _python_source(code: np.ndarray, outputs: np.ndarray) -> str:
    lines = ["def rule(s):"]
    for i, (op, a, b, c, k) in enumerate(code.tolist()):
        name = OPS[op]
        if name == "in":
            expr = f"s[{a}]"
        elif name == "const":
            expr = _literal(k)
        else:
            expr = _PYTHON[name].format(a=f"r{a}", b=f"r{b}", c=f"r{c}")
        lines.append(f"    r{i} = {expr}")
    lines.append("    return (" + "".join(f"r{o}, " for o in outputs.tolist()) + ")")
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=64)
def _python_cached(rule: Callable[..., Any], n_sums: int, items: tuple) -> Callable | None:
    tape = traced(rule, n_sums, **dict(items))
    if tape is None:
        return None
    namespace: dict[str, Any] = {"_div0": _div0, "_NAN": math.nan, "_INF": math.inf}
    # the source is generated here from the recorded operations, never read from elsewhere
    exec(compile(_python_source(*tape), "<amopt rule tape>", "exec"), namespace)  # noqa: S102
    return namespace["rule"]


def python_rule(rule: Callable[..., Any], n_sums: int, **kwargs: Any) -> Callable | None:
    """The tape of ``rule`` as a Python function of one scope's sums (Python floats).

    ``f(sums) -> tuple`` of the rule's outputs as Python floats, bit for bit what the
    rule gives on float64 NumPy sums of shape ``(n_sums,)``, without NumPy's per-call
    cost on 0-d arrays (about 1 us an operation against 0.05 us). ``None`` when the rule
    cannot be recorded (see :func:`trace`) or its arguments are not hashable.
    """
    items = _key(kwargs)
    return None if items is None else _python_cached(rule, n_sums, items)


def momentum_of_dots(base: Any, config: Any, lr: float, exact: bool) -> tuple | None:
    """The tape of :func:`amopt.core.rule.momentum_beta_of_dots` (``rule`` ``base``): the rule
    of ``minimize``'s device split, from a scope's three dots (and the decrease of f,
    with ``exact``) to beta and gamma; None where it cannot be recorded."""
    return traced(
        _rule.momentum_beta_of_dots,
        4 if exact else 3,
        cfg=config,
        base=base,
        lr=float(lr),
        exact=exact,
    )


# --------------------------------------------------------------------------- C

#: One C expression per operation on doubles, for a device compiler (CuPy's NVRTC).
#: The arithmetic goes through the round-to-nearest intrinsics, which a compiler never
#: contracts into a fused multiply-add (one rounding where NumPy rounds twice); a
#: subtraction is an addition of the negated operand (negation is exact).
_C_OPS = {
    "add": "__dadd_rn({a}, {b})",
    "sub": "__dadd_rn({a}, -{b})",
    "mul": "__dmul_rn({a}, {b})",
    "div": "__ddiv_rn({a}, {b})",
    "le": "({a} <= {b}) ? 1.0 : 0.0",
    "ge": "({a} >= {b}) ? 1.0 : 0.0",
    "lt": "({a} < {b}) ? 1.0 : 0.0",
    "gt": "({a} > {b}) ? 1.0 : 0.0",
    "eq": "({a} == {b}) ? 1.0 : 0.0",
    "ne": "({a} != {b}) ? 1.0 : 0.0",
    "where": "({a} != 0.0) ? {b} : {c}",
    "isnan": "({a} != {a}) ? 1.0 : 0.0",
    "maximum": "({a} != {a} || {a} >= {b}) ? {a} : {b}",
    "minimum": "({a} != {a} || {a} <= {b}) ? {a} : {b}",
    "neg": "-{a}",
}


def _c_literal(k: float) -> str:
    if k != k:
        return "__longlong_as_double(0x7ff8000000000000LL)"
    if math.isinf(k):
        bits = "0x7ff0000000000000LL" if k > 0 else "0xfff0000000000000LL"
        return f"__longlong_as_double({bits})"
    return repr(k)  # the shortest decimal that reads back as this double


def c_source(
    code: np.ndarray, outputs: np.ndarray, inputs: Sequence[str], names: Sequence[str]
) -> str:
    """A recorded tape (:func:`traced`) as C statements on doubles.

    ``inputs[k]`` is the C expression of input ``k``; the statements assign the tape's
    outputs to the variables ``names`` (declared by the caller). Every operation
    rounds once, as NumPy's on float64: the same values bit for bit where the compiler
    keeps IEEE division (CUDA's default) and does not flush subnormals.
    """
    lines = []
    for i, (op, a, b, c, k) in enumerate(code.tolist()):
        name = OPS[op]
        if name == "in":
            expr = inputs[a]
        elif name == "const":
            expr = _c_literal(k)
        else:
            expr = _C_OPS[name].format(a=f"r{a}", b=f"r{b}", c=f"r{c}")
        lines.append(f"const double r{i} = {expr};")
    lines += [f"{n} = r{o};" for n, o in zip(names, outputs.tolist(), strict=True)]
    return "\n".join(lines) + "\n"
