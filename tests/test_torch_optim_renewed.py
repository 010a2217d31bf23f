"""torch's own conventions for the AM optimizers, as pytorch's optimizer tests check them.

* The error inputs of pytorch's ``OptimizerInfo`` table
  (``torch.testing._internal.common_optimizers``: ``optim_error_inputs_func_adamw``,
  ``_adam`` and ``_sgd``) run against ``AMAdamW``, ``AMAdam`` and ``AMSGD``, the way
  ``TestOptimRenewed.test_errors`` runs them: the same exception type and a message
  that matches torch's regular expression.
* The fused-vs-for-loop parity of ``TestOptimRenewed.test_fused_matches_forloop`` on its
  model (two ``Linear`` layers and a 0-d parameter whose gradient is ``None`` after the
  first ``zero_grad``): every implementation reports beta = 0 at the first step
  (``docs/algorithms.md``, section 2: ``d = g`` on step 0, so ``v = 0``), with weight
  decay, ``maximize`` and ``per_layer`` too.
"""

from __future__ import annotations

import re
import warnings

import pytest

torch = pytest.importorskip("torch")
co = pytest.importorskip(
    "torch.testing._internal.common_optimizers",
    reason="torch's test tables need expecttest (in amopt's [test] extra)",
)

from amopt.torch import AMSGD, AMAdam, AMAdamW  # noqa: E402
from amopt.torch import _triton as tri  # noqa: E402
from amopt.torch._common import rule_config  # noqa: E402
from amopt.torch._fused import FusedFallbackWarning, library  # noqa: E402
from amopt.torch._records import SGDHyper, SGDTensors  # noqa: E402

ERROR_TABLES = [
    (AMAdamW, "optim_error_inputs_func_adamw"),
    (AMAdam, "optim_error_inputs_func_adam"),
    (AMSGD, "optim_error_inputs_func_sgd"),
]


def _error_inputs(table: str) -> list:
    return getattr(co, table)(device="cpu", dtype=torch.float32)


@pytest.mark.parametrize(("cls", "table"), ERROR_TABLES, ids=lambda v: getattr(v, "__name__", v))
def test_torch_error_inputs(cls, table):
    """Each of torch's error inputs: torch's exception type, a message torch's regex finds."""
    inputs = _error_inputs(table)
    assert len(inputs) >= 7  # the inputs every optimizer gets plus the optimizer's own
    for err in inputs:
        inp = err.optimizer_error_input
        assert err.error_on == co.OptimizerErrorEnum.CONSTRUCTION_ERROR, inp.desc
        if issubclass(err.error_type, Warning):
            with pytest.warns(err.error_type) as record:
                cls(inp.params, **inp.kwargs)
            assert any(re.search(err.error_regex, str(w.message)) for w in record), inp.desc
        else:
            with pytest.raises(err.error_type) as info:
                cls(inp.params, **inp.kwargs)
            assert re.search(err.error_regex, str(info.value)), (inp.desc, str(info.value))


@pytest.mark.parametrize(
    ("cls", "kwargs", "words"),
    [
        (AMAdamW, {"lr": -0.01}, "Invalid learning rate: -0.01"),
        (AMAdam, {"eps": -1e-8}, "Invalid epsilon value: -1e-08"),
        (AMAdamW, {"betas": (0.9, 1.0)}, r"Invalid beta parameter at index 1: 1\.0"),
        (AMAdam, {"weight_decay": -0.5}, "Invalid weight_decay value: -0.5"),
        (AMSGD, {"lr": -1}, "Invalid learning rate: -1"),
        (AMSGD, {"weight_decay": -0.1}, r"Invalid weight_decay value: -0\.1"),
        (AMSGD, {"momentum": 1.5}, r"Invalid momentum value: 1\.5"),
    ],
)
def test_torch_words_then_what_is_allowed(cls, kwargs, words):
    """torch's words for what torch validates, then the parameter and what is allowed."""
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=rf"^{words}; {name}(\[1\])? must be ") as info:
        cls([torch.nn.Parameter(torch.zeros(2))], **kwargs)
    assert "got" in str(info.value)


def test_param_group_values_use_torch_words():
    p, q = (torch.nn.Parameter(torch.zeros(2)) for _ in range(2))
    opt = AMAdamW([p])
    with pytest.raises(ValueError, match=r"^Invalid learning rate: -1\.0; "):
        opt.add_param_group({"params": [q], "lr": -1.0})
    sgd = AMSGD([p])
    with pytest.raises(ValueError, match=r"^Invalid momentum value: -0\.5; "):
        sgd.add_param_group({"params": [q], "momentum": -0.5})
    # the AM hyper-parameters keep amopt's words (torch has no such parameter)
    with pytest.raises(ValueError, match=r"^lam must be a finite number >= 0; got lam=-1"):
        AMSGD([p], lam=-1)


def _grads(seed: int, shapes: list) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]


