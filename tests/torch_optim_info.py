"""OptimizerInfo-style table for the ``amopt.torch`` optimizers (after torch's ``optim_db``).

Each :class:`OptimizerInfo` lists valid hyper-parameter combinations
(:class:`OptimizerInput`) and invalid ones with the exception they must raise
(:class:`ErrorInput`), plus two independent references that replay the same
gradients: the array-API core of ``amopt`` (run on NumPy arrays) and the NumPy
oracle of ``tests/oracle.py``. The test modules ``test_torch_*.py`` iterate
over :data:`OPTIM_DB`.

The test problem is a stochastic, mildly non-quadratic objective on three
arrays of different shapes whose gradient depends only on ``(x, t)`` and is
always computed in NumPy, so every implementation sees bit-identical gradients
at identical iterates. Its noise makes beta move between the guard (0), the
interior and the cap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import amopt
from amopt.torch import AMSGD, AMAdam, AMAdamW, am_adamw, amsgd

import oracle as oracle_mod

SHAPES: tuple[tuple[int, ...], ...] = ((3, 4), (4,), (2, 3))
N_STEPS = 30

GradFn = Callable[[list[np.ndarray], int], tuple[float, list[np.ndarray]]]


# --------------------------------------------------------------------------- test problem


class NoisyProblem:
    """``f_t(x) = sum_i 0.5 h_i x_i^2 + 0.025 x_i^4 - (b_i - sigma n_{t,i}) x_i`` (elementwise)."""

    def __init__(self, shapes: Sequence[tuple[int, ...]] = SHAPES, sigma: float = 0.6, seed=0):
        rng = np.random.default_rng(seed)
        self.shapes = tuple(shapes)
        self.h = [rng.uniform(0.5, 5.0, size=s) for s in shapes]
        self.b = [rng.standard_normal(s) for s in shapes]
        self.sigma = sigma
        self.seed = seed

    def noise(self, t: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, 1000 + t])
        return [rng.standard_normal(s) for s in self.shapes]

    def x0(self) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, 7])
        return [rng.uniform(-2.0, 2.0, size=s) for s in self.shapes]

    def __call__(self, xs: list[np.ndarray], t: int) -> tuple[float, list[np.ndarray]]:
        noise = self.noise(t)
        f = 0.0
        gs = []
        for x, h, b, n in zip(xs, self.h, self.b, noise, strict=True):
            x = np.asarray(x, dtype=np.float64)
            lin = b - self.sigma * n
            f += float(np.sum(0.5 * h * x * x + 0.025 * x**4 - lin * x))
            gs.append(h * x + 0.1 * x**3 - lin)
        return f, gs


def negated(grad_fn: GradFn) -> GradFn:
    """The oracle of ``-f``: maximising it with ``maximize=True`` is minimising ``f``."""

    def neg(xs, t):
        f, gs = grad_fn(xs, t)
        return -f, [-g for g in gs]

    return neg


# --------------------------------------------------------------------------- table types


@dataclass(frozen=True)
class OptimizerInput:
    """A valid constructor configuration."""

    desc: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class ErrorInput:
    """An invalid configuration and what it must raise.

    With ``in_param_group=True`` the kwargs go into a second param group
    (validated by ``add_param_group``) instead of the constructor.
    """

    desc: str
    kwargs: dict[str, Any]
    error_type: type[Exception]
    error_regex: str
    in_param_group: bool = False


@dataclass(frozen=True)
class OptimizerInfo:
    name: str
    optim_cls: type[torch.optim.Optimizer]
    functional: Callable[..., Any]
    required: dict[str, Any]  # constructor arguments every input needs (e.g. lr)
    inputs: tuple[OptimizerInput, ...]
    errors: tuple[ErrorInput, ...]
    state_keys: frozenset[str]
    core_run: Callable[..., tuple[list[list[np.ndarray]], np.ndarray]]
    oracle_run: Callable[..., tuple[list[list[np.ndarray]], np.ndarray]]
    per_layer_default: bool
    tags: frozenset[str] = field(default_factory=frozenset)
    #: the ``torch.optim`` class whose keywords a copied configuration passes
    torch_cls: type[torch.optim.Optimizer] | None = None

    def kwargs(self, inp: OptimizerInput) -> dict[str, Any]:
        return {**self.required, **inp.kwargs}


# --------------------------------------------------------------------------- references


AMSGD_DEFAULTS = {
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
}
ADAM_DEFAULTS = {
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
}
VARIANT_KEYS = ("variant", "beta_min", "theta", "beta_high", "beta_low")


def _betas_2d(betas: list, per_layer: bool) -> np.ndarray:
    arr = np.array([[float(b) for b in (bs if per_layer else (bs,))] for bs in betas])
    return arr if per_layer else arr[:, 0]


def amsgd_core_run(x0, grad_fn: GradFn, n_steps: int, kwargs: dict, lrs=None, caps=None):
    """``amopt.am_momentum_step`` (linearised numerator) on NumPy arrays.

    ``lrs`` / ``caps`` optionally give the learning rate / beta_max of each step.
    """
    kw = {**AMSGD_DEFAULTS, **kwargs}
    kw.pop("maximize")  # the torch side maximises -f: the reference minimises f
    kw.pop("foreach", None)
    xs = [np.array(a, dtype=np.float64) for a in x0]
    state = amopt.am_momentum_init(xs)
    iterates, betas = [], []
    for t in range(n_steps):
        step_kw = dict(kw)
        if lrs is not None:
            step_kw["lr"] = lrs[t]
        if caps is not None:
            step_kw["beta_max"] = caps[t]
        _, gs = grad_fn([a.copy() for a in xs], t)
        xs, state, beta = amopt.am_momentum_step(
            list(xs), gs, state, numerator="linear", **step_kw
        )
        xs = list(xs)
        iterates.append([a.copy() for a in xs])
        betas.append(beta)
    return iterates, _betas_2d(betas, kw["per_layer"])


def amsgd_oracle_run(x0, grad_fn: GradFn, n_steps: int, kwargs: dict):
    kw = {**AMSGD_DEFAULTS, **kwargs}
    kw.pop("maximize")
    kw.pop("foreach", None)
    res = oracle_mod.run_am_mgd(grad_fn, x0, n_steps=n_steps, numerator="linear", **kw)
    return res["x"][1:], res["betas"]


def _adam_core_kwargs(kwargs: dict, l2: bool) -> tuple[dict, float]:
    kw = {**ADAM_DEFAULTS, **kwargs}
    kw.pop("foreach", None)
    kw.pop("maximize")
    kw["betas"] = tuple(kw["betas"])
    l2_wd = 0.0
    if l2:
        l2_wd = kw.pop("weight_decay", 0.0)
        kw["weight_decay"] = 0.0
        kw.pop("weight_decay_mode", None)
    else:
        kw.setdefault("weight_decay", 1e-2)
        kw.setdefault("weight_decay_mode", "decoupled")
    return kw, l2_wd


def make_adam_core_run(l2: bool):
    def run(x0, grad_fn: GradFn, n_steps: int, kwargs: dict, lrs=None, beta1s=None):
        """``amopt.am_adam_step`` on NumPy arrays (AM-Adam: L2 term added to g)."""
        kw, l2_wd = _adam_core_kwargs(kwargs, l2)
        xs = [np.array(a, dtype=np.float64) for a in x0]
        state = amopt.am_adam_init(xs)
        iterates, betas = [], []
        for t in range(n_steps):
            step_kw = dict(kw)
            if lrs is not None:
                step_kw["lr"] = lrs[t]
            if beta1s is not None:
                step_kw["betas"] = (beta1s[t], kw["betas"][1])
            _, gs = grad_fn([a.copy() for a in xs], t)
            gs = [g + l2_wd * x for g, x in zip(gs, xs, strict=True)]
            xs, state, beta = amopt.am_adam_step(list(xs), gs, state, **step_kw)
            xs = list(xs)
            iterates.append([a.copy() for a in xs])
            betas.append(beta)
        return iterates, _betas_2d(betas, kw["per_layer"])

    return run


def make_adam_oracle_run(l2: bool):
    def run(x0, grad_fn: GradFn, n_steps: int, kwargs: dict):
        kw = {**ADAM_DEFAULTS, **kwargs}
        kw.pop("foreach", None)
        kw.pop("maximize")
        if l2:
            kw["weight_decay_mode"] = "l2"
            kw.setdefault("weight_decay", 0.0)
        else:
            kw.setdefault("weight_decay", 1e-2)
        res = oracle_mod.run_am_adam(grad_fn, x0, n_steps=n_steps, numerator="linear", **kw)
        return res["x"][1:], res["betas"]

    return run


# --------------------------------------------------------------------------- the table


def _sgd_errors() -> tuple[ErrorInput, ...]:
    return (
        ErrorInput(
            "negative lr",
            {"lr": -0.1},
            ValueError,
            r"lr must be a finite number >= 0; got lr=-0\.1",
        ),
        ErrorInput("nan lr", {"lr": float("nan")}, ValueError, r"lr must not be NaN; got lr=nan"),
        ErrorInput(
            "tensor lr of two elements",
            {"lr": torch.tensor([0.1, 0.1])},
            ValueError,
            r"Tensor lr must be 1-element; got lr=tensor\(\[0\.1000, 0\.1000\]\) with 2 elements",
        ),
        ErrorInput(
            "negative tensor lr",
            {"lr": torch.tensor(-0.5)},
            ValueError,
            r"lr must be a finite number >= 0; got lr=-0\.5",
        ),
        ErrorInput(
            "negative lam",
            {"lam": -1.0},
            ValueError,
            r"lam must be a finite number >= 0; got lam=-1\.0",
        ),
        ErrorInput(
            "beta_max above 1",
            {"beta_max": 1.5},
            ValueError,
            r"beta_max must be in \[0, 1\]; got beta_max=1\.5",
        ),
        ErrorInput(
            "negative beta_max",
            {"beta_max": -0.1},
            ValueError,
            r"beta_max must be in \[0, 1\]; got beta_max=-0\.1",
        ),
        ErrorInput(
            "negative weight_decay",
            {"weight_decay": -1e-4},
            ValueError,
            r"weight_decay must be a finite number >= 0; got weight_decay=-0\.0001",
        ),
        ErrorInput(
            "unknown variant",
            {"variant": "nesterov"},
            ValueError,
            r"variant must be one of None, 'clip', 'restart'; got variant='nesterov'",
        ),
        ErrorInput(
            "beta_min above 1",
            {"variant": "clip", "beta_min": 2.0},
            ValueError,
            r"beta_min must be in \[0, 1\]; got beta_min=2\.0",
        ),
        ErrorInput(
            "negative theta",
            {"theta": -0.5},
            ValueError,
            r"theta must be in \[0, 1\]; got theta=-0\.5",
        ),
        ErrorInput(
            "per_layer not a bool",
            {"per_layer": "yes"},
            TypeError,
            r"per_layer must be True or False; got per_layer='yes'",
        ),
        ErrorInput(
            "foreach not a bool",
            {"foreach": 1},
            TypeError,
            r"foreach must be True, False or None; got foreach=1",
        ),
        ErrorInput(
            "negative lr in a param group",
            {"lr": -1.0},
            ValueError,
            r"lr must be a finite number >= 0; got lr=-1\.0",
            in_param_group=True,
        ),
        ErrorInput(
            "torch's nesterov=True",
            {"nesterov": True},
            ValueError,
            r"nesterov=True is not supported by AMSGD: .*; allowed: nesterov=False",
        ),
        ErrorInput(
            "torch's dampening=0.1",
            {"dampening": 0.1},
            ValueError,
            r"dampening=0\.1 is not supported by AMSGD: .*; allowed: dampening=0",
        ),
        ErrorInput(
            "torch's differentiable=True",
            {"differentiable": True},
            ValueError,
            r"differentiable=True is not supported by AMSGD: .*; allowed: differentiable=False",
        ),
        ErrorInput(
            "torch's nesterov=True in a param group",
            {"nesterov": True},
            ValueError,
            r"nesterov=True is not supported by AMSGD",
            in_param_group=True,
        ),
    )


AMSGD_INFO = OptimizerInfo(
    name="AMSGD",
    optim_cls=AMSGD,
    functional=amsgd,
    required={"lr": 0.05},
    inputs=(
        OptimizerInput("defaults (global, lam 0.1, beta_max 0.9)", {}),
        OptimizerInput("lam 0, beta_max 1", {"lam": 0.0, "beta_max": 1.0}),
        OptimizerInput("per layer", {"per_layer": True}),
        OptimizerInput("coupled weight decay", {"weight_decay": 0.05, "lam": 0.2}),
        OptimizerInput("clip variant", {"variant": "clip", "beta_min": 0.5}),
        OptimizerInput("restart variant per layer", {"variant": "restart", "per_layer": True}),
        OptimizerInput("maximize", {"maximize": True, "weight_decay": 0.01}),
    ),
    errors=_sgd_errors()
    + (
        ErrorInput(
            "beta_max and its alias disagree",
            {"beta_max": 0.5, "momentum": 0.7},
            ValueError,
            r"both 'beta_max' and its alias 'momentum'",
            in_param_group=True,
        ),
    ),
    state_keys=frozenset({"step", "momentum_buffer", "beta", "prev_lr"}),
    core_run=amsgd_core_run,
    oracle_run=amsgd_oracle_run,
    per_layer_default=False,
    torch_cls=torch.optim.SGD,
)


def _adam_errors() -> tuple[ErrorInput, ...]:
    return (
        ErrorInput(
            "negative lr",
            {"lr": -1e-3},
            ValueError,
            r"lr must be a finite number >= 0; got lr=-0\.001",
        ),
        ErrorInput(
            "beta1_max = 1",
            {"betas": (1.0, 0.999)},
            ValueError,
            r"betas\[0\] must be in \[0, 1\); got betas\[0\]=1\.0",
        ),
        ErrorInput(
            "negative beta2",
            {"betas": (0.9, -0.1)},
            ValueError,
            r"betas\[1\] must be in \[0, 1\); got betas\[1\]=-0\.1",
        ),
        ErrorInput(
            "one beta",
            {"betas": (0.9,)},
            ValueError,
            r"betas must be a pair \(beta1, beta2\) with entries in \[0, 1\); got betas=\(0\.9,\)",
        ),
        ErrorInput(
            "negative eps",
            {"eps": -1e-8},
            ValueError,
            r"eps must be a finite number >= 0; got eps=-1e-08",
        ),
        ErrorInput(
            "negative weight_decay",
            {"weight_decay": -0.1},
            ValueError,
            r"weight_decay must be a finite number >= 0; got weight_decay=-0\.1",
        ),
        ErrorInput(
            "negative lam",
            {"lam": -0.1},
            ValueError,
            r"lam must be a finite number >= 0; got lam=-0\.1",
        ),
        ErrorInput(
            "unknown variant",
            {"variant": "Clip"},
            ValueError,
            r"variant must be one of None, 'clip', 'restart'; got variant='Clip'",
        ),
        ErrorInput(
            "beta_high above 1",
            {"variant": "restart", "beta_high": 1.5},
            ValueError,
            r"beta_high must be in \[0, 1\]; got beta_high=1\.5",
        ),
        ErrorInput(
            "maximize not a bool",
            {"maximize": None},
            TypeError,
            r"maximize must be True or False; got maximize=None",
        ),
        ErrorInput(
            "a tensor and a float beta",
            {"betas": (torch.tensor(0.9), 0.999)},
            ValueError,
            r"betas must be either both floats or both Tensors; got betas=\(tensor\(0\.9000\), "
            r"0\.999\)",
        ),
        ErrorInput(
            "tensor betas with foreach",
            {"betas": (torch.tensor(0.9), torch.tensor(0.99)), "foreach": True},
            ValueError,
            r"betas\[0\] as a Tensor is not supported for capturable=False and foreach=True",
        ),
        ErrorInput(
            "tensor lr with capturable",
            {"lr": torch.tensor(0.1), "capturable": True},
            ValueError,
            r"lr as a Tensor is not supported with capturable=True",
        ),
        ErrorInput(
            "tensor betas with capturable",
            {"betas": (torch.tensor(0.9), torch.tensor(0.99)), "capturable": True},
            ValueError,
            r"betas\[0\] as a Tensor is not supported with capturable=True",
        ),
        ErrorInput(
            "capturable not a bool",
            {"capturable": 1},
            TypeError,
            r"capturable must be True or False; got capturable=1",
        ),
        ErrorInput(
            "tensor beta2 out of range",
            {"betas": (torch.tensor(0.9), torch.tensor(1.0))},
            ValueError,
            r"betas\[1\] must be in \[0, 1\); got betas\[1\]=1\.0",
        ),
        ErrorInput(
            "tensor betas of two elements",
            {"betas": (torch.tensor([0.9, 0.8]), torch.tensor(0.99))},
            ValueError,
            r"Tensor betas\[0\] must be 1-element",
        ),
        ErrorInput(
            "bad eps in a param group",
            {"eps": -1.0},
            ValueError,
            r"eps must be a finite number >= 0; got eps=-1\.0",
            in_param_group=True,
        ),
        ErrorInput(
            "torch's amsgrad=True",
            {"amsgrad": True},
            ValueError,
            r"amsgrad=True is not supported by AMAdam(W)?: .*; allowed: amsgrad=False",
        ),
        ErrorInput(
            "torch's differentiable=True",
            {"differentiable": True},
            ValueError,
            r"differentiable=True is not supported by AMAdam(W)?: .*; allowed: "
            r"differentiable=False",
        ),
        ErrorInput(
            "torch's amsgrad=True in a param group",
            {"amsgrad": True},
            ValueError,
            r"amsgrad=True is not supported by AMAdam(W)?",
            in_param_group=True,
        ),
    )


AMADAMW_INFO = OptimizerInfo(
    name="AMAdamW",
    optim_cls=AMAdamW,
    functional=am_adamw,
    required={"lr": 0.3},
    inputs=(
        OptimizerInput("defaults (per layer, decoupled wd 1e-2)", {}),
        OptimizerInput("global beta", {"per_layer": False}),
        OptimizerInput("lam 0, no weight decay", {"lam": 0.0, "weight_decay": 0.0}),
        OptimizerInput(
            "proximal weight decay, global",
            {"weight_decay_mode": "proximal", "weight_decay": 0.1, "per_layer": False},
        ),
        OptimizerInput("decoupled strong decay", {"weight_decay": 0.5, "lam": 0.3}),
        OptimizerInput("clip variant", {"variant": "clip", "beta_min": 0.6}),
        OptimizerInput("restart variant, global", {"variant": "restart", "per_layer": False}),
        OptimizerInput("betas (0.95, 0.99), eps 1e-3", {"betas": (0.95, 0.99), "eps": 1e-3}),
        OptimizerInput("maximize", {"maximize": True}),
    ),
    errors=_adam_errors()
    + (
        ErrorInput(
            "l2 mode belongs to AMAdam",
            {"weight_decay_mode": "l2"},
            ValueError,
            r"weight_decay_mode must be one of 'decoupled', 'proximal'; got "
            r"weight_decay_mode='l2'",
        ),
        ErrorInput(
            "unknown weight_decay_mode",
            {"weight_decay_mode": "coupled"},
            ValueError,
            r"weight_decay_mode must be one of .*; got weight_decay_mode='coupled'",
        ),
    ),
    state_keys=frozenset({"step", "exp_avg", "exp_avg_sq", "beta1_prod", "beta", "prev_lr"}),
    core_run=make_adam_core_run(l2=False),
    oracle_run=make_adam_oracle_run(l2=False),
    per_layer_default=True,
    torch_cls=torch.optim.AdamW,
)

AMADAM_INFO = OptimizerInfo(
    name="AMAdam",
    optim_cls=AMAdam,
    functional=am_adamw,
    required={"lr": 0.3},
    inputs=(
        OptimizerInput("defaults (per layer, no weight decay)", {}),
        OptimizerInput("L2 weight decay, global", {"weight_decay": 0.1, "per_layer": False}),
        OptimizerInput("lam 0.5, clip variant", {"lam": 0.5, "variant": "clip"}),
        OptimizerInput("maximize with L2", {"maximize": True, "weight_decay": 0.05}),
    ),
    errors=_adam_errors()
    + (
        ErrorInput(
            "AMAdam has no weight_decay_mode",
            {"weight_decay_mode": "decoupled"},
            TypeError,
            r"unexpected keyword argument 'weight_decay_mode'",
        ),
    ),
    state_keys=frozenset({"step", "exp_avg", "exp_avg_sq", "beta1_prod", "beta", "prev_lr"}),
    core_run=make_adam_core_run(l2=True),
    oracle_run=make_adam_oracle_run(l2=True),
    per_layer_default=True,
    torch_cls=torch.optim.Adam,
)

OPTIM_DB: tuple[OptimizerInfo, ...] = (AMSGD_INFO, AMADAMW_INFO, AMADAM_INFO)


def valid_cases() -> list[tuple[OptimizerInfo, OptimizerInput]]:
    return [(info, inp) for info in OPTIM_DB for inp in info.inputs]


def error_cases() -> list[tuple[OptimizerInfo, ErrorInput]]:
    return [(info, err) for info in OPTIM_DB for err in info.errors]


def case_id(case: tuple[OptimizerInfo, Any]) -> str:
    return f"{case[0].name}-{case[1].desc}"


# --------------------------------------------------------------------------- torch driver


def run_torch(
    info: OptimizerInfo,
    kwargs: dict[str, Any],
    grad_fn: GradFn,
    x0: list[np.ndarray],
    n_steps: int,
    *,
    dtype: torch.dtype = torch.float64,
    foreach: bool = False,
    device: str = "cpu",
) -> tuple[list[list[np.ndarray]], np.ndarray, torch.optim.Optimizer, list[torch.Tensor]]:
    """Step an optimizer on ``grad_fn`` (gradients computed in NumPy float64 from the iterates).

    With ``maximize=True`` the optimizer is given the gradients of ``-f``, so
    that it must follow the same path as the references minimising ``f``.
    Returns the iterates after each step, the applied betas (``(n_steps,)`` or
    ``(n_steps, n_params)``), the optimizer and its parameters.
    """
    params = [
        torch.nn.Parameter(torch.tensor(a, dtype=torch.float64).to(device=device, dtype=dtype))
        for a in x0
    ]
    opt = info.optim_cls(params, **{**kwargs, "foreach": foreach})
    if kwargs.get("maximize", False):
        grad_fn = negated(grad_fn)
    per_layer = kwargs.get("per_layer", info.per_layer_default)
    iterates, betas = [], []
    for t in range(n_steps):
        xs = [p.detach().to(device="cpu", dtype=torch.float64).numpy().copy() for p in params]
        _, gs = grad_fn(xs, t)
        for p, g in zip(params, gs, strict=True):
            p.grad = torch.tensor(g).to(device=device, dtype=dtype)
        opt.step()
        iterates.append(
            [p.detach().to(device="cpu", dtype=torch.float64).numpy().copy() for p in params]
        )
        latest = opt.latest_betas()[0]
        betas.append([float(b) for b in latest] if per_layer else float(latest[0]))
    return iterates, np.array(betas), opt, params
