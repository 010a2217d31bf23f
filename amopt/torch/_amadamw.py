r"""``AMAdamW`` and ``AMAdam``: Adam with Adaptive Memory momentum for ``torch.optim``."""

from __future__ import annotations

import sys
import warnings
from functools import partial
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import Optimizer, ParamsT

from amopt.core import rule as _rule
from amopt.core.config import AMConfig, check_bool, check_choice
from amopt.torch import _distributed, _fused_ops, _traced_ops
from amopt.torch._common import (
    Piece,
    Scratch,
    as_float,
    bias_correction_roots,
    check_beta,
    check_capturable,
    check_fused_device,
    check_group_flags,
    check_lr,
    check_tensor_betas,
    check_torch_options,
    chunk_elements,
    chunks,
    foreach_grads,
    group_rule_config,
    hyper_lr,
    hyper_ratio,
    new_step,
    rule_by_rows,
    rule_config,
    store_betas,
    total,
)
from amopt.torch._records import AdamHyper, AdamTensors, Scaler, as_real, compute_dtype, real_dtype
from amopt.torch._step import StepTemplate, family_paths, functional, fused_step

__all__ = ["AMAdam", "AMAdamW", "am_adamw"]

#: Weight-decay modes of the functional ``am_adamw``; ``"l2"`` is AM-Adam.
WEIGHT_DECAY_MODES = _rule.WEIGHT_DECAY_MODES

#: ``torch.optim.AdamW`` keywords taken at torch's default only (``check_torch_options``).
_TORCH_FIXED = ("amsgrad", "differentiable")

_DEFAULTS: dict[str, Any] = {
    "betas": (0.9, 0.999),
    "eps": 1e-8,
    "lam": 0.1,
    "per_layer": True,
    "variant": None,
    "beta_min": 0.5,
    "theta": 0.7,
    "beta_high": 0.9,
    "beta_low": 0.1,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "fused": None,
    "process_group": None,
}


def _config(group: dict[str, Any], beta1: float | None = None) -> AMConfig:
    """The group's rule configuration (validated; built once per distinct value);
    ``beta1``: ``betas[0]`` already read."""
    beta1 = as_float(group["betas"][0]) if beta1 is None else beta1
    return group_rule_config(group, beta1)


def _group_hyper(group: dict[str, Any], lr: Any, lr_ratio: Any = 1.0) -> AdamHyper:
    """The hyper-parameters of a step of ``group``, ``betas[0]`` checked (schedulers
    write it)."""
    beta1, beta2 = (as_float(b) for b in group["betas"])
    check_beta("betas[0]", beta1)
    return AdamHyper(
        lr,
        beta2,
        group["eps"],
        group["weight_decay"],
        group["weight_decay_mode"],
        group["maximize"],
        _config(group, beta1),
        lr_ratio,
    )


def _validate(group: dict[str, Any], modes: tuple[str, ...]) -> None:
    check_bool("capturable", group["capturable"])
    check_lr(group["lr"], foreach=group["foreach"], capturable=group["capturable"])
    check_tensor_betas(group["betas"], foreach=group["foreach"], capturable=group["capturable"])
    _config(group)
    check_choice("weight_decay_mode", group["weight_decay_mode"], modes)
    check_group_flags(group, nonnegative=("eps", "weight_decay"))


