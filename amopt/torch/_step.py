"""The step of the AM optimizers, written once for every family and every path.

A family (``AMSGD``, ``AMAdamW``) describes itself: its state lists and hyper-parameter
record (:class:`~amopt.torch._fused_ops.Family`), its single-tensor and multi-tensor
functions, the state it makes lazily (``_init_group``) and the hyper-parameters of a
group's step (``_hyper``). :class:`StepTemplate` runs the rest, as ``torch.optim``'s
``Adam.step`` does for ``Adam`` and ``AdamW``: the checks, the lazy state, one choice of
path for every optimizer (:func:`~amopt.torch._common.default_path`), the planned,
compiled and sharded branches, ``GradScaler``'s scale and ``found_inf``, the betas kept
in the state and the previous lr. :func:`functional` is the body of the functional
forms (``amsgd``, ``am_adamw``), which the optimizers' steps call too, and :func:`run`
picks the implementation of a path in a few lines, as ``torch.optim.adam.adam`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any, NamedTuple

import torch

from amopt.torch import _distributed, _fused, _fused_ops
from amopt.torch._common import (
    AMOptimizerBase,
    InfSkip,
    as_float,
    default_path,
    hyper_lr,
    hyper_ratio,
    plan_flags,
    step_lr,
    triton_module,
    unscale,
    warn_path_fallback,
)
from amopt.torch._fused import warn_fallback
from amopt.torch._fused_ops import Family
from amopt.torch._records import Scaler, compute_dtype, real_dtype

__all__ = ["Paths", "StepTemplate", "family_paths", "functional"]


class Paths(NamedTuple):
    """Where a family's implementations are, found by its name when a step runs (so that
    a test can replace one): the single-tensor and multi-tensor functions
    ``_single_tensor_<name>`` and ``_multi_tensor_<name>`` of ``module``
    (``func(t, h, sync)``), the fused C and Triton drivers
    ``amopt.torch._fused.fused_<name>`` and ``amopt.torch._triton.triton_<name>``, and the
    operators of :mod:`amopt.torch._fused_ops`."""

    family: Family
    module: ModuleType
    #: the kind of the group's Triton plan (``amopt.torch._triton.group_plan``)
    plan: str


def family_paths(family: Family, module: ModuleType, plan: str) -> Paths:
    """A family's :class:`Paths`; its fused operator is given its driver (:func:`fused_step`)."""
    paths = Paths(family, module, plan)
    _fused_ops.register_driver(f"fused_{family.name}", partial(fused_step, paths))
    return paths


def _func(paths: Paths, form: str) -> Callable[..., Any]:
    """The family's ``_<form>_tensor_<name>`` function (``form``: single or multi)."""
    return getattr(paths.module, f"_{form}_tensor_{paths.family.name}")


def _buffers(family: Family) -> tuple[str, ...]:
    """The state lists a step writes besides the parameters and the step counters."""
    return family.mutated[1:-1]


def _ready(t: Any) -> bool:
    """Whether every state buffer exists (AMSGD's are made at the first step)."""
    return all(b is not None for b in t[2])


def amp_step(
    paths: Paths, func: Callable[..., Any], t: Any, h: Any, amp: Scaler, sync: Any
) -> Any:
    """Run ``func`` on the unscaled gradients, undoing it where ``found_inf`` is set."""
    family = paths.family
    t = t._replace(grads=unscale(t.grads, amp.grad_scale))
    buffers = [getattr(t, name) for name in _buffers(family)]
    skip = InfSkip(amp.found_inf, [*t.params, *[b for bs in buffers for b in bs]])
    before = [list(b) for b in buffers]
    out = func(t, h, sync)
    if amp.found_inf is None:
        return out
    created = [
        b
        for now, old in zip(buffers, before, strict=True)
        for b, o in zip(now, old, strict=True)
        if b is not o
    ]
    skip.restore(t.state_steps, created=created)
    if family.products is None:
        return out
    betas, prods = out
    olds = getattr(t, family.products)
    if not h.config.per_layer:
        return betas, [skip.blend(olds[0], prods[0])] * len(prods)
    return betas, skip.blend_all(olds, prods)


