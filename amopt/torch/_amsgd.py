r"""``AMSGD``: SGD with Adaptive Memory momentum (the paper's AM-MSGD) for ``torch.optim``."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import Optimizer, ParamsT

from amopt.core import rule as _rule
from amopt.core.config import AMConfig, check_interval
from amopt.torch import _distributed, _fused_ops, _traced_ops
from amopt.torch._common import (
    cast,
    check_fused_device,
    check_group_flags,
    check_lr,
    check_torch_options,
    foreach_grads,
    foreach_sqsum,
    group_rule_config,
    hyper_lr,
    hyper_ratio,
    new_step,
    rule_by_rows,
    rule_config,
    sqsum,
    torch_worded,
    total,
    unscale,
)
from amopt.torch._records import (
    Scaler,
    SGDHyper,
    SGDTensors,
    as_real,
    compute_dtype,
    real_dtype,
    scope_sums,
    wide_dtype,
)
from amopt.torch._step import StepTemplate, family_paths, functional

__all__ = ["AMSGD", "amsgd"]

#: ``torch.optim.SGD`` keywords taken at torch's default only (``check_torch_options``).
_TORCH_FIXED = ("dampening", "nesterov", "differentiable")

#: The default cap; ``beta_max is _CAP`` tells an omitted ``beta_max`` from a given one.
_CAP = 0.9

_DEFAULTS: dict[str, Any] = {
    "lam": 0.1,
    "beta_max": 0.9,
    "weight_decay": 0.0,
    "per_layer": False,
    "variant": None,
    "beta_min": 0.5,
    "theta": 0.7,
    "beta_high": 0.9,
    "beta_low": 0.1,
    "maximize": False,
    "foreach": None,
    "fused": None,
    "process_group": None,
}


def _config(group: dict[str, Any], beta_max: float | None = None) -> AMConfig:
    """The group's rule configuration (validated; built once per distinct value)."""
    return group_rule_config(group, group["beta_max"] if beta_max is None else beta_max)


def _group_hyper(
    group: dict[str, Any], lr: Any, beta_max: float, lr_ratio: float = 1.0
) -> SGDHyper:
    """The hyper-parameters of a step of ``group`` (the Triton driver's own records)."""
    config = _config(group, beta_max)
    return SGDHyper(lr, group["weight_decay"], group["maximize"], config, lr_ratio)


def _validate(group: dict[str, Any]) -> None:
    check_lr(group["lr"])  # a tensor lr on every path, as torch.optim.SGD takes one
    _config(group)
    check_group_flags(group, nonnegative=("weight_decay",))


