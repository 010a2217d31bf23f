"""Pieces shared by the AM torch optimizers: validation, dtypes, reductions, the base class.

The beta rules themselves live in :mod:`amopt.core.rule` (one implementation for every
surface); everything here works on tensors that stay on their device, so that no
value is read back to the host while an optimizer steps. Also here: the choice of
the implementation a param group runs (:func:`default_path`) and the GradScaler
protocol (:func:`unscale`, :class:`InfSkip`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import warnings
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from amopt import backends
from amopt.core import rule as _rule
from amopt.core.config import AMConfig, check_betas, check_bool, check_interval, check_nonnegative
from amopt.torch import _eager, _fused, _traced_ops
from amopt.torch._records import (
    FusedFallbackWarning,
    compute_dtype,
    kept_copy,
    real_dtype,
    where_skipped,
)

__all__: list[str] = []

#: Per-parameter state entries kept in the compute dtype (never cast to the param dtype).
SCALAR_STATE_KEYS = ("beta", "beta1_prod")

#: The per-parameter state entries of the AM optimizers: one optimizer refuses another's
#: (``AMOptimizerBase.load_state_dict``).
AM_STATE_KEYS = frozenset(
    {"step", "beta", "momentum_buffer", "exp_avg", "exp_avg_sq", "beta1_prod"}
)

#: The implementations of a step: the readable reference, ``torch._foreach_*``, the
#: fused C kernels of :mod:`amopt.torch._fused` (CPU) and the Triton kernels (CUDA).
PATHS = ("single", "foreach", "fused", "triton")

_NO_CAPTURABLE = "the AM optimizers have no capturable mode"
_NO_TENSOR_CAPTURABLE = (
    "the AM beta rule takes lr and betas as numbers, and reading a tensor's value would "
    "synchronise with the device at every step"
)


# --------------------------------------------------------------------------- validation

#: ``torch.optim``'s words for the checks it makes too (those of ``Adam``, ``AdamW`` and
#: ``SGD``): a message starts with them, so that code and tests written against torch's
#: errors match, and goes on with what is allowed.
TORCH_WORDS = {
    "lr": "Invalid learning rate",
    "eps": "Invalid epsilon value",
    "weight_decay": "Invalid weight_decay value",
    "momentum": "Invalid momentum value",
    "betas[0]": "Invalid beta parameter at index 0",
    "betas[1]": "Invalid beta parameter at index 1",
}


def torch_worded(
    check: Callable[..., Any], name: str, value: Any, *args: Any, **kwargs: Any
) -> Any:
    """``check(name, value, ...)``, its ``ValueError`` opened with torch's words for ``name``.

    >>> from amopt.core.config import check_nonnegative
    >>> torch_worded(check_nonnegative, "lr", -0.01)
    Traceback (most recent call last):
    ...
    ValueError: Invalid learning rate: -0.01; lr must be a finite number >= 0; got lr=-0.01
    """
    try:
        return check(name, value, *args, **kwargs)
    except ValueError as exc:
        raise ValueError(f"{TORCH_WORDS[name]}: {value}; {exc}") from None


def as_float(value: Any) -> Any:
    """A 1-element tensor hyper-parameter as a Python float; anything else unchanged.

    Tensor ``lr`` and ``betas`` are accepted where ``torch.optim.Adam`` accepts them;
    the AM rule configuration and the elementwise kernels take them as numbers, read
    when a step starts (as ``torch.optim``'s for-loop implementation reads a tensor lr).
    """
    return value.item() if isinstance(value, Tensor) else value


def _scalar_tensor(value: Tensor) -> Tensor:
    return value.reshape(()) if value.dim() != 0 and value.numel() == 1 else value


def check_lr(value: Any, *, foreach: bool | None = None, capturable: bool = False) -> float:
    """``lr``: a finite real number >= 0, or a 1-element tensor holding one.

    As in ``torch.optim.Adam``, a tensor lr with ``foreach=True`` is a ``ValueError``
    (there it needs ``capturable=True``, which the AM optimizers do not have). With
    ``capturable=True`` a tensor lr is refused too: its value would be read on the host.
    """
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"Tensor lr must be 1-element; got lr={value!r} with {value.numel()} elements"
            )
        if capturable:
            raise ValueError(
                f"lr as a Tensor is not supported with capturable=True ({_NO_TENSOR_CAPTURABLE}); "
                f"got lr={value!r}; pass a float lr"
            )
        if foreach:
            raise ValueError(
                "lr as a Tensor is not supported for capturable=False and foreach=True "
                f"({_NO_CAPTURABLE}); got lr={value!r}, foreach=True; pass a float lr or "
                "leave foreach unset"
            )
        return torch_worded(check_nonnegative, "lr", value.item())
    return torch_worded(check_nonnegative, "lr", value)


def check_tensor_betas(
    value: Any, *, foreach: bool | None = None, capturable: bool = False
) -> tuple[float, float]:
    """``betas`` of the Adam family: two numbers in ``[0, 1)``, or two 1-element tensors.

    The rules of ``torch.optim.Adam``: both floats or both tensors, each tensor of one
    element, and tensors not with ``foreach=True``. Returns the values as floats.
    """
    try:
        b1, b2 = value
    except (TypeError, ValueError):
        return check_betas("betas", value)  # raises the message for a malformed pair
    is_tensor = (isinstance(b1, Tensor), isinstance(b2, Tensor))
    if is_tensor[0] != is_tensor[1]:
        raise ValueError(f"betas must be either both floats or both Tensors; got betas={value!r}")
    if is_tensor[0]:
        for k, b in enumerate((b1, b2)):
            if b.numel() != 1:
                raise ValueError(
                    f"Tensor betas[{k}] must be 1-element; got betas[{k}]={b!r} with "
                    f"{b.numel()} elements"
                )
            if capturable:
                raise ValueError(
                    f"betas[{k}] as a Tensor is not supported with capturable=True "
                    f"({_NO_TENSOR_CAPTURABLE}); got betas={value!r}; pass floats"
                )
            if foreach:
                raise ValueError(
                    f"betas[{k}] as a Tensor is not supported for capturable=False and "
                    f"foreach=True ({_NO_CAPTURABLE}); got betas={value!r}, foreach=True"
                )
        b1, b2 = b1.item(), b2.item()
    return check_beta("betas[0]", b1), check_beta("betas[1]", b2)


def check_beta(name: str, value: Any) -> float:
    """``betas[0]`` or ``betas[1]``: a number in ``[0, 1)``, in torch's words when it is not."""
    return torch_worded(check_interval, name, value, 0.0, 1.0, hi_open=True)


def store_betas(value: Any) -> Any:
    """``betas`` as kept in a param group: a tuple, tensors as 0-d tensors."""
    if isinstance(value, (list, tuple)):
        return tuple(_scalar_tensor(b) if isinstance(b, Tensor) else b for b in value)
    return value


def check_group_flags(group: dict[str, Any], nonnegative: Sequence[str] = ()) -> None:
    """The hyper-parameters every AM param group has besides its rule's configuration."""
    for key in nonnegative:
        if key in TORCH_WORDS:
            torch_worded(check_nonnegative, key, group[key])
        else:
            check_nonnegative(key, group[key])
    check_bool("maximize", group["maximize"])
    check_bool("foreach", group["foreach"], allow_none=True)
    check_bool("fused", group["fused"], allow_none=True)
    if group["fused"] and group["foreach"]:
        raise RuntimeError(
            "`fused` and `foreach` cannot be `True` together; got fused=True, foreach=True "
            "(set one of them, or neither to let the optimizer choose)"
        )


#: Keywords of ``torch.optim.Adam``/``AdamW``/``SGD`` that the AM optimizers take only at
#: torch's default (so that a copied configuration runs), and why no other value:
#: ``{name: (the value accepted, the reason)}``.
TORCH_FIXED_OPTIONS: dict[str, tuple[Any, str]] = {
    "amsgrad": (
        False,
        "the AM step preconditions by the running average exp_avg_sq, not by its running "
        "maximum (AMSGrad)",
    ),
    "differentiable": (
        False,
        "its step runs under torch.no_grad() and updates the state in place, as torch.optim "
        "does with differentiable=False",
    ),
    "nesterov": (
        False,
        "AM's adaptive beta replaces the momentum coefficient; its update "
        "d = g + gamma (d - g), x -= lr d has no Nesterov look-ahead form",
    ),
    "dampening": (
        0,
        "AM's update d = g + gamma (d - g) is a damped average whose weight gamma comes from "
        "the adaptive beta; there is no separate dampening",
    ),
}


def check_torch_options(owner: str, options: dict[str, Any]) -> None:
    """Refuse a ``torch.optim`` keyword of :data:`TORCH_FIXED_OPTIONS` at another value.

    >>> check_torch_options("AMAdamW", {"amsgrad": False})
    >>> check_torch_options("AMAdamW", {"amsgrad": True})
    Traceback (most recent call last):
    ...
    ValueError: amsgrad=True is not supported by AMAdamW: the AM step preconditions by the \
running average exp_avg_sq, not by its running maximum (AMSGrad); allowed: amsgrad=False
    """
    for name, value in options.items():
        allowed, why = TORCH_FIXED_OPTIONS[name]
        if not (isinstance(value, (bool, int, float)) and value == allowed):
            raise ValueError(
                f"{name}={value!r} is not supported by {owner}: {why}; allowed: {name}={allowed!r}"
            )


def rule_config(**kwargs: Any) -> AMConfig:
    """The validated :class:`~amopt.core.config.AMConfig` of a step, built once per value.

    Under ``torch.compile`` it is built directly: dynamo traces the construction (its
    values are constants of the graph) and would warn about the cache wrapper.
    """
    if torch.compiler.is_compiling():
        return AMConfig(**kwargs)
    return AMConfig.cached(**kwargs)


#: The rule's options a param group holds under the rule's own names (``beta_max`` is
#: each family's: AMSGD's ``beta_max``, AMAdamW's ``betas[0]``).
GROUP_RULE_KEYS = ("lam", "per_layer", "variant", "beta_min", "theta", "beta_high", "beta_low")


def group_rule_config(group: dict[str, Any], beta_max: float) -> AMConfig:
    """The rule configuration of a param group whose cap is ``beta_max`` (the torch
    optimizers' numerator is the linearised one)."""
    return rule_config(
        numerator="linear", beta_max=beta_max, **{k: group[k] for k in GROUP_RULE_KEYS}
    )


# --------------------------------------------------------------------------- dtypes, steps


def new_step(device: torch.device | None = None) -> Tensor:
    """A fresh step counter: a 0-d tensor, as in ``torch.optim.Adam``.

    On the CPU, unless ``device`` is given (``capturable=True``: on the parameter's
    device, so that a captured step reads and advances it there).
    """
    dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
    if device is not None and device.type == "mps":
        dtype = torch.float32  # MPS has no float64
    return torch.zeros((), dtype=dtype, device=device)


def capturable_devices() -> list[str]:
    """Device types ``capturable=True`` supports: ``torch.optim``'s own list."""
    from torch.optim.optimizer import _get_capturable_supported_devices

    return _get_capturable_supported_devices()


def check_capturable(params: Sequence[Tensor], steps: Sequence[Tensor]) -> None:
    """``capturable=True``: parameters and step counters on one supported device type.

    As ``torch.optim.Adam`` checks it (a ``RuntimeError`` here rather than its
    ``AssertionError``), and not while ``torch.compile`` traces, which handles
    graph capture itself.
    """
    if torch.compiler.is_compiling():
        return
    devices = capturable_devices()
    for k, (p, s) in enumerate(zip(params, steps, strict=True)):
        if p.device.type not in devices or s.device.type != p.device.type:
            raise RuntimeError(
                "If capturable=True, params and state_steps must be on supported devices: "
                f"{devices}; got params[{k}] on {p.device} and state_steps[{k}] on "
                f"{s.device}. Use capturable=False on this device"
            )


def cast(tensors: Sequence[Tensor], dtype: torch.dtype) -> list[Tensor]:
    """``tensors`` in ``dtype``; no copy for those already in it."""
    return [t if t.dtype == dtype else t.to(dtype) for t in tensors]


# --------------------------------------------------------------------------- reductions


def sqsum(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``sum(t * t)`` of one tensor as a 0-d tensor, every square formed in ``dtype``."""
    return foreach_sqsum([t], dtype)[0]


def dot(a: Tensor, b: Tensor) -> Tensor:
    """``sum(a * b)`` over every coordinate, in the dtype of ``a`` and ``b`` (0-d tensor).

    One kernel and no temporary for 1-D tensors (the pieces of the foreach kernels,
    see :func:`chunks`); a product and a sum otherwise. There is no ``_foreach_sum``,
    and the multi-tensor stand-ins are slow on the CPU: measured on 8 tensors of 1M
    float32 (1 thread), ``sum`` per tensor takes 0.65 ms, ``dot`` per tensor 0.87 ms,
    ``_foreach_norm(ord=1)`` 4.1 ms and ``_foreach_powsum(order=1)`` 57 ms (against 0.94
    ms for ``order=2``, which accumulates float32 sequentially per lane: a relative
    error of 2e-6 on 1M positive terms and 3e-5 on 4M, where ``dot`` gives 1e-7 and
    the pairwise ``sum`` 4e-8).
    """
    if a.dim() == 1 and b.dim() == 1:
        return torch.dot(a, b)
    return torch.sum(a * b)


def _foreach_powsum(
    tensors: Sequence[Tensor], order: int, dtype: torch.dtype | None = None
) -> list[Tensor]:
    """``[sum(|t|**order) for t in tensors]``: ``torch._foreach_powsum`` where it exists.

    Older torch releases lack it; there ``_foreach_norm`` is used, raised back to the
    power ``order`` (a relative difference of a few ulps for ``order=2``). Under
    ``torch.compile`` each is a plain sum, fused into the loop that forms its input.
    """
    if torch.compiler.is_compiling():
        # plain reductions, which the compiler fuses into the loops beside them (dynamo
        # cannot trace _foreach_powsum, and _foreach_norm would run eagerly)
        wide = [t if dtype is None else t.to(dtype) for t in tensors]
        if order == 2:
            return [(t * t).sum() for t in wide]
        return [t.abs().pow(order).sum() for t in wide]
    powsum = getattr(torch, "_foreach_powsum", None)
    if powsum is not None:
        return list(powsum(tensors, order, dtype=dtype))
    norms = torch._foreach_norm(tensors, order, dtype=dtype)
    return list(norms) if order == 1 else list(torch._foreach_pow(norms, order))


def foreach_grads(
    grads: Sequence[Tensor], params: Sequence[Tensor], maximize: bool, l2: float
) -> list[Tensor]:
    """The gradients a foreach step reads, ``-g`` when maximising plus ``l2 x``: new
    tensors where they differ from ``grads`` (which are left alone)."""
    if maximize:
        out = list(torch._foreach_neg(grads))
        if l2 != 0:
            torch._foreach_add_(out, params, alpha=l2)
        return out
    if l2 != 0:
        return list(torch._foreach_add(grads, params, alpha=l2))
    return list(grads)


def foreach_sqsum(tensors: Sequence[Tensor], acc: torch.dtype) -> list[Tensor]:
    """``[sum(t * t) for t in tensors]`` with one multi-tensor kernel, in ``acc``.

    Each square is formed in ``acc``: ``acc=float64`` keeps those of float32 in range.
    """
    return _foreach_powsum(tensors, 2, dtype=acc)


#: Elements of one chunk of the foreach kernels on the CPU, per torch thread. A chunk's
#: scratch and the pieces of the state it reads (about 1 MiB each per thread) stay in
#: the cache while the kernel makes its many elementwise passes over them; full-size
#: temporaries would cost a trip to memory per pass and page faults (about 30 ms per
#: 100 MB on a current CPU) at every step. Measured on 25M float32 parameters (AMD EPYC,
#: 1 thread), AMAdamW's foreach step takes 135, 120, 113, 115, 157 and 186 ms with
#: chunks of 2^16 to 2^21 elements.
CPU_CHUNK = 1 << 18

#: One piece of a chunk: the index of the tensor it belongs to and its views, one per
#: list (1-D views of contiguous tensors; a non-contiguous tensor is one whole piece).
Piece = tuple[int, tuple[Tensor, ...]]


def chunk_elements(device: torch.device, numel: int, n_scratch: int) -> int | None:
    """The most elements of a chunk of the foreach kernels; ``None``: one chunk.

    On the CPU :data:`CPU_CHUNK` per torch thread (each thread's share of an
    elementwise pass stays the same). Elsewhere the chunks are as large as ``n_scratch``
    scratch buffers of a chunk allow while taking no more memory than one buffer the
    size of the ``numel`` parameters (as ``torch.optim.AdamW``'s foreach step takes),
    so few kernel launches. Under ``torch.compile`` one chunk: the compiler fuses the
    passes and plans the temporaries itself.
    """
    if torch.compiler.is_compiling():
        return None
    if device.type == "cpu":
        return CPU_CHUNK * max(1, torch.get_num_threads())
    return max(1, -(-numel // n_scratch))


def chunks(lists: Sequence[Sequence[Tensor]], size: int | None) -> list[list[Piece]]:
    """Aligned tensors (``lists[k][i]`` of the same shape) cut into chunks of pieces.

    Each contiguous tensor is viewed as 1-D and cut into pieces of at most ``size``
    elements; consecutive pieces are packed into chunks of at most ``size`` elements
    (``size=None``: one chunk holding every tensor whole). A chunk is a list of
    :data:`Piece`; nothing is copied.
    """
    out: list[list[Piece]] = []
    current: list[Piece] = []
    filled = 0
    for i, tensors in enumerate(zip(*lists, strict=True)):
        if not all(t.is_contiguous() for t in tensors):
            parts = [tuple(tensors)]
        elif size is None or tensors[0].numel() <= size:
            parts = [tuple(t.view(-1) for t in tensors)]
        else:
            parts = list(zip(*(t.view(-1).split(size) for t in tensors), strict=True))
        for part in parts:
            numel = part[0].numel()
            if current and size is not None and filled + numel > size:
                out.append(current)
                current, filled = [], 0
            current.append((i, part))
            filled += numel
    if current:
        out.append(current)
    return out


class Scratch:
    """Flat buffers of a kernel, reused by each of its chunks (allocated when first used).

    Each holds as many elements as the largest chunk of ``chunk_list`` (:func:`chunks`).

    ``scratch(k, like)`` is buffer ``k`` seen as one tensor per tensor of ``like`` (a
    chunk's pieces), of their shapes, in the scratch dtype.
    """

    def __init__(self, chunk_list: Sequence[Sequence[Piece]], dtype: torch.dtype) -> None:
        first = chunk_list[0][0][1][0]
        self.numel = max(sum(part[0].numel() for _, part in chunk) for chunk in chunk_list)
        self.dtype, self.device = dtype, first.device
        self._buffers: dict[int, Tensor] = {}

    def __call__(self, k: int, like: Sequence[Tensor]) -> list[Tensor]:
        buf = self._buffers.get(k)
        if buf is None:
            buf = self._buffers[k] = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        views, start = [], 0
        for t in like:
            views.append(buf[start : start + t.numel()].view(t.shape))
            start += t.numel()
        return views


#: Run the device strategy of the foreach kernels (:func:`foreach_mode` ``"flat"``) on the
#: CPU too: its structure (multi-tensor ops only, a number of them independent of the
#: tensor count) is then observable where no GPU is.
FORCE_DEVICE_STRATEGY = False


def foreach_mode(device: torch.device, numel: int, *, half: bool, contiguous: bool) -> str:
    """How the foreach kernels run over one (device, dtype) bucket of ``numel`` elements.

    * ``"chunks"``: on the CPU when the bucket is larger than one chunk
      (:func:`chunk_elements`), or holds half-precision tensors: every pass chunk by chunk
      in cache-sized scratch buffers (:func:`chunks`, :class:`Scratch`);
    * ``"lists"``: the tensors as they are, one multi-tensor op per pass and per-tensor
      values as lists of 0-d tensors: a small CPU bucket, under ``torch.compile`` (the
      compiler fuses the passes) and non-contiguous tensors elsewhere;
    * ``"flat"`` (other devices): 1-D views of contiguous tensors, per-tensor values
      spread over their elements (:class:`Flat`), so that every op takes the fast
      multi-tensor route of the device (one kernel launch for the whole bucket; a list of
      0-d tensors as an operand would take one launch per tensor).
    """
    if torch.compiler.is_compiling():
        return "lists"
    if device.type == "cpu" and not FORCE_DEVICE_STRATEGY:
        size = chunk_elements(device, numel, 1)
        return "chunks" if half or (size is not None and numel > size) else "lists"
    return "flat" if contiguous else "lists"


class Flat:
    """The device strategy's view of a bucket: tensors as 1-D views, values spread.

    Parameters
    ----------
    numels : list of int
        Elements of each tensor of the bucket.
    device : torch.device
    """

    def __init__(self, numels: list[int], device: torch.device) -> None:
        self.numels, self.total, self.device = numels, sum(numels), device
        self._counts: Tensor | None = None

    @staticmethod
    def views(tensors: Sequence[Tensor]) -> list[Tensor]:
        """1-D views of contiguous tensors (metadata only: no kernel)."""
        return [t.view(-1) for t in tensors]

    def spread(self, values: Tensor) -> Tensor | list[Tensor]:
        """Per-tensor ``values`` (shape ``(n,)``) as a list aligned with the 1-D views.

        Each tensor's value repeated over its elements, in one kernel; a 0-d ``values``
        is returned as it is (the one-tensor overload of the multi-tensor ops).
        """
        if values.dim() == 0:
            return values
        if self._counts is None:
            self._counts = _device_counts(self.device, tuple(self.numels))
        full = torch.repeat_interleave(values, self._counts, output_size=self.total)
        return list(full.split(self.numels))

    def empty(self, dtype: torch.dtype) -> list[Tensor]:
        """Uninitialised 1-D tensors of the bucket's sizes in ``dtype`` (one allocation)."""
        return list(torch.empty(self.total, dtype=dtype, device=self.device).split(self.numels))


_COUNTS: dict[tuple[torch.device, tuple[int, ...]], Tensor] = {}


def _device_counts(device: torch.device, numels: tuple[int, ...]) -> Tensor:
    """``numels`` as an int64 tensor on ``device``, made once per layout.

    Copied from the host the first time only (without waiting for the device), so that
    a step captured in a CUDA graph after a warm-up step makes nothing on the host.
    """
    key = (device, numels)
    counts = _COUNTS.get(key)
    if counts is None:
        if len(_COUNTS) >= 64:  # layouts of a few optimizers; forget the oldest
            del _COUNTS[next(iter(_COUNTS))]
        counts = kept_copy(torch.tensor(numels, dtype=torch.int64), device)
        _COUNTS[key] = counts
    return counts


def range_safe_sqsums(tensors: list[Tensor], buffers: list[Tensor]) -> Tensor:
    """``[sum(t * t) for t in tensors]`` in float64, squared in the scratch ``buffers``.

    Each ``|t|`` is copied into its buffer (the scratch of a chunk, in the cache) and
    scaled by the power of two that brings its largest entry into ``[0.5, 1)`` (the
    scale clamped to float32's normal range): exact, so that the float32 squares of any
    ``t`` neither underflow nor overflow (:func:`wide_dtype` says why that matters);
    the sums, taken in the buffers' dtype, are scaled back in float64. Converting each
    piece to float64 instead costs several times as much on the CPU.
    """
    torch._foreach_copy_(buffers, tensors)
    torch._foreach_abs_(buffers)
    largest = torch.stack(torch._foreach_max(buffers))
    exponent = torch.frexp(largest)[1].clamp(-125, 125)
    scale = torch.ldexp(torch.ones_like(largest), -exponent)
    torch._foreach_mul_(buffers, list(scale.unbind()))
    sums = torch.stack(foreach_sqsum(buffers, buffers[0].dtype))
    return torch.ldexp(sums.to(torch.float64), 2 * exponent)


#: float32 sums of squares in this range lost nothing to underflow or overflow: every
#: square that flushed to a subnormal or zero (below 2^-126, an error of at most 2^-149
#: each) is below 2^-29 of the sum for up to 2^20 terms, and no partial sum overflowed.
_SAFE_SQSUM = (2.0**-100, 2.0**120)


#: The AM rules' zero-denominator threshold, relative to the scope's reference sum: the
#: squared machine epsilon of the float64 sums (``amopt.core.rule.guarded_ratio``).
_RULE_TINY = float(torch.finfo(torch.float64).eps) ** 2


def cpu_sqsums(
    tensors: list[Tensor], buffers: list[Tensor] | None = None, ref: Tensor | None = None
) -> Tensor:
    """``[sum(t * t) for t in tensors]`` (CPU tensors or pieces of a chunk) in float64, range-safe.

    Float32 (and float64) data is squared and summed in its own dtype, half precision
    in float32; pieces whose sum leaves :data:`_SAFE_SQSUM` (about ``|t|`` below 1e-15
    or above 1e18, or not finite; zero pieces are checked for zeros) are summed again by
    :func:`range_safe_sqsums` in ``buffers`` (``None``: buffers made for those pieces
    only). The test is a read of CPU values (no device involved); squaring in float64
    costs about six times as much (25M float32 in 48 tensors, 1 thread, Zen 4:
    ``_foreach_powsum`` 3.9 ms in float32, 23.6 ms in float64).

    ``ref`` (one float64 value per piece, AMSGD's ``<g,g> + <d,d>`` of the piece whose
    ``<v,v>`` this is): a piece whose sum is 0 needs no check where its true sum, below
    ``numel * 2^-126`` (every square flushed), is under the rule's threshold
    ``eps^2 * ref`` anyway: the rule then reads it as zero whatever it is (and the
    scope's ``ref`` is at least the piece's).
    """
    dtype = tensors[0].dtype
    if dtype == torch.float64:
        return torch.stack(foreach_sqsum(tensors, None))
    sums = torch.stack(foreach_sqsum(tensors, None if dtype == torch.float32 else torch.float32))
    lo, hi = _SAFE_SQSUM
    values = sums.tolist()
    ok = [lo <= s <= hi for s in values]
    if all(ok):
        return sums.to(torch.float64)
    zero = [k for k, s in enumerate(values) if s == 0.0]
    if zero:  # all zeros (v = d - g of an unchanged gradient), or squares underflowed?
        refs = None if ref is None else ref.tolist()
        for k in zero:
            n = tensors[k].numel()
            ok[k] = n == 0 or (refs is not None and refs[k] * _RULE_TINY >= n * 2.0**-126)
        zero = [k for k in zero if not ok[k]]
        if zero:  # one read-only pass each (Tensor.any() converts to bool: 4x as long)
            extremes = [torch.stack(torch.aminmax(tensors[k])) for k in zero]
            nonzero = torch.stack(extremes).ne(0).any(1).tolist()
            for k, any_nonzero in zip(zero, nonzero, strict=True):
                ok[k] = not any_nonzero
    sums = sums.to(torch.float64)
    redo = [k for k, good in enumerate(ok) if not good]
    if redo:
        again = range_safe_sqsums(
            [tensors[k] for k in redo],
            [torch.empty_like(tensors[k]) if buffers is None else buffers[k] for k in redo],
        )
        sums[redo] = again
    return sums


def piece_sums(results: Sequence[Sequence[Tensor]]) -> Tensor:
    """``(k, n_pieces)``: the 0-d sums of ``k`` multi-tensor reductions, one op."""
    flat = [r for res in results for r in res]
    return torch.stack(flat).view(len(results), -1)


def rule_by_rows(rule: Any, rows: Sequence[Tensor], *args: Any, **kwargs: Any) -> Any:
    """``rule(torch, stacked rows, ...)``; row by row when scopes differ in compute dtype.

    A per-layer group mixing float64 and float32 tensors keeps each scope's beta in its
    own compute dtype (stacking would promote every row to float64). Compiled, the
    rule is the operator ``amopt::rule`` (:mod:`amopt.torch._traced_ops`).
    """
    if torch.compiler.is_compiling():  # one node of the graph, not scalars in every loop
        rule = functools.partial(_traced_ops.rule, rule)
    else:
        rule = functools.partial(rule, torch)
    # AM-Adam's first-step flags: one 0-d tensor per row
    firsts = kwargs.pop("first", None)
    if all(r.dtype == rows[0].dtype for r in rows):
        if firsts is not None:
            kwargs["first"] = torch.stack([f.to(rows[0].device) for f in firsts])
        return rule(torch.stack(list(rows)), *args, **kwargs)
    if firsts is None:
        outs = [rule(r, *args, **kwargs) for r in rows]
    else:
        outs = [
            rule(r, *args, first=f.to(r.device), **kwargs)
            for r, f in zip(rows, firsts, strict=True)
        ]
    if isinstance(outs[0], tuple):
        return tuple(list(col) for col in zip(*outs, strict=True))
    return outs


def bias_correction_roots(steps: Sequence[Tensor], beta2: float) -> list[Tensor]:
    """``[sqrt(1 - beta2**step) for step in steps]`` as 0-d tensors where the steps are.

    In float64 (float32 on MPS). The step counters live on the CPU, so this never
    touches the device and the 0-d results act as scalars in the device kernels that
    use them; with ``capturable=True`` they live on the device and so does all of this.
    The square root: ``sqrt(v) / sqrt(1 - beta2**t)``, as ``torch.optim.Adam`` forms it,
    stays finite where ``v / (1 - beta2**t)`` overflows.
    """
    if torch.compiler.is_compiling():  # one node, not a power in every loop
        return list(_traced_ops.roots(steps, beta2).unbind())
    return list(_traced_ops.bias_correction_roots(list(steps), beta2).unbind())


def total(parts: Sequence[Tensor]) -> Tensor:
    """Sum of 0-d partial reductions (moved to the device of the first one)."""
    device = parts[0].device
    if len(parts) == 1:
        return parts[0]
    return torch.stack([p.to(device, non_blocking=True) for p in parts]).sum()


# --------------------------------------------------------------------------- implementation


_TRITON_MODULE = "amopt.torch._triton"
_triton_state: dict[str, Any] = {"tried": False, "module": None, "error": None}


def triton_module() -> Any:
    """``amopt.torch._triton`` when it imports, else ``None`` (the reason is kept).

    The module provides ``available(tensors) -> str | None`` (``None``: its kernels can
    step these tensors; a string: why not) and ``triton_amsgd`` / ``triton_am_adamw``,
    which take the arguments of the single-tensor implementations, ``grad_scale`` and
    ``found_inf`` included.
    """
    if not _triton_state["tried"]:
        _triton_state["tried"] = True
        try:
            if importlib.util.find_spec(_TRITON_MODULE) is None:
                raise ImportError(f"{_TRITON_MODULE} is not installed")
            _triton_state["module"] = importlib.import_module(_TRITON_MODULE)
        except Exception as exc:  # noqa: BLE001 - any failure means "no Triton kernels"
            _triton_state["error"] = f"{type(exc).__name__}: {exc}"
    return _triton_state["module"]


def triton_unavailable(tensors: Sequence[Tensor]) -> str | None:
    """``None`` if the Triton kernels can step ``tensors``, else the reason."""
    mod = triton_module()
    if mod is None:
        return f"the Triton kernels are unavailable ({_triton_state['error']})"
    available = getattr(mod, "available", None)
    if available is None:
        return f"{_TRITON_MODULE} has no available() function"
    return available(list(tensors))


def fused_devices() -> list[str]:
    """Device types ``fused=True`` supports: the CPU (C kernels), CUDA with Triton installed
    (the registry's answer, :func:`amopt.backends.library_available`)."""
    return ["cpu", "cuda"] if backends.library_available("triton") else ["cpu"]


def check_fused_device(p: Tensor) -> None:
    """``fused=True``: a floating (or complex) parameter on a device with fused kernels.

    The message is that of ``torch.optim``; a parameter on, e.g., the ``meta`` device
    raises ``RuntimeError`` at its first step, as there.
    """
    devices = fused_devices()
    if p.device.type not in devices or not (torch.is_floating_point(p) or p.is_complex()):
        raise RuntimeError(
            "`fused=True` requires all the params to be floating point Tensors of supported "
            f"devices: {devices} but {p.dtype} and {p.device.type}; use fused=False or "
            "leave it unset"
        )


_REAL_DTYPES = frozenset((torch.float32, torch.float64))


# a constant of the graph where torch.compile traces (decorated on first traced use:
# the decorator imports the compiler, see amopt.torch._eager)
_eager.register("fused_cpu_missing", "assume_constant_result", _fused.missing)


def _fused_cpu_unavailable(tensors: Sequence[Tensor]) -> str | None:
    compiling = torch.compiler.is_compiling()
    missing = _eager.fused_cpu_missing() if compiling else _fused.missing()
    if missing:
        return missing
    try:
        dense = all(t.is_contiguous() for t in tensors)
    except RuntimeError:  # sparse and other layouts have no strides
        dense = False
    if not dense:
        return "a parameter or gradient is not a dense contiguous tensor"
    return None


def default_path(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    *,
    fused: bool | None,
    foreach: bool | None,
) -> tuple[str, str | None]:
    """The implementation a param group runs, and why it is not a faster one.

    ``fused`` and ``foreach`` are the group's flags. An explicit choice is respected
    (as in ``torch.optim``: giving either flag turns the automatic choice off):
    ``fused=True`` runs the fused kernels of the parameters' device, ``foreach=True``
    the ``torch._foreach_*`` implementation and ``False`` the single-tensor reference.
    With both ``None`` the fastest correct implementation for the device and dtype:

    * CPU, one dtype in float32/float64 (complex included): the fused C kernels of
      :mod:`amopt.torch._fused`, else foreach;
    * CUDA: the Triton kernels of ``amopt.torch._triton`` where that module imports and
      its ``available(tensors)`` accepts the tensors, else foreach;
    * any other device, and half precision on the CPU: foreach.

    Returns
    -------
    path : {"single", "foreach", "fused", "triton"}
    reason : str or None
        Why the kernels the device and dtype call for cannot run (a fallback worth a
        warning); ``None`` when ``path`` is the intended one.
    """
    if fused and foreach:
        raise RuntimeError(
            "`fused` and `foreach` cannot be `True` together; got fused=True, foreach=True"
        )
    # the usual group is checked with as few tensor attributes as possible: this runs every
    # eager step; Dynamo folds ``device`` into the trace but records each ``is_cpu``
    if torch.compiler.is_compiling():
        devices = {p.device.type for p in params}
    else:
        cpu = all(p.is_cpu for p in params)
        devices = {"cpu"} if cpu else {p.device.type for p in params}
    if fused:
        return ("triton" if devices == {"cuda"} else "fused"), None
    if fused is not None or foreach is not None:
        return ("foreach" if foreach else "single"), None
    tensors = [*params, *grads]
    if devices == {"cpu"}:
        dtypes = {t.dtype for t in tensors}
        if not dtypes <= _REAL_DTYPES:
            dtypes = {real_dtype(t) for t in tensors}
        if len(dtypes) != 1 or not dtypes <= _REAL_DTYPES:
            return "foreach", None
        why = _fused_cpu_unavailable(tensors)
        return ("foreach", why) if why else ("fused", None)
    if devices == {"cuda"}:
        why = triton_unavailable(tensors)
        return ("foreach", why) if why else ("triton", None)
    return "foreach", None


def warn_path_fallback(reason: str, seen: set[str], stacklevel: int = 3) -> None:
    """Warn once per ``reason`` (per ``seen`` set) that a group runs the foreach path."""
    if reason in seen:
        return
    seen.add(reason)
    warnings.warn(
        f"{reason}; the foreach implementation runs instead (same iterates up to float "
        "rounding). Pass foreach=True (or fused=False) to choose an implementation and "
        "silence this warning",
        FusedFallbackWarning,
        stacklevel=stacklevel + 1,
    )


# --------------------------------------------------------------------------- GradScaler


def _on(value: Tensor, device: torch.device, cache: dict[torch.device, Tensor]) -> Tensor:
    if device not in cache:
        cache[device] = value.to(device, non_blocking=True)
    return cache[device]


def unscale(grads: Sequence[Tensor], grad_scale: Tensor | None) -> list[Tensor]:
    """``g / grad_scale`` for every gradient (new tensors; ``p.grad`` is left alone)."""
    if grad_scale is None:
        return list(grads)
    cache: dict[torch.device, Tensor] = {}
    return [g / _on(grad_scale, g.device, cache) for g in grads]


class InfSkip:
    """Undo a step's in-place updates where ``found_inf`` is set, without a host sync.

    ``torch.amp.GradScaler`` hands optimizers with ``_step_supports_amp_scaling`` a 0-d
    ``found_inf`` (non-zero when a gradient held an inf or NaN) and lets them skip the
    step. The step runs in full; ``InfSkip`` keeps copies of the tensors it updates and
    afterwards puts back ``torch.where(found_inf > 0, old, new)``: a data-dependent
    choice on the device instead of a branch on the host. The step counters, on the
    CPU, are decremented by ``found_inf > 0`` (with a CUDA ``found_inf`` that is one
    copy to the host per step).
    """

    def __init__(self, found_inf: Tensor | None, tensors: Iterable[Tensor | None]) -> None:
        self.found_inf = found_inf
        self._cache: dict[torch.device, Tensor] = {}
        self._saved: list[tuple[Tensor, Tensor]] = []
        if found_inf is not None:
            self._saved = [(t, t.clone()) for t in tensors if t is not None]

    def skip(self, device: torch.device) -> Tensor:
        """The 0-d boolean ``found_inf > 0`` on ``device``."""
        assert self.found_inf is not None
        if device not in self._cache:
            self._cache[device] = self.found_inf.to(device, non_blocking=True) > 0
        return self._cache[device]

    def restore(self, steps: Sequence[Tensor] = (), created: Iterable[Tensor | None] = ()) -> None:
        """Put back the saved tensors where ``found_inf`` is set; zero ``created`` ones."""
        if self.found_inf is None:
            return
        for t, old in self._saved:
            t.copy_(torch.where(self.skip(t.device), old, t))
        for t in created:
            if t is not None:
                t.copy_(torch.where(self.skip(t.device), torch.zeros_like(t), t))
        for s in steps:
            s.sub_(self.skip(s.device).to(s.dtype))

    def blend(self, old: Tensor | None, new: Tensor) -> Tensor:
        """``where(found_inf > 0, old, new)`` (0 for a missing ``old``)."""
        return self.blend_all([old], [new])[0]

    def blend_all(self, olds: Sequence[Tensor | None], news: Sequence[Tensor]) -> list[Tensor]:
        """:meth:`blend` of each pair; the 0-d values a few operations at a time
        (:func:`~amopt.torch._records.where_skipped`), not one per parameter."""
        if self.found_inf is None:
            return list(news)
        return where_skipped(self.skip, olds, news)


# --------------------------------------------------------------------------- optimizer base


def _same_kind(old: Any, new: Tensor) -> bool:
    return (
        isinstance(old, Tensor)
        and old.shape == new.shape
        and old.dtype == new.dtype
        and old.device == new.device
    )


class AMOptimizerBase(Optimizer):
    """Telemetry, state-dict handling and the choice of implementation of the AM optimizers.

    ``_step_supports_amp_scaling``: ``torch.amp.GradScaler`` passes its scale and
    ``found_inf`` to ``step()`` (as the attributes ``grad_scale`` and ``found_inf``)
    instead of unscaling the gradients and checking for infs on the host; the step
    unscales and skips itself (see :class:`InfSkip`).
    """

    _step_supports_amp_scaling = True

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        self._lr_tables()
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._lr_tables()

    def _lr_tables(self) -> None:
        """The last number lr of each group beside its ``"prev_lr"`` tensor
        (:meth:`_lr_ratio`), made before any step."""
        self.__dict__.setdefault("_lr_cache", {})

    def _path(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor]) -> str:
        """The implementation this group runs now (:func:`default_path`), warning once."""
        path, reason = default_path(params, grads, fused=group["fused"], foreach=group["foreach"])
        if reason is not None:
            seen = self.__dict__.get("_fallback_warned")  # (torch 2.11's Dynamo: no setdefault)
            if seen is None:
                seen = self._fallback_warned = set()
            warn_path_fallback(reason, seen, stacklevel=4)
        return path

    def _group_plan(self, group: dict[str, Any], flags: tuple) -> tuple[Any, list[Tensor] | None]:
        """The group's Triton plan (``amopt.torch._triton.GroupPlan``) and this step's
        gradients, or ``(None, None)`` where the group has none or it no longer applies."""
        plans = self.__dict__.get("_am_plans")
        if not plans:
            return None, None
        plan = plans.get(id(group))
        if plan is None:
            return None, None
        grads = plan.grads(group, flags)
        if grads is None:
            del plans[id(group)]
            return None, None
        return plan, grads

    def _keep_group_plan(self, group: dict[str, Any], plan: Any) -> None:
        """Keep ``plan`` (``None``: none) for the coming steps of ``group``, which
        :meth:`_group_plan` finds."""
        if plan is not None:
            self.__dict__.setdefault("_am_plans", {})[id(group)] = plan

    def _drop_group_plans(self) -> None:
        self.__dict__.pop("_am_plans", None)

    def _lr_ratio(self, group: dict[str, Any], params: Sequence[Tensor]) -> Any:
        r""":math:`r = \eta_{t-1}/\eta_t` of the group's coming step
        (:func:`amopt.core.rule.lr_ratio`; ``docs/algorithms.md`` sections 2 and 3).

        The stepped parameters' state keeps ``"prev_lr"``, the lr of the last step they
        took, as one 1-element float64 tensor for the group (on the CPU; on the lr's
        device for a tensor lr, on the parameters' with ``capturable=True``; not 0-d:
        ``torch.compile`` takes a 0-d CPU tensor of an optimizer's state for a number),
        updated in place
        after each step (:meth:`_remember_lr`), so ``state_dict()`` saves it and a
        resumed run continues its schedule exactly. It starts at the step's own lr
        (:meth:`_start_lr`): r = 1 on a parameter's first step and on the first step
        after loading a state dict saved before amopt kept it. One r serves the group's
        scopes.

        Eagerly a number: the optimizer keeps the last number lr beside the tensor, so a
        step reads no tensor value (the tensor is read only where it changed otherwise,
        e.g. by a compiled step). While ``torch.compile`` traces, the tensor itself: the
        compiled step forms r from it (:func:`hyper_ratio`), so the graph does not
        change with the schedule.
        """
        if not params:
            return 1.0
        record = self.state[params[0]].get("prev_lr")
        if not isinstance(record, Tensor):
            return 1.0
        if torch.compiler.is_compiling():
            return record
        lr = group["lr"]
        kept = self._lr_cache.get(id(group))
        if kept is not None and kept[0] is record and kept[2] == record._version:
            prev = kept[1]
        else:  # loaded, or changed by a compiled step: read it (a rare host read)
            prev = float(record)
        return _rule.lr_ratio(prev, as_float(lr))

    def _start_lr(self, group: dict[str, Any], params: Sequence[Tensor]) -> None:
        """Parameters without a ``"prev_lr"`` tensor share the group's, or a new one at
        this step's lr (r = 1); run by ``_init_group``."""
        states = [self.state[p] for p in params]
        fresh = [state for state in states if not isinstance(state.get("prev_lr"), Tensor)]
        if not fresh:
            return
        record = next(
            (
                s["prev_lr"]
                for s in (self.state.get(q, {}) for q in group["params"])
                if isinstance(s.get("prev_lr"), Tensor)
            ),
            None,
        )
        if record is None:
            lr = group["lr"]
            if isinstance(lr, Tensor):
                record = lr.detach().reshape(1).to(torch.float64, copy=True)
            else:
                device = params[0].device if group.get("capturable") else None
                record = torch.tensor([float(lr)], dtype=torch.float64, device=device)
                self._lr_cache[id(group)] = (record, float(lr), record._version)
        for state in fresh:
            state["prev_lr"] = record

    def _remember_lr(
        self, group: dict[str, Any], params: Sequence[Tensor], found_inf: Tensor | None
    ) -> None:
        """Keep this step's lr in the group's ``"prev_lr"`` tensor for the next r.

        A step skipped by ``GradScaler`` keeps the previous one where that is decided
        without reading ``found_inf`` on the host: for a tensor lr on ``found_inf``'s
        device (a ``where``); a number lr is kept as a taken step's."""
        if not params:
            return
        states = [self.state[p] for p in params]
        record = states[0].get("prev_lr")
        if not isinstance(record, Tensor):
            return
        lr = group["lr"]
        if isinstance(lr, Tensor):
            new = lr.detach().reshape(record.shape).to(record.dtype)
            if found_inf is not None and found_inf.device == record.device:
                new = torch.where(found_inf.reshape(()) != 0, record, new)
            # (as _store_state writes: a plain copy_ of a state tensor was seen dropped
            # from a compiled step's graph)
            torch._foreach_copy_([record], [new])
        else:
            record.fill_(lr)
        if not isinstance(lr, Tensor):
            self._lr_cache[id(group)] = (record, float(lr), record._version)
        for state in states:  # one tensor for the group (loaded states have their own)
            if state.get("prev_lr") is not record:
                state["prev_lr"] = record

    def _amp(self) -> tuple[Tensor | None, Tensor | None]:
        """``grad_scale`` and ``found_inf`` set by ``torch.amp.GradScaler`` for this step."""
        return getattr(self, "grad_scale", None), getattr(self, "found_inf", None)

    def latest_betas(self) -> list[list[Tensor | None]]:
        """The beta applied at the latest step, per param group and parameter.

        Returns one list per param group, aligned with ``group["params"]``:
        the 0-d tensor (compute dtype, on the device where it was
        computed) last applied to that parameter, or ``None`` before the
        parameter's first step. In a global-scope group (``per_layer=False``)
        every entry is the group's single beta. The tensors are the ones held in
        ``optimizer.state[p]["beta"]``: no copy, no kernel and no device
        synchronisation, so this is cheap enough to log every step (call
        ``.item()`` or ``torch.stack(...).tolist()`` when you want host values).
        The state is updated in place at each step, so keep ``torch.stack(...)``
        (a copy) rather than the tensors themselves to log a history.
        """
        return [
            [
                self.state[p]["beta"] if "beta" in self.state.get(p, {}) else None
                for p in g["params"]
            ]
            for g in self.param_groups
        ]

    def _init_betas(self, group: dict[str, Any], params: Sequence[Tensor]) -> None:
        """Give stepped parameters without a ``beta`` entry a 0-d zero before their step.

        The step then only updates existing tensors (``_store_state``); created in
        ``_init_group``, which ``torch.compile`` runs eagerly, it keeps the compiled
        step the same from the first step on. A global scope's members share one.
        The group's ``"prev_lr"`` tensor starts here too (:meth:`_start_lr`), for the
        same reason.
        """
        self._start_lr(group, params)
        missing = [p for p in params if "beta" not in self.state[p]]
        if not missing:
            return
        if group["per_layer"]:
            for p in missing:
                dtype = compute_dtype([real_dtype(p)])
                self.state[p]["beta"] = torch.zeros((), dtype=dtype, device=p.device)
            return
        shared = next(
            (self.state[p]["beta"] for p in group["params"] if "beta" in self.state.get(p, {})),
            None,
        )
        if shared is None:
            dtype = compute_dtype([real_dtype(p) for p in params])
            shared = torch.zeros((), dtype=dtype, device=params[0].device)
        for p in missing:
            self.state[p]["beta"] = shared

    def _store_state(
        self,
        group: dict[str, Any],
        params: Sequence[Tensor],
        entries: Sequence[tuple[str, Sequence[Tensor], InfSkip | None]],
    ) -> None:
        """Write the 0-d state entries of a step, in place where they exist.

        Each entry is ``(key, values, skip)``: ``values`` is aligned with ``params``, the
        parameters stepped; with a global scope (``per_layer=False``) it holds the scope's
        one value and every member with state shares one tensor. Existing tensors are
        updated with ``copy_`` rather than rebound, so that a compiled ``step()`` sees the
        same tensors at every step. With ``skip``, a step skipped for an inf gradient
        keeps the previous values.
        """
        if group["per_layer"]:
            states = [self.state[p] for p in params]
            olds, news = [], []
            for key, values, skip in entries:
                if skip is not None and skip.found_inf is not None:
                    values = skip.blend_all([state.get(key) for state in states], values)
                for state, value in zip(states, values, strict=True):
                    old = state.get(key)
                    if old is value:
                        continue
                    if _same_kind(old, value):
                        olds.append(old)
                        news.append(value)
                    else:
                        state[key] = value
            if olds:  # one multi-tensor copy rather than a copy_ call per parameter
                torch._foreach_copy_(olds, news)
            return
        members = [self.state[p] for p in group["params"] if self.state.get(p)]
        for key, values, skip in entries:
            existing: dict[int, Tensor] = {}
            for state in members:
                old = state.get(key)
                if _same_kind(old, values[0]):
                    existing[id(old)] = old
            shared = next(iter(existing.values()), None)
            value = skip.blend(shared, values[0]) if skip else values[0]
            if existing:  # a multi-tensor copy: AOT autograd was seen to drop a copy_ here
                torch._foreach_copy_(list(existing.values()), [value] * len(existing))
            for state in members:
                if not _same_kind(state.get(key), value):
                    state[key] = value if shared is None else shared

    #: The per-parameter state entries this optimizer keeps (set by each class).
    _state_keys: frozenset[str] = frozenset()
    #: The state entries of a ``torch.optim`` optimizer's state dict that this one carries
    #: over (:meth:`_migrate`); empty: another optimizer's state dict is refused.
    _migrated_keys: frozenset[str] = frozenset()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict; ``beta`` / ``beta1_prod`` keep their compute dtype.

        ``torch.optim.Optimizer.load_state_dict`` casts every floating state
        tensor to its parameter's dtype; for the 0-d beta entries of bf16/fp16
        parameters (and float32 parameters of a float64 global scope) that would
        lose precision, so they are restored with their saved dtype, on the
        parameter's device. Step counters are kept on the CPU (on the parameter's
        device with ``capturable=True``).

        A state dict saved by another optimizer (its param groups have no ``"lam"``)
        is carried over where the state means the same (``torch.optim.Adam``/``AdamW``
        into :class:`~amopt.torch.AMAdamW`/``AMAdam``, with a ``UserWarning``) and
        refused with a ``ValueError`` otherwise; so is a state with entries this
        optimizer does not keep. See the class docstrings.
        """
        name = type(self).__name__
        foreign = any("lam" not in g for g in state_dict["param_groups"])
        for pid, saved in state_dict["state"].items():
            if foreign:  # only what carries over
                unknown = set(saved) - self._migrated_keys
            else:  # another AM optimizer's entries (entries of later versions pass)
                unknown = set(saved) & (AM_STATE_KEYS - self._state_keys)
            if unknown:
                origin = "another optimizer's" if foreign else "its"
                allowed = sorted(self._migrated_keys if foreign else self._state_keys)
                raise ValueError(
                    f"{name}.load_state_dict: the state of parameter {pid} holds "
                    f"{sorted(unknown)}, which {name} cannot take from {origin} state dict "
                    f"(it takes {allowed or 'none'}); {self._foreign_advice()}"
                )
        if foreign:
            if not self._migrated_keys:
                raise ValueError(
                    f"{name}.load_state_dict: this state dict was saved by another optimizer "
                    f"(its param groups have no 'lam'); {self._foreign_advice()}"
                )
            state_dict = self._migrated_groups(state_dict)
        self._drop_group_plans()
        self._lr_tables()
        self._lr_cache.clear()  # r comes from the loaded "prev_lr"
        super().load_state_dict(state_dict)
        if foreign:
            self._migrate()
        saved_ids = chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = chain.from_iterable(
            ((p, bool(g.get("capturable"))) for p in g["params"]) for g in self.param_groups
        )
        for saved_id, (p, on_device) in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(saved_id)
            if not saved or p not in self.state:
                continue
            state = self.state[p]
            for key in SCALAR_STATE_KEYS:
                value = saved.get(key)
                if isinstance(value, Tensor):
                    state[key] = value.to(device=p.device)
            prev_lr = saved.get("prev_lr")  # float64, as it was saved (not the param's dtype)
            if isinstance(prev_lr, Tensor):
                state["prev_lr"] = prev_lr.to(torch.float64, copy=True)
            step = state.get("step")
            home = p.device if on_device else torch.device("cpu")
            if isinstance(step, Tensor) and step.device != home:
                state["step"] = step.to(home)

    def _foreign_advice(self) -> str:
        """What to do instead of loading another optimizer's state dict."""
        return "construct the optimizer afresh and let it build its own state"

    def _migrated_groups(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Another optimizer's state dict whose param groups take AM's keys from this one's.

        The saved hyper-parameters that both share (``lr``, ``betas``, ``eps``, scheduler
        entries) are loaded as ``torch.optim`` loads them; the AM ones (``lam``,
        ``per_layer``, the variants, ...), which the saved groups lack, keep this
        optimizer's values rather than falling back to the class defaults.
        """
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            return state_dict  # torch.optim's own error says so
        groups = []
        for ours, saved in zip(self.param_groups, saved_groups, strict=True):
            groups.append({**{k: v for k, v in ours.items() if k != "params"}, **saved})
        return {**state_dict, "param_groups": groups}

    def _migrate(self) -> None:
        """Complete the state carried over from another optimizer (after it is loaded)."""

    def _backfill_steps(self) -> None:
        """Older states may hold Python-number steps: make them CPU tensors."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if state and "step" in state and not torch.is_tensor(state["step"]):
                    step = new_step(p.device if group.get("capturable") else None)
                    step.fill_(float(state["step"]))
                    state["step"] = step


def plan_flags(group: dict[str, Any]) -> tuple:
    """What a group's Triton plan depends on besides its tensors."""
    return (group["per_layer"], group["foreach"], group["fused"], group["process_group"])


def hyper_ratio(lr_ratio: Any, lr: Any, path: str) -> Any:
    """``lr_ratio`` as a number; while ``torch.compile`` traces an optimizer's step, where
    it is the previous lr's tensor (``AMOptimizerBase._lr_ratio``): that tensor itself
    for the fused and Triton operators, which form r from it and their lr when they run,
    or r as a 0-d tensor of the graph for the other paths' rule operators
    (:func:`amopt.torch._traced_ops.ratio_of`). No number of the graph follows the
    schedule, and no float the compiler made symbolic reaches an operator's list."""
    if not (isinstance(lr_ratio, Tensor) and torch.compiler.is_compiling()):
        return as_float(lr_ratio)
    if path in ("fused", "triton"):
        return lr_ratio
    # lr as a tensor of the graph (a Python branch on a number lr would specialise it:
    # the compiler restarts its analysis)
    lr_t = (
        lr.reshape(lr_ratio.shape).to(lr_ratio) if isinstance(lr, Tensor) else lr_ratio * 0.0 + lr
    )
    return torch.where(lr_t != 0, lr_ratio / torch.where(lr_t != 0, lr_t, 1.0), 1.0).reshape(())


def step_lr(lr: Any) -> Any:
    """The ``lr`` a step hands on: a tensor as it is while ``torch.compile`` traces (the
    Triton operator reads it when it runs: a scheduler's new value needs no new graph)."""
    return lr if torch.compiler.is_compiling() and isinstance(lr, Tensor) else as_float(lr)


def hyper_lr(lr: Any, path: str) -> Any:
    """``lr`` as a number, or as the traced tensor for the Triton operator."""
    if path == "triton" and isinstance(lr, Tensor) and torch.compiler.is_compiling():
        return lr
    return as_float(lr)