def test_momentum_is_the_cap_beta_max():
    """``momentum=`` (torch.optim.SGD's name, and its schedulers') is ``beta_max``."""
    shapes = [(3, 2), (4,)]
    runs = []
    for kwargs in ({"beta_max": 0.5}, {"momentum": 0.5}, {"momentum": 0.5, "beta_max": 0.5}):
        params = [torch.nn.Parameter(g) for g in _grads(0, shapes)]
        opt = AMSGD(params, lr=0.1, foreach=False, **kwargs)
        assert opt.param_groups[0]["beta_max"] == opt.param_groups[0]["momentum"] == 0.5
        for t in range(6):
            for p, g in zip(params, _grads(t + 1, shapes), strict=True):
                p.grad = g + p.detach()
            opt.step()
        runs.append([p.detach().clone() for p in params])
    for run in runs[1:]:
        for a, b in zip(runs[0], run, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="beta_max and its alias momentum were both given"):
        AMSGD([torch.nn.Parameter(torch.zeros(2))], beta_max=0.7, momentum=0.5)


# --------------------------------------------------------------------------- step 0

CONFIGS = [
    {},
    {"weight_decay": 0.1, "maximize": True},
    {"per_layer": True, "weight_decay": 0.1, "lam": 0.5},
    {"weight_decay": 0.3, "variant": "clip"},
]


def _first_beta(kwargs: dict) -> float:
    """beta_AM = 0 at step 0, then the variant (section 4): clip raises it to beta_min."""
    return 0.5 if kwargs.get("variant") == "clip" else 0.0


IMPLS = ["single", "foreach", "fused"]


def _pytorch_test_model(dtype, device):
    """The model of pytorch's ``_test_derived_optimizers`` (its parameters and input)."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 3), torch.nn.Sigmoid(), torch.nn.Linear(3, 1), torch.nn.Sigmoid()
    ).to(dtype=dtype, device=device)
    inp = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], dtype=dtype, device=device).reshape(3, 2)
    empty = torch.empty((), device=device, dtype=dtype, requires_grad=True)
    empty.grad = torch.rand_like(empty)
    return model, inp, [*model.parameters(), empty]


def _betas_per_step(impl, kwargs, dtype, device, n_steps=4):
    model, inp, params = _pytorch_test_model(dtype, device)
    flag = {"single": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    opt = AMSGD(params, **kwargs, **flag[impl])
    rows = []
    for i in range(n_steps):
        opt.zero_grad()
        if i != 2:  # a step where no parameter has a gradient: a no-op
            model(inp).sum().backward()
        opt.step()
        rows.append([opt.state[p]["beta"].item() for p in params[:4]])
    return rows, [p.detach().clone() for p in params[:4]]  # the 0-d one is uninitialised


@pytest.mark.parametrize("kwargs", CONFIGS, ids=lambda k: ",".join(k) or "default")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_every_path_reports_beta_zero_at_the_first_step(kwargs, dtype):
    """Step 0 is a gradient step (d = g, v = 0): beta = 0 on every path; the steps after
    it agree across paths up to rounding."""
    if library() is None:
        pytest.skip("the fused C kernels cannot be built here (no C compiler)")
    runs = {}
    for impl in IMPLS:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FusedFallbackWarning)  # the kernels, no fallback
            runs[impl] = _betas_per_step(impl, kwargs, dtype, "cpu")
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {}
    for impl, (rows, params) in runs.items():
        assert rows[0] == [_first_beta(kwargs)] * 4, (impl, rows[0])
        ref_rows, ref_params = runs["single"]
        torch.testing.assert_close(torch.tensor(rows), torch.tensor(ref_rows), **tol)
        for a, b in zip(params, ref_params, strict=True):
            torch.testing.assert_close(a, b, **tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton path runs on CUDA")
@pytest.mark.parametrize("kwargs", CONFIGS, ids=lambda k: ",".join(k) or "default")
def test_triton_path_reports_beta_zero_at_the_first_step_cuda(kwargs):
    rows, params = _betas_per_step("fused", kwargs, torch.float32, "cuda")
    assert rows[0] == [_first_beta(kwargs)] * 4, rows[0]
    ref_rows, ref_params = _betas_per_step("single", kwargs, torch.float32, "cuda")
    torch.testing.assert_close(torch.tensor(rows), torch.tensor(ref_rows), rtol=1e-5, atol=1e-6)
    for a, b in zip(params, ref_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("per_layer", [False, True])
def test_triton_kernels_treat_a_prepared_buffer_at_step_zero_as_d_equals_g(per_layer):
    """What AMSGD hands the Triton kernels at step 0 (a buffer d = g + wd x made in torch,
    step counters at 0): beta = 0 (Triton's interpreter on the CPU without CUDA)."""
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(3)
    params = [torch.randn(s, generator=gen).to(device) for s in ((5, 3), (7,), (1,))]
    grads = [torch.randn(p.shape, generator=gen).to(device) for p in params]
    wd = 0.1
    bufs = [(-g).add(p, alpha=wd).clone() for g, p in zip(grads, params, strict=True)]
    steps = [torch.zeros((), dtype=torch.float32) for _ in params]
    config = rule_config(lam=0.5, beta_max=0.9, numerator="linear", per_layer=per_layer)
    with pytest.MonkeyPatch.context() as mp:
        if device == "cpu":
            mp.setenv("TRITON_INTERPRET", "1")
        betas = tri.triton_amsgd(
            SGDTensors(params, grads, bufs, steps), SGDHyper(0.01, wd, True, config)
        )
    assert [b.item() for b in betas] == [0.0] * len(params)
    assert [s.item() for s in steps] == [1.0] * len(params)