class AMSGD(StepTemplate):
    r"""SGD with Adaptive Memory momentum (AM-MSGD, Topollai & Choromanska, AISTATS 2026).

    The momentum coefficient :math:`\beta_t` is not fixed: it is computed in
    closed form at every step from a two-plane proximal model of the loss
    (``docs/algorithms.md``, section 2, linearised numerator):

    .. math::

        g_t &\leftarrow \nabla f_t(x_t) + \mu x_t
              \quad(\text{negated first when } \textit{maximize}), \qquad
              d_0 = g_0, \\
        v_t &= d_t - g_t, \qquad
        \beta_t = \operatorname{clip}\Big(
            \frac{(1+\lambda)\langle g_t, g_t\rangle - \lambda \langle v_t, v_t\rangle}
                 {\langle v_t, v_t\rangle}, 0, \beta_{\max}\Big), \\
        d_{t+1} &= g_t + \frac{\beta_t + \lambda}{1 + \lambda}\, v_t, \qquad
        x_{t+1} = x_t - \eta\, d_{t+1},

    with :math:`\beta_t = 0` whenever :math:`\langle v,v\rangle \le \epsilon^2
    (\langle d,d\rangle + \langle g,g\rangle)` (:math:`\epsilon` the machine
    epsilon of the compute dtype), which makes step 0 a plain gradient
    step. Inner products run over the *beta scope*: every parameter of the param
    group with a gradient (``per_layer=False``, the default, as in the paper's
    vision runs) or each parameter tensor on its own (``per_layer=True``).

    Parameters
    ----------
    params : iterable
        Parameters or dicts defining parameter groups (any hyper-parameter
        below can be set per group). Pass the others by keyword when copying a
        ``torch.optim.SGD`` call: the third positional argument here is ``lam``,
        where torch's is ``momentum``.
    lr : float or Tensor, default 1e-3
        Learning rate :math:`\eta \ge 0` (the default of ``torch.optim.SGD``). A
        1-element tensor is accepted on every implementation, as in ``torch.optim.SGD``
        (its value is read when a step starts). ``d`` is an *average* of gradients,
        not torch's sum: the lr of ``torch.optim.SGD(lr=a, momentum=m)`` maps to
        about ``a / (1 - m)`` here (see *Momentum and lr* below).
    lam : float, default 0.1
        Proximal regularisation :math:`\lambda \ge 0`; with :math:`\lambda > 0`
        the coefficient applied to :math:`d` is at least :math:`\lambda/(1+\lambda)`.
    beta_max : float, default 0.9
        Upper clipping bound :math:`\beta_{\max} \in [0, 1]` of the adaptive
        :math:`\beta_t` (the paper uses :math:`0.9 - 0.1\lambda`): the weight of the
        past in the average :math:`d` is at most
        :math:`(\beta_{\max}+\lambda)/(1+\lambda)`. Also available in each param
        group as ``"momentum"``, see *Schedulers* below.
    weight_decay : float, default 0
        Coupled L2 weight decay :math:`\mu \ge 0` (as in ``torch.optim.SGD``).
    per_layer : bool, default False
        One beta per parameter tensor instead of one per param group.
    variant : {None, "clip", "restart"}, default None
        Section 4 of the paper: ``"clip"`` uses :math:`\max(\beta, \beta_{\min})`,
        ``"restart"`` uses ``beta_high`` if :math:`\beta \ge \theta` else ``beta_low``.
    beta_min, theta, beta_high, beta_low : float
        Parameters of the variants, each in :math:`[0, 1]` (defaults 0.5, 0.7, 0.9, 0.1).
    maximize : bool, default False
        Maximise the objective instead of minimising it.
    foreach : bool or None, default None
        ``True``: the multi-tensor (``torch._foreach_*``) implementation;
        ``False``: the single-tensor reference. Same iterates up to float rounding.
    fused : bool or None, default None
        Fused kernels: on the CPU, C kernels making two passes over memory per
        step (the three inner products in one pass, the update of ``d`` and
        ``x`` in the other) and no temporary full-size buffers, built by ``pip
        install`` or with the system C compiler on first use (see
        ``amopt.torch._fused``);
        on CUDA, Triton kernels where ``amopt.torch._triton`` provides them.
        Parameters on other devices raise ``RuntimeError`` at their first step,
        as in ``torch.optim``. Groups the kernels do not handle (dtypes other
        than float32/float64, non-contiguous tensors), or a machine without a C
        compiler, use the foreach implementation with a
        ``FusedFallbackWarning``. Same iterates as the single-tensor
        implementation up to float rounding (blocked reductions, see
        ``amopt/torch/csrc/am_fused.c``). Cannot be combined with ``foreach=True``.

        With neither ``fused`` nor ``foreach`` given, each step runs the fastest
        implementation for the group's device and dtype: the fused C kernels
        for float32/float64 on the CPU, the Triton kernels on CUDA, foreach
        otherwise; where those kernels cannot run, the foreach implementation
        with one ``FusedFallbackWarning`` per optimizer saying why.
    momentum : float, optional
        Another name of ``beta_max`` (the name ``torch.optim.SGD`` and torch's
        schedulers use): the cap of the adaptive beta, not a fixed coefficient, and
        the weight of a damped average, not of torch's undamped sum (see *Momentum
        and lr*). Giving both with different values is a ``ValueError``.
    dampening, nesterov, differentiable : default 0, False, False
        ``torch.optim.SGD``'s keywords, taken at its defaults so that a copied
        configuration runs; any other value is a ``ValueError`` naming it: AM's
        update is already a damped average (its weight comes from the adaptive
        beta), has no Nesterov form, and runs under ``torch.no_grad()``.
    process_group : ProcessGroup, optional
        The ranks that together hold the parameters of a ``per_layer=False`` group
        of plain tensors, each rank a partition (found automatically inside
        ``torch.distributed.optim.ZeroRedundancyOptimizer``). Not needed for
        replicas (DDP) nor for DTensors (FSDP2, tensor parallel), whose device mesh
        says which ranks hold their pieces; see ``amopt.torch._distributed``.

    Notes
    -----
    **Momentum and lr.** ``torch.optim.SGD(lr=a, momentum=m)`` keeps the undamped
    sum :math:`b \leftarrow m b + g` and steps :math:`x \leftarrow x - a b`; AM's
    :math:`d \leftarrow g + \gamma (d - g) = \gamma d + (1-\gamma) g` is a damped
    average, of the size of one gradient where :math:`b` grows to about
    :math:`g/(1-m)`. So ``AMSGD(lr=a, momentum=m)``, a copied configuration, takes
    steps about :math:`1-m` times as long as SGD's (a tenth for ``m = 0.9``). With
    :math:`\gamma` held at :math:`m` (``lam=0, variant="restart", beta_high=beta_low=m``)
    the relation is exact: AMSGD is ``torch.optim.SGD(lr, momentum=m, dampening=m)``,
    and on the same gradients ``AMSGD(lr=a/(1-m))`` follows ``SGD(lr=a, momentum=m)``
    up to a constant offset :math:`a m g_0/(1-m)^2` from their first steps (tested in
    ``tests/test_torch_drop_in.py``). Start from ``lr = a / (1 - m)``: measured
    (``tools/amsgd_lr_mapping.py``; AMD EPYC Zen 4, 2 cores, torch 2.13 CPU) on
    scikit-learn's digits, an MLP 64-64-10, batches of 32, 5 epochs, final training
    loss, median of 3 seeds:

    =======================================  ============  ============
    optimizer                                ``a = 0.01``  ``a = 0.05``
    =======================================  ============  ============
    ``SGD(lr=a, momentum=0.9)``              0.326         0.089
    ``AMSGD(lr=a, momentum=0.9)``            2.127         0.745
    ``AMSGD(lr=a/(1-0.9), momentum=0.9)``    0.320         0.091
    =======================================  ============  ============

    (``AMSGD(momentum=0.9)`` at lr 0.05, 0.1, 0.2, 0.5, 1.0: 0.745, 0.320, 0.171,
    0.091, 0.058.) On a full-batch least-squares problem (200x20, condition 10,
    ``a = 1/L``) the adaptive beta matters more than the mapping: steps to
    :math:`10^{-10}` of the initial gap, GD 93, ``SGD(lr=a, momentum=0.9)`` 213
    (heavy ball untuned at :math:`1/L`), ``AMSGD(lr=a, momentum=0.9)`` 57,
    ``AMSGD(lr=a/(1-0.9))`` 64.

    **State.** Per parameter: ``step`` (a CPU counter, as in ``torch.optim.Adam``),
    ``momentum_buffer`` (:math:`d`) and ``beta`` (the 0-d beta last applied, in the
    compute dtype: float32 for half-precision and float32 parameters,
    float64 when the scope holds a float64 tensor; the sums of squares it is formed
    from are float64 wherever the device has it). ``state_dict()`` holds all of
    it, so saving and loading mid-run continues bit-identically.

    **Another optimizer's state dict** is refused with a ``ValueError``: a
    ``torch.optim.SGD`` ``momentum_buffer`` sums gradients (about :math:`g/(1-m)`)
    where :math:`d` averages them, its lr means a shorter step (see *Momentum and
    lr*), and SGD keeps no step count; so is an AM-Adam state.

    **Telemetry.** After ``step()``, :meth:`latest_betas` returns the betas of
    every group and parameter as device tensors, without synchronising.

    **No host synchronisation.** ``step()`` never reads a device value on the
    host: beta stays a device tensor and the guard, clip and variants are
    ``torch.where`` / ``torch.clamp`` expressions. State tensors are updated in
    place, so ``torch.compile`` of a function calling ``step()`` compiles once.

    **Mixed precision.** ``torch.amp.GradScaler`` steps the optimizer with its
    scale and ``found_inf`` (``_step_supports_amp_scaling``): gradients are
    unscaled inside the step and a step with an inf or NaN gradient leaves the
    parameters and the state as they were, decided on the device (see
    ``amopt.torch._common.InfSkip``).

    **Schedulers.** Every ``torch.optim.lr_scheduler`` drives ``lr``. With
    ``cycle_momentum=True``, ``CyclicLR`` and ``OneCycleLR`` cycle the *cap*
    :math:`\beta_{\max}`: torch's schedulers write the param-group key
    ``"momentum"``, which ``AMSGD`` keeps as an alias of ``"beta_max"``. Assign
    either key between steps; at the next step the one that changed is applied
    and copied into the other (changing both to different values raises
    ``ValueError``). The adaptive :math:`\beta_t` itself is never overwritten.

    Complex parameters are optimised as their real views (as in ``torch.optim``);
    sparse gradients raise ``RuntimeError``; parameters whose ``grad`` is
    ``None`` are skipped and take no part in the beta of their group.

    Examples
    --------
    >>> import torch
    >>> from amopt.torch import AMSGD
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = torch.nn.Linear(3, 1)
    >>> opt = AMSGD(model.parameters(), lr=0.1, lam=0.1, beta_max=0.9)
    >>> x, y = torch.randn(16, 3), torch.randn(16, 1)
    >>> for _ in range(5):
    ...     opt.zero_grad()
    ...     loss = torch.nn.functional.mse_loss(model(x), y)
    ...     loss.backward()
    ...     opt.step()
    >>> beta = opt.latest_betas()[0][0]  # the group's beta of the last step
    >>> bool(0.0 <= beta <= 0.9)
    True
    """

    _state_keys = frozenset({"step", "momentum_buffer", "beta"})

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        lam: float = 0.1,
        beta_max: float = _CAP,
        weight_decay: float = 0.0,
        per_layer: bool = False,
        variant: str | None = None,
        beta_min: float = 0.5,
        theta: float = 0.7,
        beta_high: float = 0.9,
        beta_low: float = 0.1,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        fused: bool | None = None,
        process_group: Any = None,
        momentum: float | None = None,
        dampening: float = 0,
        nesterov: bool = False,
        differentiable: bool = False,
    ) -> None:
        check_torch_options(
            "AMSGD",
            {"dampening": dampening, "nesterov": nesterov, "differentiable": differentiable},
        )
        if momentum is not None:
            if beta_max is not _CAP and beta_max != momentum:
                raise ValueError(
                    f"beta_max and its alias momentum were both given, with different values "
                    f"(beta_max={beta_max!r}, momentum={momentum!r}); give one of them"
                )
            beta_max = torch_worded(check_interval, "momentum", momentum, 0.0, 1.0)
        defaults: dict[str, Any] = {
            "lr": lr,
            "lam": lam,
            "beta_max": beta_max,
            "momentum": beta_max,
            "weight_decay": weight_decay,
            "per_layer": per_layer,
            "variant": variant,
            "beta_min": beta_min,
            "theta": theta,
            "beta_high": beta_high,
            "beta_low": beta_low,
            "maximize": maximize,
            "foreach": foreach,
            "fused": fused,
            "process_group": process_group,
        }
        _validate(defaults)
        super().__init__(params, defaults)
        _distributed.attach(self)

    # ------------------------------------------------------------------ groups, state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a param group; ``"beta_max"`` and its alias ``"momentum"`` may be given."""
        check_torch_options("AMSGD", {k: v for k, v in param_group.items() if k in _TORCH_FIXED})
        has_cap, has_alias = "beta_max" in param_group, "momentum" in param_group
        if has_cap and has_alias and param_group["beta_max"] != param_group["momentum"]:
            raise ValueError(
                "param group sets both 'beta_max' and its alias 'momentum' to different "
                f"values ({param_group['beta_max']!r} and {param_group['momentum']!r})"
            )
        if has_alias and not has_cap:
            torch_worded(check_interval, "momentum", param_group["momentum"], 0.0, 1.0)
        if has_cap or has_alias:
            cap = param_group["beta_max"] if has_cap else param_group["momentum"]
            param_group["beta_max"] = param_group["momentum"] = cap
        merged = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        _validate(merged)
        super().add_param_group(param_group)
        applied = self.__dict__.setdefault("_beta_max_applied", [])
        applied.append(self.param_groups[-1]["beta_max"])

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in _DEFAULTS.items():
                group.setdefault(key, value)
            group.setdefault("momentum", group["beta_max"])
        self._beta_max_applied = [g["beta_max"] for g in self.param_groups]
        self._backfill_steps()

    def _foreign_advice(self) -> str:
        return (
            "a torch.optim.SGD state does not carry over: its momentum_buffer sums the "
            "gradients (sum of m^k g, about g / (1 - m)) where AMSGD's averages them, its lr "
            "means a step 1 - m times shorter, and it keeps no step count; construct AMSGD "
            "with lr = lr_SGD / (1 - momentum) and let it start its own state"
        )

    def _resolve_beta_max(self, index: int, group: dict[str, Any]) -> float:
        """The cap for this step, reconciling ``"beta_max"`` with its alias ``"momentum"``."""
        applied_list = self._beta_max_applied  # set by add_param_group and __setstate__
        while len(applied_list) < len(self.param_groups):
            applied_list.append(None)
        applied = applied_list[index]
        cap, alias = group["beta_max"], group.setdefault("momentum", group["beta_max"])
        if cap != alias:
            if applied is None or cap == applied:
                cap = alias  # "momentum" was assigned, e.g. by CyclicLR / OneCycleLR
            elif alias != applied:
                raise ValueError(
                    f"param group {index}: 'beta_max' ({cap!r}) and its alias 'momentum' "
                    f"({alias!r}) were both changed since the last step; set only one of them"
                )
            check_interval("beta_max", cap, 0.0, 1.0)
            group["beta_max"] = group["momentum"] = cap
        applied_list[index] = cap
        return cap

    def _init_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        momentum_buffer_list: list[Tensor | None],
        state_steps: list[Tensor],
    ) -> None:
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(
                    "AMSGD does not support sparse gradients: the beta rule needs dense "
                    "inner products of the gradient and the momentum buffer"
                )
            state = self.state[p]
            if "step" not in state:
                if group["fused"]:
                    check_fused_device(p)
                state["step"] = new_step()
            fresh = state.get("momentum_buffer") is None
            if not fresh and getattr(self, "found_inf", None) is not None:
                # a first step skipped for an inf gradient left a zero buffer and step 0
                fresh = not bool(state["step"])  # a CPU counter: no device sync
            if fresh:
                # d = g on the first step, formed as the functional forms it; created here,
                # where torch.compile runs _init_group eagerly, so that the compiled step
                # is the same at every step
                grad = -p.grad if group["maximize"] else p.grad
                grad = unscale([grad], getattr(self, "grad_scale", None))[0]
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                state["momentum_buffer"] = torch.clone(grad).detach()
            params.append(p)
            grads.append(p.grad)
            momentum_buffer_list.append(state["momentum_buffer"])
            state_steps.append(state["step"])
        self._init_betas(group, params)

    def _step_values(self) -> list[float]:
        # reconcile every cap first, so that an invalid one fails before any group steps
        return [self._resolve_beta_max(i, group) for i, group in enumerate(self.param_groups)]

    def _hyper(self, group: dict[str, Any], lr: Any, beta_max: float, lr_ratio: Any) -> SGDHyper:
        return _group_hyper(group, lr, beta_max, lr_ratio)