def fused_step(paths: Paths, t: Any, h: Any, amp: Scaler, sync: Any) -> Any:
    """The fused C kernels; the foreach path where they cannot run (with a warning)."""
    family = paths.family
    out = _fused.eagerly(getattr(_fused, f"fused_{family.name}"), t, h, amp, sync)
    if out is None:  # found_inf skipped the step: nothing changed; the caller keeps its betas
        dtype = compute_dtype([real_dtype(p) for p in t.params])
        skipped = [torch.zeros((), dtype=dtype, device=t.params[0].device)] * len(t.params)
        return (skipped, list(getattr(t, family.products))) if family.products else skipped
    if isinstance(out, str):
        warn_fallback(out)
        return amp_step(paths, _func(paths, "multi"), t, h, amp, sync)
    return out


def run(paths: Paths, path: str, t: Any, h: Any, amp: Scaler, sync: Any) -> Any:
    """One step of ``path`` (``"single"``, ``"foreach"``, ``"fused"``, ``"triton"``)."""
    name = paths.family.name
    compiling = torch.compiler.is_compiling()
    if path == "triton":  # the Triton kernels unscale and skip themselves
        if compiling and _ready(t):  # one node of the graph
            return _fused_ops.traced(paths.family, "triton")(t, h, amp)
        return getattr(triton_module(), f"triton_{name}")(t, h, amp, sync=sync)
    if path == "fused":  # so do the C kernels
        if sync is None and compiling and _ready(t):  # one node of the graph
            return _fused_ops.traced(paths.family, "fused")(t, h, amp)
        return fused_step(paths, t, h, amp, sync)
    # compiled, foreach=True traces the single-tensor form: the compiler fuses each
    # tensor's passes into one reduce and one apply loop either way, and the multi-tensor
    # form's eager devices (polarised sums of squares) would be stored as temporaries
    func = _func(paths, "multi" if path == "foreach" and not compiling else "single")
    return amp_step(paths, func, t, h, amp, sync)


#: The fallback reasons the functional forms have warned about.
_FUNCTIONAL_WARNED: set[str] = set()


def functional(
    paths: Paths,
    t: Any,
    hyper: Callable[[str], Any],
    amp: Scaler,
    *,
    fused: bool | None,
    foreach: bool | None,
    per_layer: bool,
    process_group: Any,
) -> Any:
    """One step of a functional form over ``t`` in place; ``hyper(path)`` gives its
    hyper-parameters (a number lr, or the traced tensor where the path's operator takes
    one). DTensors are stepped on their local tensors (:func:`_distributed.localize`)."""
    names = ("params", "grads", *_buffers(paths.family))
    caller = t
    *local, sync = _distributed.localize(
        *[getattr(t, n) for n in names], per_layer=per_layer, process_group=process_group
    )
    t = t._replace(**dict(zip(names, local, strict=True)))
    path, reason = default_path(t.params, t.grads, fused=fused, foreach=foreach)
    if reason is not None:
        warn_path_fallback(reason, _FUNCTIONAL_WARNED, stacklevel=4)
    if path == "triton" and sync is not None and torch.compiler.is_compiling():
        path = "foreach"  # no collective inside the operator
    out = run(paths, path, t, hyper(path), amp, sync)
    for n in names[2:]:
        _distributed.store_new_states(getattr(caller, n), getattr(t, n), caller.params)
    return out


