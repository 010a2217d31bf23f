"""The scalar stages of a compiled single-tensor step, as ``torch.library`` operators.

Under ``torch.compile`` the single-tensor steps (and the foreach steps, which trace
them) become a few loops per tensor: a reduce and an apply. Inductor inlines scalar
arithmetic into the loops that read it, so the rule between the reduce and the apply
(a few dozen operations on 0-d tensors: divisions, clips, ``frexp``) and the bias
corrections (a power per tensor) would be computed again at every vector iteration of
every apply loop. Measured on 25M float32 parameters in 48 tensors (1 thread, AMD EPYC
Zen 4), that took a compiled AMAdamW(foreach=False) step to 3.1x a compiled torch
AdamW step and AMSGD's to 3.6x. As operators the compiler cannot see into, each is
computed once per step and the loops read its result: the reduce -> rule -> apply
stages of ``docs/architecture.md`` with the rule as one node of the graph.

Eagerly the optimizers call the same functions directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from amopt.core import rule as _rule
from amopt.torch._records import rule_config_from, rule_numbers, scope_sums, wide_dtype

__all__: list[str] = []

#: The rule families, by the name the operator takes: the functions of ``amopt.core.rule``,
#: looked up when called (as every surface does; ``tests/test_one_rule.py``).
_FAMILIES = {"momentum": "momentum_beta", "adam": "adam_beta"}


def _family(fn: Any) -> str:
    for family, name in _FAMILIES.items():
        if fn is getattr(_rule, name):
            return family
    raise ValueError(f"{fn!r} is not a rule of amopt.core.rule")


def bias_correction_roots(steps: list[Tensor], beta2: float) -> Tensor:
    """``sqrt(1 - beta2**step)`` of each step counter, stacked, in :func:`wide_dtype`."""
    s = torch.stack(steps)
    s = s.to(wide_dtype(s.device))
    return (1.0 - torch.pow(beta2, s)).sqrt()


_roots_op = torch.library.custom_op("amopt::bias_correction_roots", mutates_args=())(
    bias_correction_roots
)


@_roots_op.register_fake
def _(steps: list[Tensor], beta2: float) -> Tensor:
    return steps[0].new_empty((len(steps),), dtype=wide_dtype(steps[0].device))


def _run_rule(
    family: str,
    sums: Tensor,
    numbers: list[float],
    per_layer: bool,
    variant: str | None,
    lr: float | None,
    weight_decay: float,
    lr_ratio: float = 1.0,
    first: Tensor | None = None,
    ratio: Tensor | None = None,
) -> list[Tensor]:
    """The rule of ``family`` (:data:`_FAMILIES`) on ``sums``; its outputs as a list.

    ``numbers``: the rule's options in the order of
    :data:`~amopt.torch._records.RULE_FIELDS`; ``lr_ratio`` the momentum rule's
    :math:`r` (:func:`ratio_of`, with ``ratio``), ``first`` the Adam rule's first-step
    flags (one per scope).
    """
    lr_ratio = ratio_of(lr_ratio, ratio)
    config = rule_config_from(numbers, per_layer, variant)
    kwargs: dict[str, Any] = {"lr": lr}
    if family == "adam":
        kwargs["weight_decay"] = weight_decay
        if first is not None:
            kwargs["first"] = first.reshape(sums.shape[:-1]).to(sums.dtype)
    elif lr_ratio != 1.0:
        kwargs["lr_ratio"] = lr_ratio
    out = getattr(_rule, _FAMILIES[family])(torch, sums, config, **kwargs)
    outs = list(out) if isinstance(out, tuple) else [out]
    # an operator's outputs may not alias its input
    return [o.clone() if o._base is sums or o is sums else o for o in outs]


_rule_op = torch.library.custom_op("amopt::rule", mutates_args=())(_run_rule)


@_rule_op.register_fake
def _(
    family,
    sums,
    numbers,
    per_layer,
    variant,
    lr,
    weight_decay,
    lr_ratio=1.0,
    first=None,
    ratio=None,
):  # noqa: ANN001, ANN202, E501
    n_out = 2 if family == "momentum" else 1
    return [sums.new_empty(sums.shape[:-1]) for _ in range(n_out)]


def rule(fn: Any, sums: Tensor, config: Any, **kwargs: Any) -> Any:
    """``fn(torch, sums, config, **kwargs)`` as the operator ``amopt::rule``.

    ``fn`` is :func:`amopt.core.rule.momentum_beta` or :func:`amopt.core.rule.adam_beta`; the
    result has its shape (a tuple for the momentum rule).
    """
    family = _family(fn)
    return _shaped(family, _rule_op(family, sums, *_options(config, kwargs), *_extra(kwargs)))


def roots(steps: Sequence[Tensor], beta2: float) -> Tensor:
    """:func:`bias_correction_roots` through the dispatcher (what a compiled step calls)."""
    return _roots_op(list(steps), beta2)


@torch.library.custom_op("amopt::rule_from_sums", mutates_args=())
def _rule_from_sums_op(
    family: str,
    sums: list[Tensor],
    weights: list[float],
    numbers: list[float],
    per_layer: bool,
    variant: str | None,
    lr: float | None,
    weight_decay: float,
    dtype: torch.dtype,
    lr_ratio: float = 1.0,
    first: Tensor | None = None,
    terms: list[int] | None = None,
    ratio: Tensor | None = None,
) -> list[Tensor]:
    """The rule of ``family`` from each tensor's raw sums (``sums``, tensor by tensor).

    ``"adam"`` with ``terms`` (the indices in :data:`amopt.core.rule.ADAM_TERMS` of the
    weights): the weights are :func:`amopt.core.rule.adam_weights` of ``lr``,
    ``weight_decay`` and ``lr_ratio``, formed here (``weights`` gives their number).

    ``"momentum"``: ``<v,v>, <g,g>, <v,g>`` per tensor, the rule's ``<d,d>`` formed as
    ``<v,v> + 2<v,g> + <g,g>``; ``"adam"``: the sums of the numerator's terms, weighted
    by ``weights``, then ``D`` and the two halves of ``ref``. The rows are added up over
    the tensors of a global scope and brought to ``dtype``
    (:func:`~amopt.torch._records.scope_sums`).
    """
    k = len(weights)
    lr_ratio = ratio_of(lr_ratio, ratio)
    if family == "adam" and terms is not None:
        config = rule_config_from(numbers, per_layer, variant)
        full = _rule.adam_weights(config, lr=lr, weight_decay=weight_decay, lr_ratio=lr_ratio)
        weights = [full[j] for j in terms]
    per_tensor = torch.stack(sums).view(-1, _width(family, k))
    if family == "momentum":
        vv, gg, vg = per_tensor.unbind(-1)
        rows = torch.stack([vv, gg, vv + 2.0 * vg + gg], dim=-1)
    else:
        # weighted term by term as the eager step does, with the weights as Python
        # numbers: a tensor made of them would be a host-to-device copy at every step
        # (a synchronisation, and not allowed while a CUDA graph is captured)
        num = weights[0] * per_tensor[:, 0]
        for j in range(1, k):
            num = num + weights[j] * per_tensor[:, j]
        den, ref_d, ref_g = per_tensor[:, k:].unbind(-1)
        rows = torch.stack([num, den, ref_d + ref_g], dim=-1)
    if not per_layer:
        rows = rows.sum(0, keepdim=True)
    rows = scope_sums(rows, dtype)
    return _run_rule(family, rows, numbers, per_layer, variant, lr, weight_decay, lr_ratio, first)


def _width(family: str, n_weights: int) -> int:
    """How many sums each tensor gives :func:`rule_from_sums`."""
    return 3 if family == "momentum" else n_weights + 3


@_rule_from_sums_op.register_fake
def _(
    family,
    sums,
    weights,
    numbers,
    per_layer,
    variant,
    lr,
    weight_decay,
    dtype,
    lr_ratio=1.0,
    first=None,
    terms=None,
    ratio=None,
):  # noqa: ANN001, ANN202, E501
    n_scopes = len(sums) // _width(family, len(weights)) if per_layer else 1
    n_out = 2 if family == "momentum" else 1
    return [sums[0].new_empty((n_scopes,), dtype=dtype) for _ in range(n_out)]


def rule_from_sums(
    fn: Any,
    sums: list[Tensor],
    config: Any,
    dtype: torch.dtype,
    weights: Sequence[float] = (),
    **kwargs: Any,
) -> Any:
    """``fn``'s rule from each tensor's raw sums, as the operator ``amopt::rule_from_sums``.

    The sums are the operator's inputs one by one: the compiler then forms each tensor's
    in one loop (a stack or a scalar expression of them in the graph keeps it from
    fusing some of them). Returns ``fn``'s outputs, one entry per scope.
    """
    family = _family(fn)
    weights = [float(w) for w in weights]
    options = _options(config, kwargs)
    lr_ratio, first, ratio = _extra(kwargs)
    terms = kwargs.get("terms")
    op = _rule_from_sums_op(
        family, list(sums), weights, *options, dtype, lr_ratio, first, terms, ratio
    )
    return _shaped(family, op)


def _options(config: Any, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """``numbers, per_layer, variant, lr, weight_decay``: the rule operators' options."""
    lr, weight_decay = kwargs.get("lr"), float(kwargs.get("weight_decay", 0.0))
    return rule_numbers(config), bool(config.per_layer), config.variant, lr, weight_decay


def _extra(kwargs: dict[str, Any]) -> tuple[float, Tensor | None, Tensor | None]:
    """``lr_ratio, first, ratio``: the rule operators' step-dependent inputs (a tensor
    ``lr_ratio``, r formed by a compiled step's graph, goes as ``ratio``: :func:`ratio_of`)."""
    ratio = kwargs.get("lr_ratio", 1.0)
    if isinstance(ratio, Tensor):
        return 1.0, kwargs.get("first"), ratio
    return float(ratio), kwargs.get("first"), None


def ratio_of(lr_ratio: float, ratio: Tensor | None) -> float:
    r""":math:`r = \eta_{t-1}/\eta_t`: ``lr_ratio``, or, for a step ``torch.compile``
    traced, the 0-d tensor ``ratio`` the graph formed (``amopt.torch._common.hyper_ratio``),
    read when the operator runs: the graph then holds no number that changes with the
    schedule, nor arithmetic of a float the compiler made symbolic (whose guard was seen
    to fail)."""
    if ratio is None:
        return lr_ratio
    return float(ratio)


def _shaped(family: str, outs: list[Tensor]) -> Any:
    """An operator's list of outputs as the rule returns them (a tuple for momentum)."""
    return tuple(outs) if family == "momentum" else outs[0]