# --------------------------------------------------------------------------- functional


def amsgd(
    params: list[Tensor],
    grads: list[Tensor],
    momentum_buffer_list: list[Tensor | None],
    state_steps: list[Tensor],
    foreach: bool | None = None,
    *,
    fused: bool | None = None,
    grad_scale: Tensor | None = None,
    found_inf: Tensor | None = None,
    lr: float | Tensor,
    lam: float = 0.1,
    beta_max: float = 0.9,
    weight_decay: float = 0.0,
    per_layer: bool = False,
    variant: str | None = None,
    beta_min: float = 0.5,
    theta: float = 0.7,
    beta_high: float = 0.9,
    beta_low: float = 0.1,
    maximize: bool = False,
    process_group: Any = None,
    lr_ratio: float | Tensor = 1.0,
) -> list[Tensor]:
    r"""Functional AMSGD: one step over ``params`` in place. See :class:`AMSGD`.

    All tensors given form one param group: with ``per_layer=False`` they share a
    single beta.

    Parameters
    ----------
    params, grads : list of Tensor
        Parameters (updated in place) and their dense gradients.
    momentum_buffer_list : list of Tensor or None
        Momentum buffers :math:`d`, updated in place; a ``None`` entry is
        replaced by a new buffer equal to the gradient (the first step).
    state_steps : list of Tensor
        0-d step counters, incremented in place.
    foreach, fused : bool or None
        The implementation, as in :class:`AMSGD`: with both ``None``, the fastest
        one for the tensors' device and dtype.
    grad_scale, found_inf : Tensor, optional
        ``torch.amp.GradScaler``'s protocol: the gradients are divided by
        ``grad_scale``, and where the 0-d ``found_inf`` is non-zero the step leaves
        ``params``, the buffers and the step counters as they were (decided on the
        device). A buffer created by such a step (from a ``None`` entry) is zero:
        pass ``None`` for it again while its step counter is 0.
    lr, lam, beta_max, weight_decay, per_layer
        As in :class:`AMSGD`.
    variant, beta_min, theta, beta_high, beta_low, maximize
        As in :class:`AMSGD`.
    process_group : ProcessGroup, optional
        With ``per_layer=False``: the ranks whose plain-tensor ``params`` together
        form the scope. DTensors are combined over their device mesh.
    lr_ratio : float, default 1
        :math:`r = \eta_{t-1}/\eta_t`, the previous step's lr over this one's
        (:func:`amopt.core.rule.lr_ratio`): the linearised numerator estimates the decrease
        of f by the previous step, taken with :math:`\eta_{t-1}`. 1 at a constant lr
        and on the first step; :class:`AMSGD` keeps it per param group.

    Returns
    -------
    list of Tensor
        The 0-d beta applied to each parameter (the same tensor for all
        parameters when ``per_layer=False``), in the compute dtype.

    Examples
    --------
    >>> import torch
    >>> from amopt.torch import amsgd
    >>> x = torch.tensor([3.0, 1.0], dtype=torch.float64)
    >>> curvature = torch.tensor([1.0, 10.0], dtype=torch.float64)  # f = sum(c x^2) / 2
    >>> bufs, steps = [None], [torch.tensor(0.0)]
    >>> for _ in range(3):
    ...     betas = amsgd([x], [curvature * x], bufs, steps, lr=0.1, lam=0.1, beta_max=0.9)
    >>> float(betas[0]), [round(v, 6) for v in x.tolist()]
    (0.9, [2.157273, -0.165289])
    """
    config = rule_config(
        lam=lam,
        beta_max=beta_max,
        numerator="linear",
        per_layer=per_layer,
        variant=variant,
        beta_min=beta_min,
        theta=theta,
        beta_high=beta_high,
        beta_low=beta_low,
    )

    def hyper(path: str) -> SGDHyper:
        ratio = hyper_ratio(lr_ratio, lr, path)
        return SGDHyper(hyper_lr(lr, path), weight_decay, maximize, config, ratio)

    t = SGDTensors(params, grads, momentum_buffer_list, state_steps)
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


