r"""Records shared by every implementation of the AM optimizers' steps.

The bottom of ``amopt.torch``: the lists and hyper-parameters a step takes, the
gradient scaler's protocol, the dtype rules and the rule's options as plain values (what
the ``torch.library`` operators take). The drivers (``_fused``, ``_triton``,
``_fused_ops``, ``_traced_ops``) and the optimizer classes import them from here;
nothing here imports another module of the package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from amopt.core.config import AMConfig

__all__ = [
    "NO_SCALER",
    "AdamHyper",
    "AdamTensors",
    "FusedFallbackWarning",
    "SGDHyper",
    "SGDTensors",
    "Sharded",
    "Scaler",
    "compute_dtype",
    "as_real",
    "kept_copy",
    "kept_empty",
    "staged",
    "real_dtype",
    "rule_config_from",
    "rule_numbers",
    "scope_sums",
    "where_skipped",
    "wide_dtype",
]


#: One side stream per CUDA device, current while memory kept past a step is allocated
#: during a capture (:func:`kept_empty`); no kernel runs on it.
_SIDE_STREAMS: dict[int, Any] = {}
#: The thread that allocates memory kept past a step outside captures (:func:`kept_empty`).
_ALLOCATOR: list[Any] = []


def _side_stream(index: int) -> Any:
    stream = _SIDE_STREAMS.get(index)
    if stream is None:
        stream = _SIDE_STREAMS.setdefault(index, torch.cuda.Stream(device=index))
    return stream


def _allocator_thread() -> Any:
    if not _ALLOCATOR:
        from concurrent.futures import ThreadPoolExecutor

        _ALLOCATOR.append(ThreadPoolExecutor(1, thread_name_prefix="amopt-kept-memory"))
    return _ALLOCATOR[0]


def kept_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)`` for memory kept past the step
    that makes it (address tables, layouts, scratch that plans keep), from torch's own
    CUDA memory pool.

    ``torch.compile(mode="reduce-overhead")`` warms a step up with every allocation of
    the thread routed to its CUDA graphs' private pool, and records it with those of the
    capturing stream routed there; a CUDA graph captured by hand routes the capturing
    stream's. A graph pool refuses memory that outlives the graph's run untracked
    ("tensor(s) in the cudagraph pool not tracked as outputs"), so on CUDA this memory
    is allocated with a side stream current while the current stream captures, and by
    another thread otherwise. It is marked as used by the current stream (freed only
    after that stream's work on it), where the copies and kernels that use it run.
    """
    if device.type != "cuda":
        return torch.empty(shape, dtype=dtype, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if torch.cuda.is_current_stream_capturing():
        with torch.cuda.stream(_side_stream(index)):
            out = torch.empty(shape, dtype=dtype, device=device)
    else:

        def allocate() -> Tensor:
            with torch.cuda.device(index):
                return torch.empty(shape, dtype=dtype, device=device)

        out = _allocator_thread().submit(allocate).result()
    out.record_stream(torch.cuda.current_stream(index))
    return out


#: Page-locked host copies made while a CUDA graph was captured, kept for the process:
#: the graph replays the copy from that host memory (:func:`staged`).
_CAPTURED_HOST: list[Tensor] = []


def staged(host: Tensor) -> Tensor:
    """``host`` in page-locked memory, the source of an asynchronous host-to-device copy.

    The memory comes from torch's caching host allocator, which does not hand it out
    again before the copy from it has run. Where the current stream captures a CUDA
    graph the graph replays the copy from this memory, so it is kept for the process.
    """
    out = host.pin_memory()
    if torch.cuda.is_current_stream_capturing():
        _CAPTURED_HOST.append(out)
    return out


def kept_copy(host: Tensor, device: torch.device) -> Tensor:
    """``host`` (a small table made on the host) on ``device``, in memory kept past the
    step (:func:`kept_empty`), copied asynchronously on the current stream from
    page-locked memory (:func:`staged`): the host does not wait for the device."""
    if device.type != "cuda":
        return host.to(device)
    out = kept_empty(tuple(host.shape), host.dtype, device)
    out.copy_(staged(host), non_blocking=True)
    return out


class FusedFallbackWarning(UserWarning):
    """``fused=True`` could not use the fused kernels; the foreach implementation ran instead."""


class SGDTensors(NamedTuple):
    """The lists an AMSGD step reads and updates, aligned by parameter."""

    params: list[Tensor]
    grads: list[Tensor]
    momentum_buffer_list: list[Tensor | None]
    state_steps: list[Tensor]


class SGDHyper(NamedTuple):
    """The hyper-parameters every implementation of an AMSGD step takes."""

    lr: float
    weight_decay: float
    maximize: bool
    config: AMConfig
    #: ``r = lr_{t-1} / lr_t`` of the linearised numerator (``amopt.core.rule.lr_ratio``)
    lr_ratio: float = 1.0


class AdamTensors(NamedTuple):
    """The lists an AM-Adam(W) step reads and updates, aligned by parameter."""

    params: list[Tensor]
    grads: list[Tensor]
    exp_avgs: list[Tensor]
    exp_avg_sqs: list[Tensor]
    state_steps: list[Tensor]
    beta1_prods: list[Tensor]


class AdamHyper(NamedTuple):
    """The hyper-parameters every implementation of an AM-Adam(W) step takes."""

    lr: float
    beta2: float
    eps: float
    weight_decay: float
    weight_decay_mode: str
    maximize: bool
    config: AMConfig
    #: ``r = lr_{t-1} / lr_t`` of the linearised numerator (``amopt.core.rule.lr_ratio``)
    lr_ratio: float = 1.0


class Scaler(NamedTuple):
    """``torch.amp.GradScaler``'s fused protocol: gradients times ``grad_scale``; skip
    the step where ``found_inf`` is non-zero."""

    grad_scale: Tensor | None = None
    found_inf: Tensor | None = None


#: No gradient scaler.
NO_SCALER = Scaler()


def compute_dtype(dtypes: Iterable[torch.dtype]) -> torch.dtype:
    """The dtype a scope's rule and the elementwise updates compute in, and beta is kept
    in: float64 if any of ``dtypes`` is float64, else float32 (half precision is
    promoted), as :func:`amopt.core.reduce.compute_dtype` for one array. Not the dtype
    the sums of squares are formed in: that is :func:`wide_dtype` (float64 wherever the
    device has it)."""
    return torch.float64 if any(dt == torch.float64 for dt in dtypes) else torch.float32


def real_dtype(t: Tensor) -> torch.dtype:
    """The dtype of ``t`` seen as real numbers (``complex128 -> float64``)."""
    return t.real.dtype if torch.is_complex(t) else t.dtype


def as_real(t: Tensor) -> Tensor:
    return torch.view_as_real(t) if torch.is_complex(t) else t


#: The rule's numeric options, in the order the operators take them in ``numbers``.
RULE_FIELDS = ("lam", "beta_max", "beta_min", "theta", "beta_high", "beta_low")


def rule_config_from(numbers: list[float], per_layer: bool, variant: str | None) -> AMConfig:
    """The :class:`~amopt.core.config.AMConfig` an operator was given as plain values."""
    options = dict(zip(RULE_FIELDS, numbers, strict=True))
    return AMConfig.cached(numerator="linear", per_layer=per_layer, variant=variant, **options)


def rule_numbers(config: AMConfig) -> list[float]:
    """The numeric options of ``config`` in the order of :data:`RULE_FIELDS`."""
    return [float(getattr(config, name)) for name in RULE_FIELDS]


def wide_dtype(device: torch.device) -> torch.dtype:
    """The dtype sums of squares are formed in: float64 wherever the device has it.

    The beta rules depend on ratios of a scope's sums only, but the squares summed are
    not scale-free: in float32 (and bfloat16, whose range is float32's) ``g * g``
    underflows for ``|g|`` below about 1e-19 and overflows above about 1e19, and beta
    would then be reset to 0. Squared in float64 they keep the whole range of the
    data; :func:`scope_sums` brings them back to the scope's dtype.
    Apple MPS has no float64: there the squares stay in float32.
    """
    return torch.float32 if device.type == "mps" else torch.float64


def scope_sums(sums: Tensor, dtype: torch.dtype) -> Tensor:
    """Sums of scopes, formed in a wider dtype, as the rule's input in the scope ``dtype``.

    Each scope's row (last axis) is first divided by the power of two that brings its
    largest entry into ``[0.5, 1)``: exact, and the rules (linearised numerators) depend
    only on ratios of a scope's sums (``num / den`` and ``den / ref``), so beta is
    that of the unscaled sums, now without the underflow or overflow a plain cast of
    ``1e-50`` or ``1e50`` to float32 would give. Zero and non-finite rows are left as
    they are (the rule's guard handles them). A no-op when the dtypes agree.
    """
    if sums.dtype == dtype:
        return sums
    _, exponent = torch.frexp(sums.abs().amax(dim=-1, keepdim=True))
    return torch.ldexp(sums, -exponent).to(dtype)


def where_skipped(
    skip: Callable[[torch.device], Tensor],
    olds: Sequence[Tensor | None],
    news: Sequence[Tensor],
) -> list[Tensor]:
    """``where(skip, old, new)`` for each pair (0 for a missing ``old``), in the ``new``
    values' dtypes and devices.

    ``skip(device)``: the step's 0-d boolean "skipped" flag on ``device`` (a
    ``GradScaler``'s ``found_inf > 0``). One-element values (the 0-d state entries of
    every parameter) are blended a dtype and device at a time: two stacks and one
    ``where`` for the lot, not an operation per parameter; other values one by one.
    """
    out = list(news)
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, (old, new) in enumerate(zip(olds, news, strict=True)):
        if old is not None and new.dim() == 0 and old.numel() == 1:
            groups.setdefault((new.dtype, new.device), []).append(i)
        else:
            keep = torch.zeros_like(new) if old is None else old.to(new.device, new.dtype)
            out[i] = torch.where(skip(new.device), keep, new)
    for (dtype, device), rows in groups.items():
        kept = torch.stack([olds[i].reshape(()).to(device, dtype) for i in rows])  # type: ignore[union-attr]
        fresh = torch.stack([news[i] for i in rows])
        for i, value in zip(rows, torch.where(skip(device), kept, fresh).unbind(), strict=True):
            out[i] = value
    return out


class Sharded(NamedTuple):
    """How a planned step of a sharded group reaches its local tensors.

    Built by ``amopt.torch._distributed.plan_locals`` after the group's first step, kept
    by the Triton driver's ``GroupPlan``. ``local_params``, ``local_grads``,
    ``local_buffers``: the local tensors of that step (the buffers one list per state);
    ``sync``: the group's ``ScopeSync`` (``None`` where no scope has pieces on other
    ranks); ``local_of_grads(params, grads)``: a later step's local gradients (raising
    ``TypeError`` or ``ValueError`` where one is not laid out as its parameter);
    ``local_of_param(p)``: the tensor holding ``p``'s local piece, whose address is
    checked at every step.
    """

    local_params: list[Tensor]
    local_grads: list[Tensor]
    local_buffers: list[list[Tensor]]
    sync: Any
    local_of_grads: Callable[[list[Tensor], list[Tensor]], list[Tensor]]
    local_of_param: Callable[[Tensor], Tensor]
