"""The compiled steps' operators: the fused CPU steps of AMSGD and AM-AdamW and the
Triton (CUDA) steps, as ``torch.library`` operators.

``torch.compile`` cannot trace the kernels' ctypes call, nor a Triton step that reads
its tensors through address tables; registered as the operators ``amopt::fused_amsgd_``,
``amopt::fused_am_adamw_``, ``amopt::triton_amsgd_``, ``amopt::triton_am_adamw_`` and
their per-layer ``*_layers_`` forms (mutating the parameters, the state and the step
counters in place, with fake implementations that give the shapes of their outputs)
the call stays inside the compiled graph as one opaque node: no graph break, and the
compiled step runs the same kernels as the eager one. Eagerly the optimizers call the
drivers directly; the operators are only what the compiler sees. Where the fused
kernels cannot run the operators take the foreach path, as the eager step does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from amopt.core import rule as _rule
from amopt.torch._records import (
    AdamHyper,
    AdamTensors,
    Scaler,
    SGDHyper,
    SGDTensors,
    accumulation_dtype,
    real_dtype,
    rule_config_from,
    rule_numbers,
    where_skipped,
)

__all__: list[str] = []

#: The fused CPU steps with their foreach fallback, by name: given by the optimizer
#: modules (``register_driver``), which sit above this one.
_DRIVERS: dict[str, Callable[..., Any]] = {}


#: The operators' library. They are defined with the dispatcher's own API rather than
#: ``torch.library.custom_op``, whose Python layers (an autograd kernel, a version
#: bump per mutated tensor in a Python loop and, on torch 2.11, an aliasing check
#: taking every input tensor's storage) cost more host time per step than the Triton
#: driver itself at a few hundred tensors; what those layers check holds by
#: construction here (the operators return new tensors or nothing, and are not
#: differentiated: optimizer steps run under ``no_grad``).
_LIB = torch.library.Library("amopt", "FRAGMENT")


def _operator(
    name: str, mutates_args: tuple[str, ...], dispatch_key: str
) -> Callable[[Callable[..., Any]], Any]:
    """Define ``amopt::<name>`` from a typed function (its schema as ``custom_op``
    infers it) with that function as its ``dispatch_key`` kernel; the operator's
    ``OpOverload`` stands for the function. The drivers the kernels call increment the
    autograd version counters of the tensors their kernels write, in one call, as
    torch's in-place operators do.
    """

    def define(fn: Callable[..., Any]) -> Any:
        _LIB.define(name + torch.library.infer_schema(fn, mutates_args=mutates_args))
        _LIB.impl(name, fn, dispatch_key)
        return getattr(torch.ops.amopt, name).default

    return define


def _fake(name: str) -> Callable[[Callable[..., Any]], Any]:
    """Register the function as the fake (meta) implementation of ``amopt::<name>``."""
    return torch.library.register_fake(f"amopt::{name}", lib=_LIB)


def register_driver(name: str, driver: Callable[..., Any]) -> None:
    """Give the operator ``amopt::<name>_`` the step it runs."""
    _DRIVERS[name] = driver


def _triton() -> Any:
    from amopt.torch import _triton  # imported when a Triton step runs (needs no triton)

    return _triton


# The operators take the hyper-parameters as plain values: ``numbers`` holds ``lr``,
# ``lr_ratio``, (AM-AdamW: ``beta2, eps``), ``weight_decay`` and the rule's options
# (RULE_FIELDS); a tensor ``lr`` travels as ``lr_tensor`` (0.0 in ``numbers``) and with it
# the previous lr as ``prev_lr_tensor`` (the optimizers' ``_lr_ratio``), both read when
# the step runs, where r is formed from them: no node of the graph.


def _adam_numbers(h: AdamHyper, lr: float, ratio: float) -> list[float]:
    numbers = [float(h.beta2), float(h.eps), float(h.weight_decay), *rule_numbers(h.config)]
    return [lr, ratio, *numbers]


def _sgd_numbers(h: SGDHyper, lr: float, ratio: float) -> list[float]:
    return [lr, ratio, float(h.weight_decay), *rule_numbers(h.config)]


def _host_lr(lr: Tensor) -> float:
    """A tensor ``lr``, read on the host when the operator runs (a scheduler's new value
    needs no new graph). Refused while a CUDA graph is captured
    (``torch.compile(mode="reduce-overhead")``): its replays would keep the value read
    at capture, whatever the scheduler sets."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise ValueError(
            "lr as a Tensor is not supported while a CUDA graph is captured (the AM "
            "kernels take lr as a number, read when the step runs; a replay would keep "
            f"the captured value); got lr={lr!r}; pass a float lr (a new value then "
            "compiles a new graph)"
        )
    return float(lr)