def _single_tensor_amsgd(
    t: SGDTensors, h: SGDHyper, sync: _distributed.ScopeSync | None = None
) -> list[Tensor]:
    params, grads, momentum_buffer_list, state_steps = t
    lr, weight_decay, maximize, config, lr_ratio = h
    n = len(params)
    if n == 0:
        return []

    gs: list[Tensor] = []
    ds: list[Tensor] = []
    xs: list[Tensor] = []
    for i, param in enumerate(params):
        grad = grads[i] if not maximize else -grads[i]
        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        buf = momentum_buffer_list[i]
        if buf is None:  # step 0: d = g
            buf = torch.clone(grad).detach()
            momentum_buffer_list[i] = buf
        state_steps[i] += 1
        gs.append(as_real(grad))
        ds.append(as_real(buf))
        xs.append(as_real(param))

    # reduce: <v,v>, <g,g>, <d,d> of each scope (the buffers hold v = d - g afterwards)
    scopes = [[i] for i in range(n)] if config.per_layer else [list(range(n))]
    accs = [compute_dtype(gs[i].dtype for i in scope) for scope in scopes]
    # whether the buffers hold v = d - g after the reduce (else the apply forms it again)
    stored = True
    if torch.compiler.is_compiling() and sync is None and len(set(accs)) == 1:
        # <v,v>, <g,g>, <v,g> of each tensor, which the compiler forms in one loop
        # (<d,d> as a fourth sum it forms in another), handed to the rule operator one
        # by one; it adds them up and forms <d,d> = <v,v> + 2<v,g> + <g,g>, which the
        # rule reads only in its zero-denominator threshold. v is not stored: the apply's
        # loop forms it again from the d and g it reads anyway, a write pass fewer
        parts = []
        for g, d in zip(gs, ds, strict=True):
            wide = wide_dtype(g.device)  # squares in float64: no underflow, no overflow
            v = d - g
            parts += [sqsum(v, wide), sqsum(g, wide), (v.to(wide) * g.to(wide)).sum()]
        beta, gamma = _traced_ops.rule_from_sums(
            _rule.momentum_beta, parts, config, accs[0], lr_ratio=lr_ratio
        )
        stored = False
    else:
        rows = []
        for scope in scopes:
            wide = wide_dtype(gs[scope[0]].device)  # squares in float64: see wide_dtype
            gg_parts, dd_parts, vv_parts = [], [], []
            for i in scope:
                g, d = gs[i], ds[i]
                gg_parts.append(sqsum(g, wide))
                dd_parts.append(sqsum(d, wide))
                d.sub_(g)
                vv_parts.append(sqsum(d, wide))
            rows.append(torch.stack([total(vv_parts), total(gg_parts), total(dd_parts)]))
        rows = _distributed.sync_sums(sync, rows)  # sharded scopes: add the sums of all ranks
        rows = [scope_sums(row, acc) for row, acc in zip(rows, accs, strict=True)]
        # rule
        beta, gamma = rule_by_rows(_rule.momentum_beta, rows, config, lr_ratio=lr_ratio)

    # apply: d = g + gamma * (d - g) (exact when d = g), x -= lr * d
    betas: list[Tensor] = [beta] * n  # placeholders, all overwritten below
    for k, scope in enumerate(scopes):
        gamma_k = gamma[k]
        for i in scope:
            # in float32 for half precision (stored back in the param dtype)
            op = compute_dtype([ds[i].dtype])
            v = ds[i] if stored else ds[i] - gs[i]  # in the buffer's dtype, as the reduce's
            d, g, x = (t.to(op) for t in (v, gs[i], xs[i]))
            d.mul_(gamma_k.to(device=d.device, dtype=op)).add_(g)
            x.add_(d, alpha=-lr)
            for low, high in ((ds[i], d), (xs[i], x)):
                if low is not high:
                    low.copy_(high)
            betas[i] = beta[k]
    return betas