class AMAdamW(StepTemplate):
    r"""AdamW with Adaptive Memory momentum (AM-AdamW, Topollai & Choromanska, AISTATS 2026).

    Adam's constant :math:`\beta_1` is replaced by a coefficient :math:`\beta_t`
    computed in closed form at every step (``docs/algorithms.md``, section 3).
    With :math:`d` = ``exp_avg`` and :math:`v` = ``exp_avg_sq`` (both start at 0)
    and :math:`\pi` = ``beta1_prod`` (starts at 1), step :math:`t = 1, 2, \dots`:

    .. math::

        v &\leftarrow \beta_2 v + (1-\beta_2) g^2, \qquad
        p = \big(1 - \beta_{1,\max}\,\pi\big)\big(\epsilon + \sqrt{v/(1-\beta_2^t)}\big),
        \qquad u = \frac{1}{1+\lambda p}, \quad w = \frac{u}{p}, \\
        N &= \textstyle\sum \frac{g^2}{p} - \lambda u (d-g)^2
             + \mu\eta \frac{g d}{p} + \mu(2+\mu\eta) g x - \mu d x, \qquad
        D = \textstyle\sum w (d-g)^2, \\
        \beta_t &= \operatorname{clip}(N / D, 0, \beta_{1,\max}), \qquad
        d \leftarrow g + \frac{\beta_t + \lambda p}{1 + \lambda p}(d - g), \qquad
        \pi \leftarrow \pi \beta_t, \\
        x &\leftarrow (1 - \eta\mu)\, x - \eta\, d / p
        \quad\text{(decoupled)} \qquad\text{or}\qquad
        x \leftarrow (x - \eta\, d/p) / (1 + \eta\mu) \quad\text{(proximal)},

    with :math:`\beta_t = 0` when :math:`D \le \epsilon_{\text{mach}}^2
    (\sum w d^2 + \sum w g^2)`. Sums run over the beta scope: each parameter
    tensor (``per_layer=True``, the default, as in the paper's LLM runs) or every
    parameter of the param group with a gradient (``per_layer=False``); the
    product :math:`\pi` is kept per scope. On the first step :math:`\beta_1 =
    \beta_{1,\max}` and the step equals AdamW's up to the factor
    :math:`1/(1+\lambda p)`.

    Parameters
    ----------
    params : iterable
        Parameters or dicts defining parameter groups.
    lr : float or Tensor, default 1e-3
        Learning rate :math:`\eta \ge 0`; a 1-element tensor as in ``torch.optim.Adam``
        (not with ``foreach=True``: ``ValueError``).
    betas : (float, float) or (Tensor, Tensor), default (0.9, 0.999)
        :math:`(\beta_{1,\max}, \beta_2)`, each in :math:`[0, 1)`; :math:`\beta_{1,\max}`
        is the cap of the adaptive :math:`\beta_t`. Two 1-element tensors are
        accepted as in ``torch.optim.Adam`` (not with ``foreach=True``).
    eps : float, default 1e-8
        :math:`\epsilon \ge 0` of the preconditioner.
    weight_decay : float, default 1e-2
        :math:`\mu \ge 0`; enters both the beta rule and the update.
    lam : float, default 0.1
        Proximal regularisation :math:`\lambda \ge 0`.
    per_layer : bool, default True
        One beta per parameter tensor; ``False`` gives one beta per param group.
    weight_decay_mode : {"decoupled", "proximal"}, default "decoupled"
        How the decay enters the update (see the formula above).
    variant : {None, "clip", "restart"}, default None
        Section 4 variants, as in :class:`AMSGD`.
    beta_min, theta, beta_high, beta_low : float
        Parameters of the variants, each in :math:`[0, 1]`.
    maximize : bool, default False
        Maximise the objective.
    foreach : bool or None, default None
        ``True``: the multi-tensor (``torch._foreach_*``) implementation: on the
        CPU chunk by chunk in cache-sized scratch buffers (no temporary the size of
        the parameters), on other devices whole-tensor multi-tensor ops, as many
        kernel launches per step whatever the number of tensors;
        ``False``: the single-tensor reference. Same iterates up to float rounding.
    fused : bool or None, default None
        Fused kernels: on the CPU, C kernels making two passes over memory per
        step (one reduction pass, one update pass) instead of the many passes
        of the foreach path, and no temporary full-size buffers, built by ``pip
        install`` or with the system C compiler on first use (see
        ``amopt.torch._fused``); on CUDA, Triton kernels where
        ``amopt.torch._triton`` provides them. Parameters on other devices raise
        ``RuntimeError`` at their first step, as in ``torch.optim``. Groups the
        kernels do not handle (dtypes other than float32/float64,
        non-contiguous tensors), or a machine without a C compiler, use the
        foreach implementation with a ``FusedFallbackWarning``. Same iterates
        as the single-tensor implementation up to float rounding (blocked
        reductions, see ``amopt/torch/csrc/am_fused.c``). Cannot be combined with
        ``foreach=True``.

        With neither ``fused`` nor ``foreach`` given, each step runs the fastest
        implementation for the group's device and dtype, as :class:`AMSGD` does.
    capturable : bool, default False
        As in ``torch.optim.Adam``: the step counters live on the parameters' device
        and the step runs no operation on the host (the bias corrections are
        computed on the device), so that it can be captured in a CUDA graph. The
        parameters must be on a device ``torch.optim`` supports for capture
        (``RuntimeError`` at the first step otherwise; not checked while
        ``torch.compile`` traces). ``lr`` and ``betas`` must be numbers: the beta rule
        takes them as constants, and a tensor's value would be read on the host.
    process_group : ProcessGroup, optional
        The ranks that together hold the parameters of a ``per_layer=False`` group
        of plain tensors, each rank a partition (found automatically inside
        ``torch.distributed.optim.ZeroRedundancyOptimizer``). Not needed for
        replicas (DDP) nor for DTensors (FSDP2, tensor parallel), whose device mesh
        says which ranks hold their pieces; see ``amopt.torch._distributed``.
    amsgrad, differentiable : bool, default False
        ``torch.optim.AdamW``'s keywords, taken at its defaults so that a copied
        configuration runs; ``True`` is a ``ValueError`` naming it (AM preconditions
        by the running average ``exp_avg_sq``, not AMSGrad's maximum, and its step
        runs under ``torch.no_grad()``).

    Notes
    -----
    **State.** Per parameter: ``step`` (CPU counter; on the parameter's device with
    ``capturable=True``), ``exp_avg``, ``exp_avg_sq``,
    ``beta1_prod`` (:math:`\pi` of the parameter's scope) and ``beta`` (the 0-d
    beta last applied), the last two in the compute dtype (float32 for
    half-precision and float32 parameters, float64 for float64; the sums of squares
    beta is formed from are float64 wherever the device has it). ``state_dict()``
    holds all of it; saving and loading mid-run continues bit-identically.

    **Another optimizer's state dict.** A ``torch.optim.AdamW`` (or ``Adam``) state
    dict loads with a ``UserWarning``: it means the same here. ``exp_avg`` is
    :math:`d`, ``exp_avg_sq`` is :math:`v` and ``step`` counts the same steps, and
    ``beta1_prod`` is set to ``betas[0] ** step`` (Adam applied ``betas[0]`` at each
    step), so the bias correction :math:`1 - \beta_{1,\max}\pi` continues Adam's
    :math:`1 - \beta_1^{t}`; with the beta held at ``betas[0]`` (``lam=0``, restart
    variant with both betas equal to it) the run continues AdamW's to rounding.
    ``lr``, ``betas``, ``eps`` and ``weight_decay`` come from the state dict, as
    torch loads them; the AM hyper-parameters (``lam``, ``per_layer``, the
    variants), which it lacks, keep this optimizer's values. Refused with a
    ``ValueError``: an ``amsgrad=True`` state (``max_exp_avg_sq``), a weight decay
    of the other kind (Adam's L2 into ``AMAdamW``, AdamW's decoupled into ``AMAdam``)
    and any other optimizer's state (SGD's, AMSGD's).

    **Telemetry.** :meth:`latest_betas` returns the latest beta of every
    parameter (every scope) as device tensors, without synchronising.

    **No host synchronisation.** ``step()`` reads no device value on the host;
    the bias correction :math:`1-\beta_2^t` comes from the CPU step counters (from
    the device counters, on the device, with ``capturable=True``).
    State tensors are updated in place, so ``torch.compile`` of a function
    calling ``step()`` compiles once.

    **Precision.** Elementwise arithmetic runs in the compute dtype
    (float32 for float16/bfloat16 parameters) and the state is stored in the
    parameter dtype, as ``torch.optim.AdamW`` does: float16 parameters with
    large gradients stay finite.

    **Mixed precision.** ``torch.amp.GradScaler`` steps the optimizer with its
    scale and ``found_inf`` (``_step_supports_amp_scaling``): gradients are
    unscaled inside the step, and a step with an inf or NaN gradient leaves the
    parameters and the state as they were, decided on the device.

    **Schedulers.** Every ``torch.optim.lr_scheduler`` drives ``lr``; with
    ``cycle_momentum=True``, ``CyclicLR`` and ``OneCycleLR`` cycle ``betas[0]``,
    i.e. the cap :math:`\beta_{1,\max}` (which also enters the bias correction
    :math:`1 - \beta_{1,\max}\pi`), never the adaptive :math:`\beta_t`.

    Complex parameters are optimised as their real views; sparse gradients
    raise ``RuntimeError``; parameters whose ``grad`` is ``None`` are skipped.

    Examples
    --------
    >>> import torch
    >>> from amopt.torch import AMAdamW
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = torch.nn.Linear(3, 1)
    >>> opt = AMAdamW(model.parameters(), lr=1e-2)
    >>> x, y = torch.randn(16, 3), torch.randn(16, 1)
    >>> for _ in range(5):
    ...     opt.zero_grad()
    ...     torch.nn.functional.mse_loss(model(x), y).backward()
    ...     opt.step()
    >>> weight_beta, bias_beta = opt.latest_betas()[0]  # per-layer betas
    >>> bool(0.0 <= weight_beta <= 0.9 and 0.0 <= bias_beta <= 0.9)
    True
    """

    _weight_decay_modes: tuple[str, ...] = ("decoupled", "proximal")
    _name = "AMAdamW"
    _product_key = "beta1_prod"
    _state_keys = frozenset({"step", "exp_avg", "exp_avg_sq", "beta1_prod", "beta"})
    _migrated_keys = frozenset({"step", "exp_avg", "exp_avg_sq"})

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] | tuple[Tensor, Tensor] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        lam: float = 0.1,
        per_layer: bool = True,
        weight_decay_mode: str = "decoupled",
        variant: str | None = None,
        beta_min: float = 0.5,
        theta: float = 0.7,
        beta_high: float = 0.9,
        beta_low: float = 0.1,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        fused: bool | None = None,
        process_group: Any = None,
        amsgrad: bool = False,
        differentiable: bool = False,
    ) -> None:
        check_torch_options(self._name, {"amsgrad": amsgrad, "differentiable": differentiable})
        if isinstance(lam, bool):  # AdamW(params, lr, betas, eps, weight_decay, amsgrad) copied
            raise TypeError(
                f"lam must be a real number; got lam={lam!r}: the sixth positional argument "
                f"of {self._name} is lam where torch.optim.AdamW's is amsgrad; pass amsgrad "
                "by keyword"
            )
        defaults: dict[str, Any] = {
            "lr": lr,
            "betas": store_betas(betas),
            "eps": eps,
            "weight_decay": weight_decay,
            "lam": lam,
            "per_layer": per_layer,
            "weight_decay_mode": weight_decay_mode,
            "variant": variant,
            "beta_min": beta_min,
            "theta": theta,
            "beta_high": beta_high,
            "beta_low": beta_low,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "fused": fused,
            "process_group": process_group,
        }
        _validate(defaults, self._weight_decay_modes)
        super().__init__(params, defaults)
        _distributed.attach(self)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a param group; its hyper-parameters are validated like the constructor's."""
        check_torch_options(
            self._name, {k: v for k, v in param_group.items() if k in _TORCH_FIXED}
        )
        merged = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        _validate(merged, self._weight_decay_modes)
        super().add_param_group(param_group)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in _DEFAULTS.items():
                group.setdefault(key, value)
            group.setdefault("weight_decay_mode", self._weight_decay_modes[0])
            group.setdefault("weight_decay", 0.0)
            for p in group["params"]:
                state_p = self.state.get(p)
                if state_p and "beta1_prod" not in state_p:
                    dtype = compute_dtype([real_dtype(p)])
                    state_p["beta1_prod"] = torch.ones((), dtype=dtype, device=p.device)
        self._backfill_steps()

    def _foreign_advice(self) -> str:
        return (
            "AM-Adam carries over the state of torch.optim.Adam/AdamW without amsgrad "
            "(step, exp_avg, exp_avg_sq)"
        )

    def _migrated_groups(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A ``torch.optim.Adam``/``AdamW`` state dict, checked to mean what this one does."""
        name = self._name
        for i, (ours, saved) in enumerate(
            zip(self.param_groups, state_dict["param_groups"], strict=False)
        ):
            if saved.get("amsgrad"):
                raise ValueError(
                    f"{name}.load_state_dict: param group {i} was saved with amsgrad=True, "
                    f"which {name} does not support; {self._foreign_advice()}"
                )
            decoupled = saved.get("decoupled_weight_decay")
            mode = ours["weight_decay_mode"]
            if saved.get("weight_decay", 0) != 0 and decoupled is not None:
                if decoupled != (mode == "decoupled"):
                    saved_kind = "AdamW's decoupled" if decoupled else "Adam's L2"
                    use = "AMAdamW" if decoupled else "AMAdam"
                    raise ValueError(
                        f"{name}.load_state_dict: param group {i} was saved with "
                        f"{saved_kind} weight decay (weight_decay={saved['weight_decay']!r}, "
                        f"decoupled_weight_decay={decoupled!r}) and this optimizer's is "
                        f"weight_decay_mode={mode!r}; load it into {use}"
                    )
        return super()._migrated_groups(state_dict)

    def _migrate(self) -> None:
        r"""``beta1_prod = betas[0] ** step``: Adam's bias correction ``1 - beta1^t`` goes on.

        AM's correction is :math:`1 - \beta_{1,\max}\pi` with :math:`\pi` the product of
        the betas applied so far; Adam applied ``betas[0]`` at each of its ``step``
        steps. A global scope shares the product of its first member with state.
        """
        for group in self.param_groups:
            beta1 = float(as_float(group["betas"][0]))
            members = [p for p in group["params"] if self.state.get(p)]
            if not members:
                continue
            scopes = [[p] for p in members] if group["per_layer"] else [members]
            for scope in scopes:
                dtype = compute_dtype([real_dtype(p) for p in scope])
                device = scope[0].device
                step = float(self.state[scope[0]]["step"])
                prod = torch.tensor(beta1**step, dtype=dtype, device=device)
                beta = torch.tensor(beta1, dtype=dtype, device=device)
                for p in scope:
                    self.state[p]["beta1_prod"] = prod
                    self.state[p]["beta"] = beta
        warnings.warn(
            f"{self._name}.load_state_dict: loaded another optimizer's state dict (param "
            "groups without 'lam', as torch.optim.Adam/AdamW save): step, exp_avg and "
            "exp_avg_sq carried over, beta1_prod set to betas[0] ** step (Adam's bias "
            "correction continues), lr, betas, eps and weight_decay loaded from it, and the "
            "AM hyper-parameters (lam, per_layer, variant, ...) kept from this optimizer",
            UserWarning,
            stacklevel=3,
        )

    def _init_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        exp_avgs: list[Tensor],
        exp_avg_sqs: list[Tensor],
        state_steps: list[Tensor],
        beta1_prods: list[Tensor],
    ) -> None:
        group_prod = None
        if not group["per_layer"]:  # the scope's current product, held by every stepped member
            for p in group["params"]:
                state = self.state.get(p)
                if state and "beta1_prod" in state:
                    group_prod = state["beta1_prod"]
                    break
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(
                    f"{self._name} does not support sparse gradients: the beta rule needs "
                    "dense inner products of the gradient and the momentum buffer"
                )
            state = self.state[p]
            if len(state) == 0:
                if group["fused"]:
                    check_fused_device(p)
                state["step"] = new_step(p.device if group["capturable"] else None)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group_prod is None:
                    dtype = compute_dtype([real_dtype(p)])
                    state["beta1_prod"] = torch.ones((), dtype=dtype, device=p.device)
                    if not group["per_layer"]:  # one product shared by the scope
                        group_prod = state["beta1_prod"]
                else:
                    state["beta1_prod"] = group_prod
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            state_steps.append(state["step"])
            beta1_prods.append(state["beta1_prod"])
        self._init_betas(group, params)

    def _hyper(self, group: dict[str, Any], lr: Any, value: Any, lr_ratio: Any) -> AdamHyper:
        return _group_hyper(group, lr, lr_ratio)

    def _check_step(self, group: dict[str, Any], t: AdamTensors) -> None:
        if group["capturable"]:
            check_capturable(t.params, t.state_steps)


class AMAdam(AMAdamW):
    r"""Adam with Adaptive Memory momentum (AM-Adam); weight decay is an L2 term in the gradient.

    Identical to :class:`AMAdamW` with :math:`\mu = 0` in the beta rule and the
    update, except that ``weight_decay`` (default 0) adds the L2 gradient
    :math:`\mu x` to :math:`g` first, as ``torch.optim.Adam`` does:

    .. math::

        g \leftarrow \nabla f(x) + \mu x, \qquad
        \beta_t = \operatorname{clip}\Big(\frac{\sum g^2/p - \lambda u (d-g)^2}
                                              {\sum w (d-g)^2}, 0, \beta_{1,\max}\Big), \qquad
        x \leftarrow x - \eta\, d / p,

    with :math:`p, u, w` and the update of :math:`d` as in :class:`AMAdamW`.
    Its param groups carry ``weight_decay_mode="l2"`` (``"decoupled"`` with
    ``decoupled_weight_decay=True``).

    Parameters
    ----------
    params, lr, betas, eps, lam, per_layer
        As in :class:`AMAdamW`.
    variant, beta_min, theta, beta_high, beta_low, maximize, foreach, capturable, fused
        As in :class:`AMAdamW`.
    process_group, amsgrad, differentiable
        As in :class:`AMAdamW`.
    weight_decay : float, default 0
        L2 penalty coefficient :math:`\mu \ge 0` added to the gradient.
    decoupled_weight_decay : bool, default False
        As in ``torch.optim.Adam``: ``True`` decays the weights as :class:`AMAdamW`
        does (its param groups then carry ``weight_decay_mode="decoupled"`` and its
        steps are AMAdamW's), as ``torch.optim.Adam(decoupled_weight_decay=True)``
        is ``torch.optim.AdamW``.

    Examples
    --------
    >>> import torch
    >>> from amopt.torch import AMAdam
    >>> w = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    >>> opt = AMAdam([w], lr=0.1, lam=0.0)
    >>> (w ** 2).sum().backward()
    >>> opt.step()
    >>> w.detach().tolist()  # the first step is Adam's: x - lr * sign(g)
    [0.9000000005, -1.90000000025]
    """

    _weight_decay_modes = ("l2", "decoupled")
    _name = "AMAdam"

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] | tuple[Tensor, Tensor] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        lam: float = 0.1,
        per_layer: bool = True,
        variant: str | None = None,
        beta_min: float = 0.5,
        theta: float = 0.7,
        beta_high: float = 0.9,
        beta_low: float = 0.1,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        fused: bool | None = None,
        process_group: Any = None,
        amsgrad: bool = False,
        differentiable: bool = False,
        decoupled_weight_decay: bool = False,
    ) -> None:
        check_bool("decoupled_weight_decay", decoupled_weight_decay)
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            lam=lam,
            per_layer=per_layer,
            # torch.optim.Adam(decoupled_weight_decay=True) is AdamW: so is this AMAdamW's step
            weight_decay_mode="decoupled" if decoupled_weight_decay else "l2",
            variant=variant,
            beta_min=beta_min,
            theta=theta,
            beta_high=beta_high,
            beta_low=beta_low,
            maximize=maximize,
            foreach=foreach,
            capturable=capturable,
            fused=fused,
            process_group=process_group,
            amsgrad=amsgrad,
            differentiable=differentiable,
        )


# --------------------------------------------------------------------------- functional


def am_adamw(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    state_steps: list[Tensor],
    beta1_prods: list[Tensor],
    foreach: bool | None = None,
    *,
    fused: bool | None = None,
    grad_scale: Tensor | None = None,
    found_inf: Tensor | None = None,
    lr: float | Tensor = 1e-3,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-2,
    weight_decay_mode: str = "decoupled",
    lam: float = 0.1,
    per_layer: bool = True,
    variant: str | None = None,
    beta_min: float = 0.5,
    theta: float = 0.7,
    beta_high: float = 0.9,
    beta_low: float = 0.1,
    maximize: bool = False,
    capturable: bool = False,
    process_group: Any = None,
    lr_ratio: float | Tensor = 1.0,
) -> tuple[list[Tensor], list[Tensor]]:
    r"""Functional AM-AdamW / AM-Adam: one step over ``params`` in place. See :class:`AMAdamW`.

    All tensors given form one param group.

    Parameters
    ----------
    params, grads : list of Tensor
        Parameters (updated in place) and their dense gradients.
    exp_avgs, exp_avg_sqs : list of Tensor
        :math:`d` and :math:`v` (zeros before the first step), updated in place.
    state_steps : list of Tensor
        0-d step counters on the CPU, incremented in place.
    beta1_prods : list of Tensor
        0-d running products :math:`\pi` (ones before the first step). With
        ``per_layer=False`` the first entry is the product of the whole scope.
    foreach, fused : bool or None
        The implementation, as in :class:`AMAdamW`: with both ``None``, the fastest
        one for the tensors' device and dtype.
    grad_scale, found_inf : Tensor, optional
        ``torch.amp.GradScaler``'s protocol: the gradients are divided by
        ``grad_scale``, and where the 0-d ``found_inf`` is non-zero the step leaves
        the parameters, moments, products and step counters as they were
        (decided on the device; the returned ``beta1_prods`` are then the old ones).
    lr, beta1, beta2, eps, weight_decay, lam, per_layer
        As in :class:`AMAdamW` (``beta1`` is :math:`\beta_{1,\max}`).
    variant, beta_min, theta, beta_high, beta_low, maximize
        As in :class:`AMAdamW`.
    weight_decay_mode : {"decoupled", "proximal", "l2"}
        ``"l2"`` is AM-Adam: ``weight_decay * x`` is added to the gradient and
        the beta rule and update use no decay.
    capturable : bool, default False
        As in :class:`AMAdamW`: the parameters and ``state_steps`` must be on a device
        ``torch.optim`` supports for graph capture (checked unless ``torch.compile``
        is tracing); nothing then runs on the host.
    process_group : ProcessGroup, optional
        With ``per_layer=False``: the ranks whose plain-tensor ``params`` together
        form the scope. DTensors are combined over their device mesh.
    lr_ratio : float, default 1
        :math:`r = \eta_{t-1}/\eta_t`, the previous step's lr over this one's
        (:func:`amopt.core.rule.lr_ratio`, :func:`amopt.core.rule.adam_weights`): Supplement D
        estimates the decrease of f by the previous step, taken with
        :math:`\eta_{t-1}`. 1 at a constant lr and on the first step; :class:`AMAdamW`
        keeps it per param group.

    Returns
    -------
    betas, beta1_prods : list of Tensor
        Per parameter, the 0-d beta applied and the updated product of its scope.

    Examples
    --------
    >>> import torch
    >>> from amopt.torch import am_adamw
    >>> x = torch.tensor([1.0, -1.0], dtype=torch.float64)
    >>> d, v = [torch.zeros_like(x)], [torch.zeros_like(x)]
    >>> steps, prods = [torch.tensor(0.0)], [torch.tensor(1.0, dtype=torch.float64)]
    >>> betas, prods = am_adamw([x], [2 * x], d, v, steps, prods, lr=0.1, weight_decay=0.0)
    >>> float(betas[0]), float(prods[0])  # step 1: beta = beta1_max
    (0.9, 0.9)
    """
    check_choice("weight_decay_mode", weight_decay_mode, WEIGHT_DECAY_MODES)
    if capturable:
        check_capturable(params, state_steps)
    config = rule_config(
        lam=lam,
        beta_max=as_float(beta1),
        numerator="linear",
        per_layer=per_layer,
        variant=variant,
        beta_min=beta_min,
        theta=theta,
        beta_high=beta_high,
        beta_low=beta_low,
    )

    def hyper(path: str) -> AdamHyper:
        return AdamHyper(
            hyper_lr(lr, path),
            as_float(beta2),
            eps,
            weight_decay,
            weight_decay_mode,
            maximize,
            config,
            hyper_ratio(lr_ratio, lr, path),
        )

    t = AdamTensors(params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods)
    amp = Scaler(grad_scale, found_inf)
    return functional(
        _PATHS,
        t,
        hyper,
        amp,
        fused=fused,
        foreach=foreach,
        per_layer=per_layer,
        process_group=process_group,
    )


def _saturate(v: Tensor) -> Tensor:
    """A half-precision ``v`` in float32, an overflowed (inf) entry as the dtype's maximum.

    ``g^2`` beyond the float16 range stores ``v = inf`` (as in ``torch.optim.AdamW``);
    saturating it keeps the preconditioner finite, and the step with it.
    """
    return v.float().clamp_(max=torch.finfo(v.dtype).max)


def _single_tensor_am_adamw(
    t: AdamTensors, h: AdamHyper, sync: _distributed.ScopeSync | None = None
) -> tuple[list[Tensor], list[Tensor]]:
    params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods = t
    lr, beta2, eps, weight_decay, weight_decay_mode, maximize, config, lr_ratio = h
    n = len(params)
    if n == 0:
        return [], []
    lam = config.lam
    wd = 0.0 if weight_decay_mode == "l2" else weight_decay
    base = _rule.adam_weights(config, lr=lr, weight_decay=wd)
    weights = _rule.adam_weights(config, lr=lr, weight_decay=wd, lr_ratio=lr_ratio)

    gs: list[Tensor] = []
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        if weight_decay_mode == "l2" and weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        grad = as_real(grad)
        state_steps[i] += 1
        # step 1: v = beta2 v + (1 - beta2) g^2
        as_real(exp_avg_sqs[i]).mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        gs.append(grad)
    ds = [as_real(t) for t in exp_avgs]
    vs = [as_real(t) for t in exp_avg_sqs]
    xs = [as_real(t) for t in params]
    roots = bias_correction_roots(state_steps, beta2)  # sqrt(1 - beta2^t)

    # reduce: N, D, ref of each scope, with p = c (eps + sqrt(v_hat)) of the scope's c
    scopes = [[i] for i in range(n)] if config.per_layer else [list(range(n))]
    accs = [compute_dtype(gs[i].dtype for i in scope) for scope in scopes]
    # compiled: each tensor's sums go to the rule operator one by one (see rule_from_sums)
    traced = torch.compiler.is_compiling() and sync is None and len(set(accs)) == 1
    if torch.compiler.is_compiling():  # the terms of any r (g d / p always)
        used = [k for k, a_k in enumerate(base) if k in (0, 2) or a_k != 0]
    else:
        used = [k for k, a_k in enumerate(weights) if k == 0 or a_k != 0]
    ps: list[Tensor] = [gs[0]] * n  # placeholders, all overwritten below
    rows, prods, parts = [], [], []
    for scope, acc in zip(scopes, accs, strict=True):
        prod = beta1_prods[scope[0]].to(acc)
        c = _rule.adam_correction(prod, config)  # step 2
        nums, dens, refs = [], [], []
        for i in scope:
            g, d, x = gs[i], ds[i], xs[i]
            # step 3, in float32 for half precision, and sqrt(v) first: v / (1 - beta2^t)
            # overflows float16 (and float32 for |g| above about 1e19)
            op = compute_dtype([g.dtype])
            v_op = vs[i].to(op) if vs[i].dtype == op else _saturate(vs[i])
            p = v_op.sqrt().div_(roots[i]).add_(eps).mul_(c.to(device=g.device, dtype=op))
            ps[i] = p
            # step 4, the weighted terms of algorithms.md in the compute dtype, each
            # a ratio of size O(1) (g/p, u (d-g), w (d-g), w d, w g with p ~ |g|) times g,
            # d, d-g or x, never g*g: no term underflows or overflows where g itself fits
            g_, d_, x_, p_ = (t.to(acc) for t in (g, d, x, p))
            u = 1.0 / (1.0 + lam * p_)
            w = u / p_
            v = d_ - g_
            ratio = g_ / p_
            terms = [ratio * g_, u * v * v, ratio * d_, g_ * x_, d_ * x_]
            # a sum per term, weighted after: one small reduction each, which the
            # compiler fuses into one loop (their weighted sum as one elementwise
            # expression is large enough for it to store in a temporary first)
            term_sums = [terms[k].sum() for k in used]
            den = (w * v * v).sum()
            ref_d, ref_g = (w * d_ * d_).sum(), (w * g_ * g_).sum()
            if traced:
                parts += [*term_sums, den, ref_d, ref_g]
                continue
            num = weights[0] * term_sums[0]
            for k, term_sum in zip(used[1:], term_sums[1:], strict=True):
                num = num + weights[k] * term_sum
            nums.append(num)
            dens.append(den)
            refs.append(ref_d + ref_g)
        if not traced:
            rows.append(torch.stack([total(nums), total(dens), total(refs)]))
        prods.append(prod)

    # rule (step 5) and the products (step 8)
    # a scope's first step: its product is still 1 (algorithms.md section 3, step 5)
    firsts = [prod == 1.0 for prod in prods]
    if traced:
        beta = _traced_ops.rule_from_sums(
            _rule.adam_beta,
            parts,
            config,
            accs[0],
            weights=[base[k] for k in used],
            lr=lr,
            weight_decay=wd,
            first=torch.stack(firsts),
            lr_ratio=lr_ratio,  # the operator weighs the terms itself (ratio_of)
            terms=used,
        )
    else:
        rows = _distributed.sync_sums(sync, rows)  # sharded scopes: add the sums of all ranks
        beta = rule_by_rows(_rule.adam_beta, rows, config, lr=lr, weight_decay=wd, first=firsts)
    new_prod = [prod * b for prod, b in zip(prods, beta, strict=True)]

    # apply: steps 6 and 7
    betas: list[Tensor] = [beta] * n  # placeholders, all overwritten below
    out_prods: list[Tensor] = [beta] * n
    for k, scope in enumerate(scopes):
        beta_k = beta[k]
        for i in scope:
            p = ps[i]  # the elementwise update runs in p's dtype, stored in the param dtype
            g, d, x = (t.to(p.dtype) for t in (gs[i], ds[i], xs[i]))
            lam_p = lam * p
            coef = (beta_k.to(device=p.device, dtype=p.dtype) + lam_p) / (1.0 + lam_p)
            d.sub_(g).mul_(coef).add_(g)  # step 6: d = g + coef * (d - g)
            if weight_decay_mode == "proximal":  # step 7
                x.addcdiv_(d, p, value=-lr)
                if wd != 0:
                    x.div_(1.0 + lr * wd)
            else:
                if wd != 0:
                    x.mul_(1.0 - lr * wd)
                x.addcdiv_(d, p, value=-lr)
            for low, high in ((ds[i], d), (xs[i], x)):
                if low is not high:
                    low.copy_(high)
            betas[i] = beta_k
            out_prods[i] = new_prod[k]
    return betas, out_prods


_NEW_TENSORS = True


class _AdamKernels:
    """The foreach reduce and apply kernels of one (device, dtype) bucket.

    They run in the bucket's :func:`~amopt.torch._common.foreach_mode`: on the CPU chunk
    by chunk in cache-sized scratch buffers (:func:`~amopt.torch._common.chunks`,
    :class:`~amopt.torch._common.Scratch`; no parameter-sized temporary), or over whole
    tensors, one multi-tensor op per pass (a small CPU bucket, ``torch.compile``), or on
    other devices over 1-D views with per-tensor values spread over the elements
    (:class:`~amopt.torch._common.Flat`), so that each pass is one kernel launch whatever
    the tensor count. ``p`` is formed again in the apply pass rather than kept.

    Every sum is a multi-tensor sum of squares (``torch._foreach_powsum``), with
    ``s = 1 / sqrt(p)``, ``y = d - g``, ``u = 1 / (1 + lam p)`` and ``w = u / p``:

    ``A = |g s|^2`` (``g*g/p``), ``B = |y sqrt(u)|^2`` (``u (d-g)^2``), ``D = |y s
    sqrt(u)|^2`` (``w (d-g)^2``) and ``ref = |d s sqrt(u)|^2 + |g s sqrt(u)|^2``
    (``w d^2 + w g^2``); the signed terms of the numerator by polarisation,
    ``a2 <g, d>/p + <x, a3 g + a4 d> = (|P+|^2 - |P-|^2) / 4`` with the pairs
    ``P+- = (g s +- a2 d s, x / s +- (a3 g + a4 d) s)``. Each squared value is of the
    size of ``sqrt(|g|)`` (``p ~ |g|``), so no square leaves the float32 range where ``g``
    is in it (``g * g`` would below about 1e-19 and above about 1e19); ``y sqrt(u)`` may
    underflow for tiny gradients, where its weight ``lam`` times ``p ~ |g|`` makes it
    negligible next to ``g*g/p``. The two halves of each pair are of one size
    (``x sqrt(p)`` and ``z / sqrt(p)`` both scale as ``sqrt(|g|)``), so the polarisation
    loses about what a dot product's own rounding does.
    """

    def __init__(
        self,
        lists: tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]],
        c: Tensor,
        roots: list[Tensor],
        *,
        eps: float,
        lam: float,
        reduce_dtype: torch.dtype,
    ) -> None:
        from amopt.torch._common import Flat, foreach_mode, foreach_sqsum, piece_sums

        self._sqsum, self._piece_sums = foreach_sqsum, piece_sums

        gs = lists[1]
        self.dtype = gs[0].dtype
        self.op = compute_dtype([self.dtype])  # elementwise: float32 for half precision
        self.rd = reduce_dtype
        self.device = gs[0].device
        self.n = len(gs)
        numels = [t.numel() for t in gs]
        contiguous = all(t.is_contiguous() for ts in lists for t in ts)
        self.mode = foreach_mode(
            self.device, sum(numels), half=self.dtype != self.op, contiguous=contiguous
        )
        self.eps, self.lam = eps, lam
        self.flat: Any = None
        self.op_scratch: Scratch | None = None
        if self.mode == "chunks":
            n_scratch = 7 + (3 if self.dtype != self.op else 0)
            size = chunk_elements(self.device, sum(numels), n_scratch)
            self.chunks = chunks(lists, size)
            self.op_scratch = Scratch(self.chunks, self.op)
        elif self.mode == "flat":
            self.flat = Flat(numels, self.device)
            self.chunks = [list(enumerate(zip(*(Flat.views(ts) for ts in lists), strict=True)))]
        else:
            self.chunks = [list(enumerate(zip(*lists, strict=True)))]
        self.c = self._values(c)
        self.roots = self._values(roots)

    def _values(self, values: Tensor | list[Tensor]) -> Any:
        """Per-tensor values as the operands of this mode: 0-d tensors, or spread."""
        if self.mode != "flat":
            if isinstance(values, Tensor):
                return values if values.dim() == 0 else list(values.unbind())
            return values
        if not isinstance(values, Tensor):
            values = torch.stack(values)
        values = values.to(device=self.device, dtype=self.op, non_blocking=True)
        return self.flat.spread(values)

    def _of(self, values: Any, owners: list[int]) -> Any:
        """``values`` for the pieces of a chunk (owned by the tensors ``owners``)."""
        if isinstance(values, Tensor) or self.mode == "flat":
            return values
        return [values[i] for i in owners]

    def _pieces(self, chunk: list[Piece]) -> tuple[list[int], list[list[Tensor]]]:
        owners = [i for i, _ in chunk]
        return owners, [list(ts) for ts in zip(*(part for _, part in chunk), strict=True)]

    # one op per pass: into a scratch buffer (chunks) or a new tensor per input

    def _new(self, k: int, name: str, a: list[Tensor], *args: Any, **kwargs: Any) -> list[Tensor]:
        """``torch._foreach_<name>(a, ...)``: in scratch buffer ``k`` (chunks) or new tensors."""
        if self.op_scratch is None or _NEW_TENSORS:
            return list(getattr(torch, f"_foreach_{name}")(a, *args, **kwargs))
        out = self.op_scratch(k, a)
        torch._foreach_copy_(out, a)
        getattr(torch, f"_foreach_{name}_")(out, *args, **kwargs)
        return out

    def _in(self, k: int, tensors: list[Tensor]) -> list[Tensor]:
        """``tensors`` in the elementwise dtype: themselves, or a copy."""
        if tensors[0].dtype == self.op:
            return tensors
        if self.op_scratch is not None:
            out = self.op_scratch(k, tensors)
        elif self.flat is not None:
            out = self.flat.empty(self.op)
        else:
            return [t.to(self.op) for t in tensors]
        torch._foreach_copy_(out, tensors)
        return out

    def _dot(self, a: Tensor, b: Tensor) -> Tensor:
        from amopt.torch._common import dot

        out = dot(a, b)
        return out if self.rd == self.op else out.to(self.rd)

    def _powsum(self, tensors: list[Tensor]) -> list[Tensor]:
        rd = None if self.rd == self.op else self.rd
        return self._sqsum(tensors, rd)

    def _precondition(self, owners: list[int], vs: list[Tensor]) -> list[Tensor]:
        """Step 3, ``p = c (eps + sqrt(v) / sqrt(1 - beta2^t))``, in the elementwise dtype."""
        if vs[0].dtype == self.op:
            p = self._new(0, "sqrt", vs)  # sqrt(v) first: v / (1 - beta2^t) may overflow
        else:  # half precision: an overflowed v = inf saturates
            p = self._in(0, vs)
            torch._foreach_clamp_max_(p, torch.finfo(vs[0].dtype).max)
            torch._foreach_sqrt_(p)
        torch._foreach_div_(p, self._of(self.roots, owners))
        torch._foreach_add_(p, self.eps)
        torch._foreach_mul_(p, self._of(self.c, owners))
        return p

    def reduce(self, beta2: float, weights: tuple[float, ...]) -> Tensor:
        """Steps 1, 3 and 4: updates ``v``; the sums ``(num, den, ref)`` of each tensor."""
        lam = self.lam
        a0, a1, a2, a3, a4 = weights
        cross = a3 != 0 or a4 != 0
        signed = (a2, a3, a4)  # weights of <g/p, d>, <g, x>, <d, x>
        if self.mode == "chunks":  # each a dot product
            signed_w = [a_k for a_k in signed if a_k != 0]
        else:  # polarised pairs
            signed_w = [0.25, -0.25] * (int(a2 != 0) + int(cross))
        # the sums of each piece, in this order: A, the signed sums (dot products, or
        # |P+|^2 and |P-|^2 of each pair), D, |g sqrt(w)|^2, |d sqrt(w)|^2, B
        parts, owner_ids = [], []
        for chunk in self.chunks:
            owners, (xs, gs, ds, vs) = self._pieces(chunk)
            torch._foreach_mul_(vs, beta2)  # step 1
            torch._foreach_addcmul_(vs, gs, gs, 1 - beta2)
            p = self._precondition(owners, vs)
            g, d = self._in(7, gs), self._in(8, ds)
            s = self._new(1, "rsqrt", p)  # 1 / sqrt(p)
            if lam != 0:
                su = self._new(4, "mul", p, lam)
                torch._foreach_add_(su, 1.0)
                torch._foreach_rsqrt_(su)  # sqrt(u)
            del p  # whole tensors: fewer parameter-sized temporaries alive at once
            gs_, ds_ = self._new(2, "mul", g, s), self._new(3, "mul", d, s)
            res = [self._powsum(gs_)]  # A
            if self.mode == "chunks":  # pieces in cache: a dot product reads them once more
                x = self._in(9, xs) if cross else xs
                for a_k, (u_, v_) in zip(signed, ((gs_, ds_), (g, x), (d, x)), strict=True):
                    if a_k != 0:
                        res.append([self._dot(ui, vi) for ui, vi in zip(u_, v_, strict=True)])
            else:  # polarised pairs, one after the other: (|P+|^2 - |P-|^2) / 4
                if a2 != 0:
                    pair = self._new(5, "add", gs_, ds_, alpha=a2)
                    res.append(self._powsum(pair))
                    torch._foreach_sub_(pair, ds_, alpha=2 * a2)
                    res.append(self._powsum(pair))
                    del pair
                if cross:
                    xsp = self._new(5, "div", self._in(9, xs), s)  # x sqrt(p)
                    z = self._new(6, "mul", gs_, a3)  # (a3 g + a4 d) / sqrt(p)
                    torch._foreach_add_(z, ds_, alpha=a4)
                    torch._foreach_add_(xsp, z)
                    res.append(self._powsum(xsp))
                    torch._foreach_sub_(xsp, z, alpha=2)
                    res.append(self._powsum(xsp))
                    del xsp, z
            y = self._new(6, "sub", ds_, gs_)  # (d - g) / sqrt(p)
            if lam != 0:
                for t in (y, gs_, ds_):
                    torch._foreach_mul_(t, su)  # (d - g) sqrt(w), g sqrt(w), d sqrt(w)
                res += [self._powsum(y), self._powsum(gs_), self._powsum(ds_)]
                torch._foreach_div_(y, s)  # (d - g) sqrt(u)
                res.append(self._powsum(y))
            else:  # u = 1, w = 1/p; B has weight -lam = 0
                res += [self._powsum(y), res[0], self._powsum(ds_), res[0]]
            parts.append(self._piece_sums(res))
            owner_ids += owners
        sums = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
        if len(owner_ids) != self.n:  # tensors cut into pieces: add the pieces up
            index = torch.tensor(owner_ids, device=sums.device)
            sums = sums.new_zeros(sums.shape[0], self.n).index_add_(1, index, sums)
        num = sums[0] if a0 == 1.0 else a0 * sums[0]
        for j, a_j in enumerate(signed_w, start=1):
            num = num + a_j * sums[j]
        k = 1 + len(signed_w)
        den, wg, wd_, b = sums[k], sums[k + 1], sums[k + 2], sums[k + 3]
        if lam != 0:
            num = num + a1 * b
        return torch.stack([num, den, wd_ + wg], -1)

    def apply(self, one_minus_beta: Tensor, *, lr: float, weight_decay: float, mode: str) -> None:
        """Steps 6 and 7 with ``1 - beta`` of each tensor, in the elementwise dtype.

        ``d = g + (beta + lam p)/(1 + lam p) (d - g)`` is ``lerp(d, g, (1 - beta) u)``.
        """
        omb = self._values(one_minus_beta)
        for chunk in self.chunks:
            owners, (xs, gs, ds, vs) = self._pieces(chunk)
            p = self._precondition(owners, vs)
            g, d, x = self._in(7, gs), self._in(8, ds), self._in(9, xs)
            if self.lam != 0:
                weight = self._new(1, "mul", p, self.lam)
                torch._foreach_add_(weight, 1.0)
                torch._foreach_reciprocal_(weight)  # u
                torch._foreach_mul_(weight, self._of(omb, owners))
                torch._foreach_lerp_(d, g, weight)  # step 6
            else:
                step = self._new(1, "sub", g, d)
                torch._foreach_mul_(step, self._of(omb, owners))
                torch._foreach_add_(d, step)  # step 6: d + (1 - beta) (g - d)
            if mode == "proximal":  # step 7
                torch._foreach_addcdiv_(x, d, p, value=-lr)
                if weight_decay != 0:
                    torch._foreach_div_(x, 1.0 + lr * weight_decay)
            else:
                if weight_decay != 0:
                    torch._foreach_mul_(x, 1.0 - lr * weight_decay)
                torch._foreach_addcdiv_(x, d, p, value=-lr)
            if d is not ds:  # half precision: store back in the parameter dtype
                torch._foreach_copy_(ds, d)
                torch._foreach_copy_(xs, x)


def _multi_tensor_am_adamw(
    t: AdamTensors, h: AdamHyper, sync: _distributed.ScopeSync | None = None
) -> tuple[list[Tensor], list[Tensor]]:
    params, grads, exp_avgs, exp_avg_sqs, state_steps, beta1_prods = t
    lr, beta2, eps, weight_decay, weight_decay_mode, maximize, config, lr_ratio = h
    n = len(params)
    if n == 0:
        return [], []
    lam, per_layer = config.lam, config.per_layer
    wd = 0.0 if weight_decay_mode == "l2" else weight_decay
    weights = _rule.adam_weights(config, lr=lr, weight_decay=wd, lr_ratio=lr_ratio)
    scope_acc = compute_dtype([real_dtype(p) for p in params])
    scope_prod = beta1_prods[0].to(scope_acc)
    grouped = Optimizer._group_tensors_by_device_and_dtype(
        [params, grads, exp_avgs, exp_avg_sqs, state_steps],  # type: ignore[list-item]
        with_indices=True,
    )

    # reduce, per (device, dtype) bucket: v, then the sums of each tensor
    buckets = []
    for (
        dev_params_,
        dev_grads_,
        dev_exp_avgs_,
        dev_exp_avg_sqs_,
        dev_steps_,
    ), indices in grouped.values():
        dev_params = list(dev_params_)
        l2 = weight_decay if weight_decay_mode == "l2" else 0.0
        dev_grads = foreach_grads(dev_grads_, dev_params, maximize, l2)
        dev_steps = list(dev_steps_)
        if dev_steps[0].is_cpu:  # one wrapped 1 for the per-counter loop of the CPU
            torch._foreach_add_(dev_steps, torch.tensor(1.0), alpha=1.0)
        else:  # capturable=True: counters on the device, nothing made on the host
            torch._foreach_add_(dev_steps, 1.0)
        lists = tuple(
            [as_real(t) for t in ts]
            for ts in (dev_params, dev_grads, dev_exp_avgs_, dev_exp_avg_sqs_)
        )
        device, dtype = lists[1][0].device, lists[1][0].dtype
        op = compute_dtype([dtype])  # elementwise dtype: float32 for half precision
        acc = op if per_layer else scope_acc
        if per_layer:
            prods = torch.stack([beta1_prods[k].to(device) for k in indices]).to(acc)
            c = _rule.adam_correction(prods, config).to(op)  # step 2, per tensor
        else:
            prods = scope_prod
            c_scope = _rule.adam_correction(prods, config)
            c = c_scope.to(device=device, dtype=op, non_blocking=True)  # one for all
        kernels = _AdamKernels(
            lists, c, bias_correction_roots(dev_steps, beta2), eps=eps, lam=lam, reduce_dtype=acc
        )
        sums = kernels.reduce(beta2, weights)
        buckets.append((kernels, indices, prods, sums))

    # rule (step 5, and 8): beta per tensor (vectorised per bucket) or one over all buckets
    betas: list[Tensor] = [params[0]] * n  # placeholders, all overwritten below
    new_prods: list[Tensor] = [params[0]] * n
    if per_layer:
        bucket_sums = [b[3] for b in buckets]
    else:
        device = buckets[0][3].device
        rows = [b[3].sum(0).to(device, non_blocking=True) for b in buckets]
        bucket_sums = [rows[0] if len(rows) == 1 else torch.stack(rows).sum(0)]
    # sharded scopes: add the sums of all ranks
    bucket_sums = _distributed.sync_sums(sync, bucket_sums, [b[1] for b in buckets])
    steps: list[tuple[_AdamKernels, Tensor]] = []
    if per_layer:
        for (kernels, indices, prods, _), sums in zip(buckets, bucket_sums, strict=True):
            beta = _rule.adam_beta(
                torch, sums, config, lr=lr, weight_decay=wd, first=prods.to(sums.device) == 1.0
            )
            prod = prods * beta
            for k, b, pr in zip(indices, beta.unbind(), prod.unbind(), strict=True):
                betas[k] = b
                new_prods[k] = pr
            steps.append((kernels, (1.0 - beta).to(kernels.op)))
    else:
        sums = bucket_sums[0]
        first = scope_prod.to(sums.device) == 1.0
        beta = _rule.adam_beta(torch, sums, config, lr=lr, weight_decay=wd, first=first)
        betas = [beta] * n
        new_prods = [scope_prod * beta] * n
        for kernels, *_ in buckets:
            one_minus = (1.0 - beta).to(device=kernels.device, dtype=kernels.op, non_blocking=True)
            steps.append((kernels, one_minus))

    # apply: steps 6 and 7, in the elementwise dtype, stored in the param dtype
    for kernels, one_minus_beta in steps:
        kernels.apply(one_minus_beta, lr=lr, weight_decay=wd, mode=weight_decay_mode)
    return betas, new_prods


_PATHS = family_paths(_fused_ops.ADAM, sys.modules[__name__], "adam")
AMAdamW._paths = _PATHS
#: The fused C step with its foreach fallback (what ``amopt::fused_am_adamw_`` runs).
_fused_am_adamw = partial(fused_step, _PATHS)