def _adam_hyper(
    numbers: list[float],
    lr_tensor: Tensor | None,
    weight_decay_mode: str,
    maximize: bool,
    per_layer: bool,
    variant: str | None,
    prev_lr_tensor: Tensor | None = None,
) -> AdamHyper:
    lr, ratio, beta2, eps, weight_decay, *rule = numbers
    if lr_tensor is not None:
        lr = _host_lr(lr_tensor)
    if prev_lr_tensor is not None:  # r of the previous lr and this one, read now
        ratio = _rule.lr_ratio(_host_lr(prev_lr_tensor), lr)
    config = rule_config_from(rule, per_layer, variant)
    return AdamHyper(lr, beta2, eps, weight_decay, weight_decay_mode, maximize, config, ratio)


def _sgd_hyper(
    numbers: list[float],
    lr_tensor: Tensor | None,
    maximize: bool,
    per_layer: bool,
    variant: str | None,
    prev_lr_tensor: Tensor | None = None,
) -> SGDHyper:
    lr, ratio, weight_decay, *rule = numbers
    if lr_tensor is not None:
        lr = _host_lr(lr_tensor)
    if prev_lr_tensor is not None:  # r of the previous lr and this one, read now
        ratio = _rule.lr_ratio(_host_lr(prev_lr_tensor), lr)
    config = rule_config_from(rule, per_layer, variant)
    return SGDHyper(lr, weight_decay, maximize, config, ratio)


@_operator(
    "fused_am_adamw_",
    ("params", "exp_avgs", "exp_avg_sqs", "state_steps"),
    "CPU",
)
def _fused_am_adamw_op(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    state_steps: list[Tensor],
    beta1_prods: list[Tensor],
    grad_scale: Tensor | None,
    found_inf: Tensor | None,
    prev_lr_tensor: Tensor | None,
    numbers: list[float],
    weight_decay_mode: str,
    maximize: bool,
    per_layer: bool,
    variant: str | None,
) -> tuple[Tensor, Tensor]:
    """One fused AM-AdamW step; per parameter the beta applied and its scope's product.

    ``numbers``: ``lr, lr_ratio, beta2, eps, weight_decay`` and the rule's ``lam,
    beta_max, beta_min, theta, beta_high, beta_low``.
    """
    h = _adam_hyper(numbers, None, weight_decay_mode, maximize, per_layer, variant, prev_lr_tensor)
    t = AdamTensors(params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods)
    betas, prods = _DRIVERS["fused_am_adamw"](t, h, Scaler(grad_scale, found_inf), None)
    dtype = _dtype(params)
    return torch.stack(betas).to(dtype), torch.stack(prods).to(dtype)


def _dtype(params: list[Tensor]) -> torch.dtype:
    return accumulation_dtype([real_dtype(p) for p in params])


@_operator(
    "fused_amsgd_",
    ("params", "momentum_buffer_list", "state_steps"),
    "CPU",
)
def _fused_amsgd_op(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffer_list: list[Tensor],
    state_steps: list[Tensor],
    grad_scale: Tensor | None,
    found_inf: Tensor | None,
    prev_lr_tensor: Tensor | None,
    numbers: list[float],
    maximize: bool,
    per_layer: bool,
    variant: str | None,
) -> Tensor:
    """One fused AMSGD step; per parameter the beta applied.

    ``numbers``: ``lr, lr_ratio, weight_decay`` and the rule's ``lam, beta_max, beta_min,
    theta, beta_high, beta_low``. Every momentum buffer exists (the optimizer makes it
    ``d = g`` before the first step).
    """
    h = _sgd_hyper(numbers, None, maximize, per_layer, variant, prev_lr_tensor)
    t = SGDTensors(params, grads, list(momentum_buffer_list), state_steps)
    betas = _DRIVERS["fused_amsgd"](t, h, Scaler(grad_scale, found_inf), None)
    return torch.stack(betas).to(_dtype(params))


@_fake("fused_amsgd_")
def _(params, *args):  # noqa: ANN001, ANN002, ANN202
    return params[0].new_empty((len(params),), dtype=_dtype(params))