class StepTemplate(AMOptimizerBase):
    """``step()`` of every AM optimizer; a family gives :attr:`_paths`, ``_init_group``
    (its lazy state, filling one list per field of its tensors record), :meth:`_hyper`
    and, where it checks or reconciles hyper-parameters first, :meth:`_step_values`."""

    #: the family's implementations
    _paths: Paths
    #: the state entry of the product a step returns besides the betas (AM-Adam's)
    _product_key: str | None = None

    def _step_values(self) -> list[Any]:
        """Per group, what its step needs beyond the group (checked before any group
        steps, so that an invalid value fails before any parameter changes)."""
        return [None] * len(self.param_groups)

    def _hyper(self, group: dict[str, Any], lr: Any, value: Any, lr_ratio: Any) -> Any:
        """The hyper-parameters record of a step of ``group``."""
        raise NotImplementedError

    def _check_step(self, group: dict[str, Any], t: Any) -> None:
        """Checks of a group's tensors before an unplanned step (as its functional form's)."""

    def _path_hyper(
        self, group: dict[str, Any], lr: Any, value: Any, ratio: Any, path: str
    ) -> Any:
        """:meth:`_hyper` for ``path`` (a traced lr and r where its operator takes them)."""
        return self._hyper(group, hyper_lr(lr, path), value, hyper_ratio(ratio, lr, path))

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one optimisation step.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss; it is called under
            ``torch.enable_grad()``.

        Returns
        -------
        The closure's loss, or ``None``.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        grad_scale, found_inf = self._amp()
        amp = Scaler(grad_scale, found_inf)
        paths = self._paths
        family = paths.family
        for group, value in zip(self.param_groups, self._step_values(), strict=True):
            flags = plan_flags(group)
            if not torch.compiler.is_compiling() and self._planned_step(group, flags, value):
                continue
            t = family.tensors(*[[] for _ in family.tensors._fields])
            self._init_group(group, *t)
            if not t.params:
                _distributed.join_empty(self, group)
                continue
            path = self._path(group, t.params, t.grads)
            process_group = _distributed.scope_group(self, group, t.grads)
            ratio = self._lr_ratio(group, t.params)
            if (
                path == "triton"
                and torch.compiler.is_compiling()
                and _ready(t)
                and _fused_ops.layers_op_applies(group, t.params, process_group)
            ):  # one graph node, which stores the betas (and products) itself
                h = self._hyper(group, hyper_lr(group["lr"], path), value, ratio)
                betas_state = [self.state[p]["beta"] for p in t.params]
                _fused_ops.traced(family, "triton", layers=True)(t, h, amp, betas_state)
                self._remember_lr(group, t.params, found_inf)
                continue
            self._check_step(group, t)
            lr = step_lr(group["lr"])
            out = functional(
                paths,
                t,
                partial(self._path_hyper, group, lr, value, ratio),
                amp,
                fused=path in ("fused", "triton"),
                foreach=path == "foreach",
                per_layer=group["per_layer"],
                process_group=process_group,
            )
            self._remember_lr(group, t.params, found_inf)
            betas, prods = out if family.products else (out, None)
            entries = [("beta", betas, InfSkip(found_inf, ()))]
            if self._product_key is not None:
                entries.append((self._product_key, prods, None))
            self._store_state(group, t.params, entries)
            if path == "triton":
                self._plan_group(paths.plan, group, flags, t, process_group)
        return loss

    def _plan_group(
        self, kind: str, group: dict[str, Any], flags: tuple, t: Any, process_group: Any
    ) -> None:
        """After a Triton step of ``group`` (tensors ``t``): plan its next steps over the
        group's local tensors (``amopt.torch._triton.group_plan``;
        :func:`_distributed.plan_locals` for a sharded group), which moves its 0-d state
        into group tensors. ``kind``: ``"sgd"`` or ``"adam"``."""
        buffers = [getattr(t, n) for n in _buffers(self._paths.family)]
        sharded = _distributed.plan_locals(
            t.params, t.grads, buffers, per_layer=group["per_layer"], process_group=process_group
        )
        if torch.compiler.is_compiling():
            return
        plan = triton_module().group_plan(
            kind, self.state, group, flags, t.params, t.grads, buffers, sharded
        )
        self._keep_group_plan(group, plan)

    def _planned_step(self, group: dict[str, Any], flags: tuple, value: Any) -> bool:
        """The group's step on its Triton plan, if it has one that still applies."""
        plan, grads = self._group_plan(group, flags)
        if plan is None:
            return False
        family = self._paths.family
        # the group's "prev_lr" is one tensor, held by every stepped parameter since the
        # step that made the plan: one of them stands for all
        stepped = [next(p for p in group["params"] if p in self.state)]
        h = self._hyper(group, as_float(group["lr"]), value, self._lr_ratio(group, stepped))
        rest = len(family.tensors._fields) - 2 - len(plan.tensors)  # kept by the plan
        t = family.tensors(plan.local_params, grads, *plan.tensors, *[[] for _ in range(rest)])
        amp = Scaler(*(None if a is None else a.reshape(()) for a in self._amp()))
        step = getattr(triton_module(), f"triton_{family.name}")
        step(t, h, amp, plan=plan.plan, state=plan.state, sync=plan.sync)
        self._remember_lr(group, stepped, amp.found_inf)
        return True
