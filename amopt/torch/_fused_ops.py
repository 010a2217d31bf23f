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
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import Tensor

from amopt.core import rule as _rule
from amopt.torch._records import (
    AdamHyper,
    AdamTensors,
    Scaler,
    SGDHyper,
    SGDTensors,
    compute_dtype,
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


class Family(NamedTuple):
    """What the operators of an optimizer family take and give: the rest follows.

    An operator's arguments are the family's tensor lists (``tensors``' fields, those in
    ``mutated`` written in place), ``grad_scale, found_inf``, (Triton: ``lr_tensor``),
    ``prev_lr_tensor``, ``numbers`` (``lr, lr_ratio``, the hyper-parameters named in
    ``numbers``, the rule's options of ``RULE_FIELDS``), the string ``options``,
    ``maximize``, ``per_layer`` and ``variant``. It returns the beta applied to each
    parameter, stacked, and with ``products`` the new entries of that list too.
    """

    name: str
    tensors: type
    mutated: tuple[str, ...]
    hyper: type
    numbers: tuple[str, ...]
    options: tuple[str, ...] = ()
    products: str | None = None


SGD = Family(
    "amsgd", SGDTensors, ("params", "momentum_buffer_list", "state_steps"), SGDHyper,
    ("weight_decay",),
)  # fmt: skip
ADAM = Family(
    "am_adamw", AdamTensors, ("params", "exp_avgs", "exp_avg_sqs", "state_steps"), AdamHyper,
    ("beta2", "eps", "weight_decay"), ("weight_decay_mode",), "beta1_prods",
)  # fmt: skip


def register_driver(name: str, driver: Callable[..., Any]) -> None:
    """Give the operator ``amopt::<name>_`` the step it runs."""
    _DRIVERS[name] = driver


def _triton() -> Any:
    from amopt.torch import _triton  # imported when a Triton step runs (needs no triton)

    return _triton


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


def hyper(family: Family, numbers: list[float], lr_tensor: Tensor | None, *flags: Any) -> Any:
    """The hyper-parameters record of ``family`` from an operator's arguments.

    ``flags``: the family's string options, ``maximize, per_layer, variant`` and, last,
    an optional ``prev_lr_tensor``. A tensor ``lr`` (``lr_tensor``) and the previous lr
    are read now, and r formed from them.
    """
    k = len(family.options)
    options, (maximize, per_layer, variant, *rest) = flags[:k], flags[k:]
    lr, ratio, *values = numbers
    if lr_tensor is not None:
        lr = _host_lr(lr_tensor)
    if rest and rest[0] is not None:  # r of the previous lr and this one, read now
        ratio = _rule.lr_ratio(_host_lr(rest[0]), lr)
    n = len(family.numbers)
    config = rule_config_from(values[n:], per_layer, variant)
    return family.hyper(
        lr=lr,
        maximize=maximize,
        config=config,
        lr_ratio=ratio,
        **dict(zip(family.numbers, values[:n], strict=True)),
        **dict(zip(family.options, options, strict=True)),
    )


_sgd_hyper = partial(hyper, SGD)
_adam_hyper = partial(hyper, ADAM)


def _dtype(params: list[Tensor]) -> torch.dtype:
    return compute_dtype([real_dtype(p) for p in params])


def _store(olds: list[Tensor], news: list[Tensor], found_inf: Tensor | None) -> None:
    """``olds[i] <- news[i]`` in one multi-tensor copy; kept where ``found_inf`` is nonzero."""
    if found_inf is not None:
        keep = found_inf.reshape(()) != 0
        news = [new.to(old.dtype) for old, new in zip(olds, news, strict=True)]
        news = where_skipped(lambda device: keep.to(device), olds, news)
    torch._foreach_copy_(olds, news)


def _schema(family: Family, lr_tensor: bool, layers: bool) -> str:
    """The operator's schema (as ``torch.library.infer_schema`` writes it)."""
    lists = [*family.tensors._fields, *(["betas"] if layers else [])]
    written = {*family.mutated, *((family.products, "betas") if layers else ())}
    args = [
        f"Tensor(a{i}!)[] {f}" if f in written else f"Tensor[] {f}" for i, f in enumerate(lists)
    ]
    args += ["Tensor? grad_scale", "Tensor? found_inf"]
    args += ["Tensor? lr_tensor"] if lr_tensor else []
    args += ["Tensor? prev_lr_tensor", "float[] numbers", *(f"str {o}" for o in family.options)]
    args += ["bool maximize", *([] if layers else ["bool per_layer"]), "str? variant"]
    out = "()" if layers else "(Tensor, Tensor)" if family.products else "Tensor"
    return f"({', '.join(args)}) -> {out}"


#: The traced wrappers of the operators, by family name, kind and ``layers``.
_TRACED: dict[tuple[str, str, bool], Callable[..., Any]] = {}


def traced(family: Family, kind: str, layers: bool = False) -> Callable[..., Any]:
    """The function a step calls to run ``family``'s ``kind`` operator (:func:`_step_operator`)."""
    return _TRACED[family.name, kind, layers]


def _step_operator(family: Family, kind: str, layers: bool = False) -> tuple[Any, Any]:
    """Define ``amopt::<kind>_<family>_`` (``..._layers_`` with ``layers``): one step of
    the fused CPU kernels (``kind="fused"``, the driver given by ``register_driver``) or
    of the Triton ones (``"triton"``), as an operator with its fake implementation.

    A ``*_layers_`` operator takes a per-layer scope and stores each parameter's beta into
    the 0-d tensors of its extra list ``betas`` (the old one kept on a skipped step) and
    the products into theirs, returning nothing: returned, they would leave the graph one
    output per parameter to unbind and copy back.

    Returns the operator (its ``OpOverload``) and the function a step calls to run it,
    ``traced(t, h, amp)`` (``traced(t, h, amp, betas)`` for ``layers``), which returns
    what the driver does.
    """
    name = f"{kind}_{family.name}{'_layers' if layers else ''}_"
    lr_tensor = kind == "triton"  # the fused CPU operators take lr as a number
    n_lists = len(family.tensors._fields)
    k = len(family.options)

    def kernel(*args: Any) -> Any:
        lists, rest = [list(a) for a in args[: n_lists + layers]], list(args[n_lists + layers :])
        grad_scale, found_inf, *rest = rest
        lr_t = rest.pop(0) if lr_tensor else None
        prev_lr_tensor, numbers, *flags = rest
        if layers:  # a per-layer scope by construction
            flags.insert(k + 1, True)
        h = hyper(family, numbers, lr_t, *flags, prev_lr_tensor)
        t = family.tensors(*lists[:n_lists])
        amp = Scaler(grad_scale, found_inf)
        if kind == "fused":
            out = _DRIVERS[f"fused_{family.name}"](t, h, amp, None)
        else:
            out = getattr(_triton(), f"triton_{family.name}")(t, h, amp)
        betas, prods = out if family.products else (out, None)
        if layers:
            _store(lists[n_lists], betas, found_inf)
            if family.products:  # the driver keeps the old ones on a skipped step
                _store(getattr(t, family.products), prods, None)
            return None
        dtype = _dtype(lists[0])
        if family.products:
            return torch.stack(betas).to(dtype), torch.stack(prods).to(dtype)
        return torch.stack(betas).to(dtype)

    def fake(params: list[Tensor], *args: Any) -> Any:
        if layers:
            return None
        n, dtype = len(params), _dtype(params)
        if family.products:
            return params[0].new_empty((n,), dtype=dtype), params[0].new_empty((n,), dtype=dtype)
        return params[0].new_empty((n,), dtype=dtype)

    _LIB.define(name + _schema(family, lr_tensor, layers))
    _LIB.impl(name, kernel, "CPU" if kind == "fused" else "CompositeExplicitAutograd")
    torch.library.register_fake(f"amopt::{name}", lib=_LIB)(fake)
    op = getattr(torch.ops.amopt, name).default

    def traced(t: Any, h: Any, amp: Scaler, betas: list[Tensor] | None = None) -> Any:
        c: Any = h.config
        lr_t, prev_lr_tensor, numbers = _rates(h, family, lr_as_tensor=lr_tensor)
        args: list[Any] = [list(ts) for ts in t]
        if layers:
            args.append(list(betas))  # type: ignore[arg-type]
        args += [amp.grad_scale, amp.found_inf, *([lr_t] if lr_tensor else [])]
        args += [prev_lr_tensor, numbers, *[getattr(h, o) for o in family.options]]
        args += [bool(h.maximize), *([] if layers else [bool(c.per_layer)]), c.variant]
        out = op(*args)
        if layers:
            return None
        if family.products:
            return list(out[0].unbind()), list(out[1].unbind())
        return list(out.unbind())

    _TRACED[family.name, kind, layers] = traced
    traced.__name__ = traced.__qualname__ = f"{name[:-1]}_traced"
    traced.__doc__ = f"One step through ``amopt::{name}`` (what ``torch.compile`` traces)."
    return op, traced


# The operators take the hyper-parameters as plain values: ``numbers`` holds ``lr``,
# ``lr_ratio``, the family's numbers (AMSGD: ``weight_decay``; AM-AdamW: ``beta2, eps,
# weight_decay``) and the rule's options (RULE_FIELDS); a tensor ``lr`` travels as
# ``lr_tensor`` (0.0 in ``numbers``) and with it the previous lr as ``prev_lr_tensor``
# (the optimizers' ``_lr_ratio``), both read when the step runs, where r is formed from
# them: no node of the graph.


def _lr(lr: Any) -> tuple[Tensor | None, float]:
    """A tensor ``lr`` goes to the operator as a tensor (0.0 in ``numbers``)."""
    if isinstance(lr, Tensor):
        return lr.reshape(()), 0.0
    return None, float(lr)


def _rates(
    h: Any, family: Family, *, lr_as_tensor: bool = True
) -> tuple[Tensor | None, Tensor | None, list[float]]:
    """``lr_tensor, prev_lr_tensor, numbers`` of an operator's call: a tensor ``lr`` as a
    tensor where the operator takes one (the Triton ones; the fused CPU ones take it as a
    number), the previous lr's tensor (:func:`_prev_lr`), and the numbers."""
    lr_tensor, lr = _lr(h.lr) if lr_as_tensor else (None, float(h.lr))
    prev_lr_tensor, ratio = _prev_lr(h.lr_ratio)
    values = [float(getattr(h, f)) for f in family.numbers]
    return lr_tensor, prev_lr_tensor, [lr, ratio, *values, *rule_numbers(h.config)]


def _prev_lr(ratio: Any) -> tuple[Tensor | None, float]:
    """A tensor ``lr_ratio`` (the previous lr of a compiled step: ``hyper_ratio``) goes
    to the operator as it is (read there with ``float``), a number in ``numbers``."""
    if isinstance(ratio, Tensor):
        return ratio, 0.0
    return None, float(ratio)


_fused_amsgd_op, fused_amsgd_traced = _step_operator(SGD, "fused")
_fused_am_adamw_op, fused_am_adamw_traced = _step_operator(ADAM, "fused")
# The Triton step reads the tensors through tables of their addresses, which no compiler
# pass can see through: registered as opaque operators (not ``torch.library.triton_op``,
# whose kernels Inductor would take to touch only their arguments, here the tables), it is
# one node of the graph with the mutations declared.
_triton_amsgd_op, triton_amsgd_traced = _step_operator(SGD, "triton")
_triton_am_adamw_op, triton_am_adamw_traced = _step_operator(ADAM, "triton")
_triton_amsgd_layers_op, triton_amsgd_layers_traced = _step_operator(SGD, "triton", True)
_triton_am_adamw_layers_op, triton_am_adamw_layers_traced = _step_operator(ADAM, "triton", True)


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