def fused_amsgd_traced(t: SGDTensors, h: SGDHyper, amp: Scaler) -> list[Tensor]:
    """The fused AMSGD step through the operator (what ``torch.compile`` traces)."""
    c: Any = h.config
    _, prev_lr_tensor, numbers = _rates(h, _sgd_numbers, lr_as_tensor=False)
    betas = _fused_amsgd_op(
        list(t.params),
        list(t.grads),
        list(t.momentum_buffer_list),  # type: ignore[arg-type]
        list(t.state_steps),
        amp.grad_scale,
        amp.found_inf,
        prev_lr_tensor,
        numbers,
        bool(h.maximize),
        bool(c.per_layer),
        c.variant,
    )
    return list(betas.unbind())


@_fake("fused_am_adamw_")
def _(params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods, *args):  # noqa: ANN001, ANN002, ANN202
    n, dtype = len(params), _dtype(params)
    return params[0].new_empty((n,), dtype=dtype), params[0].new_empty((n,), dtype=dtype)


def fused_am_adamw_traced(
    t: AdamTensors, h: AdamHyper, amp: Scaler
) -> tuple[list[Tensor], list[Tensor]]:
    """The fused AM-AdamW step through the operator (what ``torch.compile`` traces)."""
    c: Any = h.config
    _, prev_lr_tensor, numbers = _rates(h, _adam_numbers, lr_as_tensor=False)
    betas, prods = _fused_am_adamw_op(
        list(t.params),
        list(t.grads),
        list(t.exp_avgs),
        list(t.exp_avg_sqs),
        list(t.state_steps),
        list(t.beta1_prods),
        amp.grad_scale,
        amp.found_inf,
        prev_lr_tensor,
        numbers,
        h.weight_decay_mode,
        bool(h.maximize),
        bool(c.per_layer),
        c.variant,
    )
    return list(betas.unbind()), list(prods.unbind())


# --------------------------------------------------------------------------- Triton (GPU)
# The Triton step reads the tensors through tables of their addresses, which no
# compiler pass can see through: registered as opaque operators (not
# ``torch.library.triton_op``, whose kernels Inductor would take to touch only their
# arguments, here the tables), it is one node of the graph with the mutations declared.


@_operator(
    "triton_am_adamw_",
    ("params", "exp_avgs", "exp_avg_sqs", "state_steps"),
    "CompositeExplicitAutograd",
)
def _triton_am_adamw_op(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    state_steps: list[Tensor],
    beta1_prods: list[Tensor],
    grad_scale: Tensor | None,
    found_inf: Tensor | None,
    lr_tensor: Tensor | None,
    prev_lr_tensor: Tensor | None,
    numbers: list[float],
    weight_decay_mode: str,
    maximize: bool,
    per_layer: bool,
    variant: str | None,
) -> tuple[Tensor, Tensor]:
    """One Triton AM-AdamW step; per parameter the beta applied and its scope's product.

    ``numbers`` as in ``amopt::fused_am_adamw_``; ``lr_tensor``, when given, is ``lr``
    (read here, when the step runs, so that a compiled step follows a scheduler).
    """
    h = _adam_hyper(
        numbers, lr_tensor, weight_decay_mode, maximize, per_layer, variant, prev_lr_tensor
    )
    t = AdamTensors(params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods)
    betas, prods = _triton().triton_am_adamw(t, h, Scaler(grad_scale, found_inf))
    dtype = _dtype(params)
    return torch.stack(betas).to(dtype), torch.stack(prods).to(dtype)


@_fake("triton_am_adamw_")
def _(params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods, *args):  # noqa: ANN001, ANN002, ANN202
    n, dtype = len(params), _dtype(params)
    return params[0].new_empty((n,), dtype=dtype), params[0].new_empty((n,), dtype=dtype)


def _lr(lr: Any) -> tuple[Tensor | None, float]:
    """A tensor ``lr`` goes to the operator as a tensor (0.0 in ``numbers``)."""
    if isinstance(lr, Tensor):
        return lr.reshape(()), 0.0
    return None, float(lr)


def _rates(
    h: Any, numbers_of: Callable[..., list[float]], *, lr_as_tensor: bool = True
) -> tuple[Tensor | None, Tensor | None, list[float]]:
    """``lr_tensor, prev_lr_tensor, numbers`` of an operator's call: a tensor ``lr`` as a
    tensor where the operator takes one (the Triton ones; the fused CPU ones take it as a
    number), the previous lr's tensor (:func:`_prev_lr`), and ``numbers_of(h, lr, r)``."""
    lr_tensor, lr = _lr(h.lr) if lr_as_tensor else (None, float(h.lr))
    prev_lr_tensor, ratio = _prev_lr(h.lr_ratio)
    return lr_tensor, prev_lr_tensor, numbers_of(h, lr, ratio)


