"""The AM-MGD rule of ``minimize`` on torch CUDA tensors as one Triton kernel.

Without CUDA the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, set here
for this module only) on CPU tensors, which ``amopt.backends.torch.rule.FORCE`` lets it take.
The reference is the rule itself on float64 NumPy sums (bit for bit), and, for whole
runs, the waiting loop, whose rule runs on host floats.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

import amopt
from amopt.backends.torch import apply as _torch_apply
from amopt.backends.torch import rule as _torch_rule
from amopt.core import rule as _rule
from amopt.core.config import AMConfig
from amopt.optimize import loop as _loop
from benchmarks.counters import OpCounter

from _kernel_bodies import same_bits
from test_cupy_apply import _arrays
from test_cupy_rule import CONFIGS, _reference, _rows
from test_minimize_device_syncs import _DeviceLeastSquares

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="no Triton")

INTERPRET = not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in (
    "",
    "0",
)
DEVICE = "cpu" if INTERPRET else "cuda"


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    if INTERPRET:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setattr(_torch_rule, "FORCE", True)


@pytest.mark.parametrize("fd", [None, 0.25, -3.0])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_kernel_is_the_rule_bit_for_bit(name, fd):
    config = AMConfig.from_options(CONFIGS[name])
    rows = _rows(np.random.default_rng(9), 300)
    sums = [torch.tensor(v, dtype=torch.float64, device=DEVICE) for v in rows.reshape(-1)]
    f_dec = None if fd is None else torch.tensor(fd, dtype=torch.float64, device=DEVICE)
    out = _torch_rule.momentum_rule(_rule.momentum_beta, sums, config, 0.05, f_dec)
    assert out is not None
    want_beta, want_gamma = _reference(rows, config, 0.05, fd)
    same_bits(out[0].cpu().numpy(), want_beta)
    same_bits(out[1].cpu().numpy(), want_gamma)


def test_float32_dots_are_widened_first():
    """The rule reads float32 dots (float32 arrays) as float64 values, as the host does."""
    config = AMConfig.from_options({})
    rows = _rows(np.random.default_rng(4), 50)[:50].astype(np.float32)
    sums = [torch.tensor(v, device=DEVICE) for v in rows.reshape(-1)]
    out = _torch_rule.momentum_rule(_rule.momentum_beta, sums, config, 0.1, None)
    want_beta, want_gamma = _reference(rows.astype(np.float64), config, 0.1, None)
    same_bits(out[0].cpu().numpy(), want_beta)
    same_bits(out[1].cpu().numpy(), want_gamma)


@pytest.mark.parametrize("with_v", [True, False])
@pytest.mark.parametrize("dtype", ["float64"])
def test_the_apply_kernel_is_the_tensor_operations_bit_for_bit(dtype, with_v):
    x, g, d = (torch.from_numpy(a).to(DEVICE) for a in _arrays(dtype))
    c = torch.tensor(0.37, dtype=getattr(torch, dtype), device=DEVICE)
    v = d - g
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the interpreter's NumPy on inf and NaN
        # a kernel that fails to build is a failure here
        warnings.filterwarnings("error", message="the AM apply's Triton kernel failed")
        out = _torch_apply.momentum_apply(x, g, v if with_v else d, c, 0.0731, with_v)
    assert out is not None
    want_d = g + c * v  # the tensor operations of amopt.optimize.split.am_momentum_apply
    want_x = x - 0.0731 * want_d
    same_bits(out[0].cpu().numpy(), want_d.cpu().numpy())
    same_bits(out[1].cpu().numpy(), want_x.cpu().numpy())


def test_the_apply_kernel_declines_what_it_does_not_take():
    x = torch.ones(4, dtype=torch.float64, device=DEVICE)
    c = torch.tensor(0.5, dtype=torch.float64, device=DEVICE)
    assert _torch_apply.momentum_apply(x, x, x, c, 0.1, True) is not None
    f = x.float()  # float32: Triton may flush its subnormals, torch keeps them
    assert _torch_apply.momentum_apply(f, f, f, c.float(), 0.1, True) is None
    assert _torch_apply.momentum_apply(x, x, x, 0.5, 0.1, True) is None  # a host gamma
    assert _torch_apply.momentum_apply(x, x, x, c.float(), 0.1, True) is None
    strided = torch.ones(8, dtype=torch.float64, device=DEVICE)[::2]
    assert _torch_apply.momentum_apply(strided, x, x, c, 0.1, True) is None


CASES = {
    "gtol": {"maxiter": 400, "gtol": 1e-4, "lr": 0.05},
    "exact-decay": {"maxiter": 60, "lr": 0.05, "weight_decay": 0.1, "numerator": "exact"},
    "per-scope": {"maxiter": 40, "lr": 0.05, "lam": 0.2, "variant": "clip"},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("method", ["am-mgd", "am-sgd"])
def test_pipelined_runs_with_the_kernel_are_the_waiting_runs(monkeypatch, method, case):
    opts = dict(CASES[case])
    if method == "am-sgd":
        opts |= {"batch_size": 16, "seed": 0, "gtol": 0.0}
    runs = []
    for pipelined in (False, True):
        monkeypatch.setattr(_loop, "_PIPELINE", pipelined)
        prob = _DeviceLeastSquares()
        prob.A, prob.b = prob.A.to(DEVICE), prob.b.to(DEVICE)
        x0 = torch.zeros(20, dtype=torch.float64, device=DEVICE)
        runs.append(amopt.minimize(prob, x0, method=method, options=opts))
    want, got = runs
    assert (got.nit, got.status) == (want.nit, want.status)
    assert torch.equal(got.x, want.x)
    np.testing.assert_array_equal(got.betas, want.betas)


class _Grid:
    """A kernel whose launches run ``run`` with the dispatch modes off (its arithmetic is
    not the host's work) and count one launch each."""

    def __init__(self, run, launches: list):
        self.run, self.launches = run, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            with _disable_current_modes():
                self.run(*args, **kwargs)
            self.launches.append(self.run.__name__)

        return launch


def _stub_kernels(monkeypatch, launches: list) -> None:
    """The rule and apply kernels replaced by their tensor operations, run unseen."""

    def rule_kernel(rule, config, lr, exact):
        def rule(s, out, n, K, OUT, BLOCK, **options):  # noqa: N803
            beta, gamma = _rule.momentum_beta_of_dots(
                torch, s[:, :3], config, base=_rule.momentum_beta, lr=lr, exact=exact,
                f_decrease=s[0, 3] if exact else None,
            )  # fmt: skip
            out[0].copy_(beta.reshape(-1))
            out[1].copy_(gamma.reshape(-1))

        return _Grid(rule, launches)

    def apply(x, g, w, c, dn, xn, n, lr, WITH_V, BLOCK, **options):  # noqa: N803
        dn.copy_(g + c * (w if WITH_V else w - g))
        xn.copy_(x - lr * dn)

    monkeypatch.setattr(_torch_rule, "_kernel", rule_kernel)
    monkeypatch.setattr(_torch_apply, "_jitted", lambda interpret: _Grid(apply, launches))


def _launches_per_iteration(method: str, triton_launches: list) -> float:
    counts = []
    for maxiter in (10, 30):
        prob = _DeviceLeastSquares()
        before = len(triton_launches)
        with OpCounter() as launches:
            res = amopt.minimize(
                prob,
                torch.zeros(20, dtype=torch.float64),
                method=method,
                options={"maxiter": maxiter, "gtol": 0.0, "lr": 0.01},
            )
        assert res.nit == maxiter
        counts.append(launches.kernel_ops + len(triton_launches) - before)
    return (counts[1] - counts[0]) / 20


@pytest.mark.skipif(DEVICE != "cpu", reason="counts CPU tensors' operations")
def test_the_pipelined_step_is_a_handful_of_launches(monkeypatch):
    """With the two kernels, a pipelined am-mgd iteration launches at most 12 kernels
    more than mgd's (the target the waiting loop meets with its rule on host floats);
    with the rule and apply as tensor operations it launches more."""
    monkeypatch.setattr(_loop, "_PIPELINE", True)
    triton_launches: list = []
    mgd = _launches_per_iteration("mgd", triton_launches)
    monkeypatch.setattr(_torch_rule, "FORCE", False)
    tensor_ops = _launches_per_iteration("am-mgd", triton_launches)
    monkeypatch.setattr(_torch_rule, "FORCE", True)
    _stub_kernels(monkeypatch, triton_launches)
    fused = _launches_per_iteration("am-mgd", triton_launches)
    assert triton_launches.count("rule") == triton_launches.count("apply") > 0
    assert fused <= mgd + 12 < tensor_ops


def test_without_triton_the_rule_runs_as_tensor_operations(monkeypatch):
    monkeypatch.setattr(_torch_rule.backends, "library_available", lambda name: name != "triton")
    rows = _rows(np.random.default_rng(1), 5)
    sums = [torch.tensor(v, dtype=torch.float64) for v in rows.reshape(-1)]
    config = AMConfig.from_options({})
    assert _torch_rule.momentum_rule(_rule.momentum_beta, sums, config, 0.1, None) is None