def _multi_tensor_amsgd(
    t: SGDTensors, h: SGDHyper, sync: _distributed.ScopeSync | None = None
) -> list[Tensor]:
    from amopt.torch._common import (
        Flat,
        Scratch,
        chunk_elements,
        chunks,
        cpu_sqsums,
        foreach_mode,
    )

    params, grads, momentum_buffer_list, state_steps = t
    lr, weight_decay, maximize, config, lr_ratio = h
    n = len(params)
    if n == 0:
        return []
    per_layer = config.per_layer
    scope_acc = compute_dtype([real_dtype(p) for p in params])
    grouped = Optimizer._group_tensors_by_device_and_dtype(
        [params, grads, momentum_buffer_list, state_steps],  # type: ignore[list-item]
        with_indices=True,
    )

    # reduce, per (device, dtype) bucket: g, d = g on the first step, v = d - g, and the
    # sums <v,v>, <g,g>, <d,d> of each tensor as the rows of a (3, n_bucket) tensor; in the
    # bucket's foreach_mode: chunk by chunk on the CPU (squares in float32 where that is
    # safe, cpu_sqsums), else whole tensors, squares in float64 (wide_dtype)
    buckets = []
    for (dev_params_, dev_grads_, dev_bufs_, dev_steps_), indices in grouped.values():
        dev_params = list(dev_params_)
        dev_bufs = list(dev_bufs_)
        dev_grads = foreach_grads(dev_grads_, dev_params, maximize, weight_decay)
        for k, buf in enumerate(dev_bufs):
            if buf is None:
                buf = torch.clone(dev_grads[k]).detach()
                dev_bufs[k] = momentum_buffer_list[indices[k]] = buf
        torch._foreach_add_(list(dev_steps_), torch.tensor(1.0), alpha=1.0)

        lists = [[as_real(t) for t in ts] for ts in (dev_params, dev_grads, dev_bufs)]
        device, dtype = lists[1][0].device, lists[1][0].dtype
        op = compute_dtype([dtype])  # elementwise: float32 for half precision
        numels = [t.numel() for t in lists[1]]
        contiguous = all(t.is_contiguous() for ts in lists for t in ts)
        mode = foreach_mode(device, sum(numels), half=dtype != op, contiguous=contiguous)
        kit: Any = None
        if mode == "flat":  # 1-D views: per-tensor values spread over them (Flat)
            kit = Flat(numels, device)
            lists = [Flat.views(ts) for ts in lists]
            pieces = [list(enumerate(zip(*lists, strict=True)))]
        elif mode == "chunks":
            # four times the chunks of AM-Adam's many passes: fewer ops, still in cache
            pieces = chunks(lists, 4 * chunk_elements(device, sum(numels), 3))
            kit = Scratch(pieces, op)
        else:
            pieces = [list(enumerate(zip(*lists, strict=True)))]
        parts, owner_ids = [], []
        for chunk in pieces:
            owners = [i for i, _ in chunk]
            _, gs, ds = [list(ts) for ts in zip(*(part for _, part in chunk), strict=True)]
            if mode == "chunks":
                gd = cpu_sqsums(gs + ds, kit(0, gs) + kit(1, ds))
                torch._foreach_sub_(ds, gs)  # the buffers now hold v = d - g
                vv = cpu_sqsums(ds, kit(0, ds), ref=gd.view(2, -1).sum(0))
                parts.append(torch.cat([vv, gd]).view(3, -1))
            else:  # squares in float64: no underflow, no overflow
                wide = wide_dtype(device)
                gd = foreach_sqsum(gs + ds, wide)
                torch._foreach_sub_(ds, gs)
                parts.append(torch.stack(foreach_sqsum(ds, wide) + gd).view(3, -1))
            owner_ids += owners
        sums = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
        if len(owner_ids) != len(indices):  # tensors cut into pieces: add the pieces up
            index = torch.tensor(owner_ids, device=sums.device)
            sums = sums.new_zeros(3, len(indices)).index_add_(1, index, sums)
        buckets.append((pieces, kit, mode, op, indices, sums))

    # rule: one beta per tensor (vectorised per bucket) or one over all buckets
    betas: list[Tensor] = [params[0]] * n  # placeholders, all overwritten below
    coefs: list[Tensor] = []
    if per_layer:
        bucket_sums = [b[5].T for b in buckets]
    else:
        device = buckets[0][5].device
        rows = [b[5].sum(1).to(device, non_blocking=True) for b in buckets]
        bucket_sums = [rows[0] if len(rows) == 1 else torch.stack(rows).sum(0)]
    # sharded scopes: add the sums of all ranks
    bucket_sums = _distributed.sync_sums(sync, bucket_sums, [b[4] for b in buckets])
    if per_layer:
        for (*_, op, indices, _), sums in zip(buckets, bucket_sums, strict=True):
            sums = scope_sums(sums, op)
            beta, gamma = _rule.momentum_beta(torch, sums, config, lr_ratio=lr_ratio)
            for k, b in zip(indices, beta.unbind(), strict=True):
                betas[k] = b
            coefs.append(gamma.to(op))
    else:
        sums = scope_sums(bucket_sums[0], scope_acc)
        beta, gamma = _rule.momentum_beta(torch, sums, config, lr_ratio=lr_ratio)
        betas = [beta] * n
        for pieces, *_, op, _, _ in buckets:
            device = pieces[0][0][1][0].device
            coefs.append(gamma.to(device=device, dtype=op, non_blocking=True))

    # apply: d = g + gamma * v, x -= lr * d, in float32 for half precision
    for (pieces, kit, mode, op, *_), coef in zip(buckets, coefs, strict=True):
        host_coef: Any = None
        if mode == "chunks":  # CPU values, read without a synchronisation: add's alpha
            host_coef = coef.tolist()
        elif mode == "flat":
            coef = kit.spread(coef)
        elif coef.dim() != 0:
            coef = list(coef.unbind())
        for chunk in pieces:
            owners = [i for i, _ in chunk]
            xs_low, gs_low, ds_low = [list(ts) for ts in zip(*(p for _, p in chunk), strict=True)]
            if ds_low[0].dtype == op:
                xs, gs, ds = xs_low, gs_low, ds_low
            elif mode == "chunks":
                xs, gs, ds = kit(0, xs_low), kit(1, gs_low), kit(2, ds_low)
            elif mode == "flat":
                xs, gs, ds = kit.empty(op), kit.empty(op), kit.empty(op)
            else:
                xs, gs, ds = (cast(ts, op) for ts in (xs_low, gs_low, ds_low))
            if xs is not xs_low and mode != "lists":
                for high, low in ((xs, xs_low), (gs, gs_low), (ds, ds_low)):
                    torch._foreach_copy_(high, low)
            if host_coef is not None:  # one pass per piece where mul_ and add_ make two
                for i, g, v in zip(owners, gs, ds, strict=True):
                    c = host_coef[i] if isinstance(host_coef, list) else host_coef
                    torch.add(g, v, alpha=c, out=v)
            else:
                flat = isinstance(coef, Tensor) or mode == "flat"
                torch._foreach_mul_(ds, coef if flat else [coef[i] for i in owners])
                torch._foreach_add_(ds, gs)
            torch._foreach_add_(xs, ds, alpha=-lr)
            if ds is not ds_low:
                torch._foreach_copy_(ds_low, ds)
                torch._foreach_copy_(xs_low, xs)
    return betas


_PATHS = family_paths(_fused_ops.SGD, sys.modules[__name__], "sgd")
AMSGD._paths = _PATHS