def _prev_lr(ratio: Any) -> tuple[Tensor | None, float]:
    """A tensor ``lr_ratio`` (the previous lr of a compiled step: ``hyper_ratio``) goes
    to the operator as it is (read there with ``float``), a number in ``numbers``."""
    if isinstance(ratio, Tensor):
        return ratio, 0.0
    return None, float(ratio)


def triton_am_adamw_traced(
    t: AdamTensors, h: AdamHyper, amp: Scaler
) -> tuple[list[Tensor], list[Tensor]]:
    """The Triton AM-AdamW step through the operator (what ``torch.compile`` traces)."""
    c: Any = h.config
    lr_tensor, prev_lr_tensor, numbers = _rates(h, _adam_numbers)
    betas, prods = _triton_am_adamw_op(
        list(t.params),
        list(t.grads),
        list(t.exp_avgs),
        list(t.exp_avg_sqs),
        list(t.state_steps),
        list(t.beta1_prods),
        amp.grad_scale,
        amp.found_inf,
        lr_tensor,
        prev_lr_tensor,
        numbers,
        h.weight_decay_mode,
        bool(h.maximize),
        bool(c.per_layer),
        c.variant,
    )
    return list(betas.unbind()), list(prods.unbind())


@_operator(
    "triton_amsgd_",
    ("params", "momentum_buffer_list", "state_steps"),
    "CompositeExplicitAutograd",
)
def _triton_amsgd_op(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffer_list: list[Tensor],
    state_steps: list[Tensor],
    grad_scale: Tensor | None,
    found_inf: Tensor | None,
    lr_tensor: Tensor | None,
    prev_lr_tensor: Tensor | None,
    numbers: list[float],
    maximize: bool,
    per_layer: bool,
    variant: str | None,
) -> Tensor:
    """One Triton AMSGD step; per parameter the beta applied (``numbers`` as in
    ``amopt::fused_amsgd_``, ``lr_tensor`` as in ``amopt::triton_am_adamw_``). Every
    momentum buffer exists."""
    h = _sgd_hyper(numbers, lr_tensor, maximize, per_layer, variant, prev_lr_tensor)
    t = SGDTensors(params, grads, list(momentum_buffer_list), state_steps)
    betas = _triton().triton_amsgd(t, h, Scaler(grad_scale, found_inf))
    return torch.stack(betas).to(_dtype(params))


@_fake("triton_amsgd_")
def _(params, *args):  # noqa: ANN001, ANN002, ANN202
    return params[0].new_empty((len(params),), dtype=_dtype(params))


def triton_amsgd_traced(t: SGDTensors, h: SGDHyper, amp: Scaler) -> list[Tensor]:
    """The Triton AMSGD step through the operator (what ``torch.compile`` traces)."""
    c: Any = h.config
    lr_tensor, prev_lr_tensor, numbers = _rates(h, _sgd_numbers)
    betas = _triton_amsgd_op(
        list(t.params),
        list(t.grads),
        list(t.momentum_buffer_list),  # type: ignore[arg-type]
        list(t.state_steps),
        amp.grad_scale,
        amp.found_inf,
        lr_tensor,
        prev_lr_tensor,
        numbers,
        bool(h.maximize),
        bool(c.per_layer),
        c.variant,
    )
    return list(betas.unbind())


# --------------------------------------------------------------------------- Triton, per layer
# A compiled per-layer step writes each parameter's beta (and AM-AdamW's product) into
# the optimizer's state entries inside the operator: an operator returning them would
# leave the graph one output per parameter to unbind and copy back.


def layers_op_applies(group: dict[str, Any], params: list[Tensor], process_group: Any) -> bool:
    """Whether a compiled Triton step of ``group`` goes through a ``*_layers_`` operator:
    a per-layer scope of plain (not sharded) tensors."""
    if not group["per_layer"] or process_group is not None:
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - builds without torch.distributed
        return True
    return not any(isinstance(p, DTensor) for p in params)


def _store(olds: list[Tensor], news: list[Tensor], found_inf: Tensor | None) -> None:
    """``olds[i] <- news[i]`` in one multi-tensor copy; kept where ``found_inf`` is nonzero."""
    if found_inf is not None:
        keep = found_inf.reshape(()) != 0
        news = [new.to(old.dtype) for old, new in zip(olds, news, strict=True)]
        news = where_skipped(lambda device: keep.to(device), olds, news)
    torch._foreach_copy_(olds, news)


@_operator(
    "triton_am_adamw_layers_",
    ("params", "exp_avgs", "exp_avg_sqs", "state_steps", "beta1_prods", "betas"),
    "CompositeExplicitAutograd",
)
def _triton_am_adamw_layers_op(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    state_steps: list[Tensor],
    beta1_prods: list[Tensor],
    betas: list[Tensor],
    grad_scale: Tensor | None,
    found_inf: Tensor | None,
    lr_tensor: Tensor | None,
    prev_lr_tensor: Tensor | None,
    numbers: list[float],
    weight_decay_mode: str,
    maximize: bool,
    variant: str | None,
) -> None:
    """``amopt::triton_am_adamw_`` with a per-layer scope that stores, per parameter,
    the beta applied into ``betas`` (the old one kept on a skipped step) and the new
    product into ``beta1_prods`` (one 0-d tensor each)."""
    h = _adam_hyper(numbers, lr_tensor, weight_decay_mode, maximize, True, variant, prev_lr_tensor)
    t = AdamTensors(params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods)
    new_betas, new_prods = _triton().triton_am_adamw(t, h, Scaler(grad_scale, found_inf))
    _store(betas, new_betas, found_inf)
    _store(beta1_prods, new_prods, None)  # the driver keeps the old ones on a skipped step


@_fake("triton_am_adamw_layers_")
def _(*args):  # noqa: ANN002, ANN202
    return None


def triton_am_adamw_layers_traced(
    t: AdamTensors, h: AdamHyper, amp: Scaler, betas: list[Tensor]
) -> None:
    """The per-layer Triton AM-AdamW step through the operator, the betas and products
    stored into the state tensors ``betas`` and ``t.beta1_prods``."""
    c: Any = h.config
    lr_tensor, prev_lr_tensor, numbers = _rates(h, _adam_numbers)
    _triton_am_adamw_layers_op(
        list(t.params),
        list(t.grads),
        list(t.exp_avgs),
        list(t.exp_avg_sqs),
        list(t.state_steps),
        list(t.beta1_prods),
        list(betas),
        amp.grad_scale,
        amp.found_inf,
        lr_tensor,
        prev_lr_tensor,
        numbers,
        h.weight_decay_mode,
        bool(h.maximize),
        c.variant,
    )


@_operator(
    "triton_amsgd_layers_",
    ("params", "momentum_buffer_list", "state_steps", "betas"),
    "CompositeExplicitAutograd",
)
def _triton_amsgd_layers_op(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffer_list: list[Tensor],
    state_steps: list[Tensor],
    betas: list[Tensor],
    grad_scale: Tensor | None,
    found_inf: Tensor | None,
    lr_tensor: Tensor | None,
    prev_lr_tensor: Tensor | None,
    numbers: list[float],
    maximize: bool,
    variant: str | None,
) -> None:
    """``amopt::triton_amsgd_`` with a per-layer scope that stores each parameter's beta
    into ``betas`` (the old one kept on a skipped step). Every momentum buffer exists."""
    h = _sgd_hyper(numbers, lr_tensor, maximize, True, variant, prev_lr_tensor)
    t = SGDTensors(params, grads, list(momentum_buffer_list), state_steps)
    new_betas = _triton().triton_amsgd(t, h, Scaler(grad_scale, found_inf))
    _store(betas, new_betas, found_inf)


@_fake("triton_amsgd_layers_")
def _(*args):  # noqa: ANN002, ANN202
    return None


def triton_amsgd_layers_traced(
    t: SGDTensors, h: SGDHyper, amp: Scaler, betas: list[Tensor]
) -> None:
    """The per-layer Triton AMSGD step through the operator, the betas stored into the
    state tensors ``betas``."""
    c: Any = h.config
    lr_tensor, prev_lr_tensor, numbers = _rates(h, _sgd_numbers)
    _triton_amsgd_layers_op(
        list(t.params),
        list(t.grads),
        list(t.momentum_buffer_list),  # type: ignore[arg-type]
        list(t.state_steps),
        list(betas),
        amp.grad_scale,
        amp.found_inf,
        lr_tensor,
        prev_lr_tensor,
        numbers,
        bool(h.maximize),
        c.variant,
    )
