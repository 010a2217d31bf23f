"""``minimize`` on device arrays: one host synchronisation per iteration, few ops, same iterates.

torch tensors on the CPU take the path of CuPy and torch CUDA arrays (every array
library other than NumPy and dask). A synchronisation is a read of a device value on
the host: ``aten._local_scalar_dense`` (``float(t)``, ``t.item()``, ``if t``) or a
Tensor method that copies to the host (``tolist``, ``cpu``, ``numpy``, ``__array__``,
...), counted by :class:`benchmarks.counters.HostReads` (a ``TorchDispatchMode`` and
those methods wrapped); the ops are every aten op dispatched while the mode is on.
Per-iteration figures are the difference between a 30- and a 10-step run of the same
problem, over 20, so the start and the end of a run (the first evaluation, the final
full objective) do not count. The GPU tests at the end skip without CUDA (torch) or
without CuPy and a GPU.
"""

from __future__ import annotations

import ast
import math
import warnings
from pathlib import Path

import array_api_compat.numpy as npx
import array_api_compat.torch as tx
import numpy as np
import pytest
import torch

import amopt
from amopt.backends import library_available
from amopt.core import rule as _rule
from amopt.core import tape as _tape
from amopt.optimize import loop as _loop
from benchmarks.counters import HostReads

from _objectives import Logistic, logreg_data

FULL = ["gd", "mgd", "heavy-ball", "nesterov", "am-mgd", "adam", "adamw", "am-adam", "am-adamw"]
STOCHASTIC = ["sgd", "msgd", "am-sgd"]
ADAM_FAMILY = ["adam", "adamw", "am-adam", "am-adamw"]


class _DeviceLeastSquares:
    """A least-squares FiniteSum on torch tensors; mini-batch rows gathered on the device.

    Indices that are not a tensor on the data's device fail: the batches must reach
    the objective on the device.
    """

    def __init__(self, n=200, d=20, seed=0):
        gen = torch.Generator().manual_seed(seed)
        self.A = torch.randn(n, d, generator=gen, dtype=torch.float64)
        self.b = torch.randn(n, generator=gen, dtype=torch.float64)
        self.n_samples = n
        self.L = float(torch.linalg.eigvalsh(self.A.T @ self.A)[-1]) / n

    def batch_value_and_grad(self, x, idx):
        assert isinstance(idx, torch.Tensor) and idx.device == self.A.device
        A, b = self.A[idx], self.b[idx]
        r = A @ x - b
        return 0.5 * (r @ r) / idx.shape[0], A.T @ r / idx.shape[0]

    def value_and_grad(self, x):
        r = self.A @ x - self.b
        return 0.5 * (r @ r) / self.n_samples, self.A.T @ r / self.n_samples


def _options(method, batch):
    opts = {"maxiter": 10, "gtol": 0.0, "lr": 0.01}
    if method in STOCHASTIC or batch:
        opts |= {"batch_size": 16, "seed": 0}
    return opts


def _per_iteration(method, batch=False, **extra):
    """(syncs, ops) per iteration of ``method`` on the torch least-squares problem."""
    prob = _DeviceLeastSquares()
    out = []
    for maxiter in (10, 30):
        opts = _options(method, batch) | {"maxiter": maxiter} | extra
        count = HostReads()
        with count:
            res = amopt.minimize(
                prob, torch.zeros(20, dtype=torch.float64), method=method, options=opts
            )
        assert res.nit == maxiter
        out.append((count.syncs, count.total_ops))
    (s10, o10), (s30, o30) = out
    return (s30 - s10) / 20, (o30 - o10) / 20


def _cases():
    return [(m, False) for m in FULL + STOCHASTIC] + [(m, True) for m in ADAM_FAMILY]


@pytest.mark.parametrize(("method", "batch"), _cases())
def test_at_most_one_host_synchronisation_per_iteration(method, batch):
    syncs, _ = _per_iteration(method, batch)
    assert syncs <= 1.0


@pytest.mark.parametrize("options", [{"weight_decay": 0.1}, {"numerator": "linear"}])
def test_one_synchronisation_with_decay_and_either_numerator(options):
    for method in ("am-mgd", "am-sgd"):
        syncs, _ = _per_iteration(method, **options)
        assert syncs <= 1.0, method


@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("method", ["mgd", "am-mgd", "adamw", "am-adam", "am-adamw"])
def test_one_synchronisation_for_a_parameter_list(method, per_layer):
    """Several arrays, one beta per array or one for all: still one read per iteration."""
    gen = torch.Generator().manual_seed(1)
    targets = [torch.randn(5, 3, generator=gen, dtype=torch.float64), torch.randn(3)]

    def fun(xs):
        return sum(0.5 * ((x - t) ** 2).sum() for x, t in zip(xs, targets, strict=True))

    def jac(xs):
        return [x - t for x, t in zip(xs, targets, strict=True)]

    options = {"lr": 0.1, "gtol": 0.0} | (
        {"per_layer": per_layer} if method.startswith("am-") else {}
    )
    syncs = []
    for maxiter in (10, 30):
        count = HostReads()
        x0 = [torch.zeros(5, 3, dtype=torch.float64), torch.zeros(3)]  # float64 and float32
        with count:
            res = amopt.minimize(
                fun, x0, jac=jac, method=method, options=options | {"maxiter": maxiter}
            )
        assert res.nit == maxiter
        syncs.append(count.syncs)
    assert (syncs[1] - syncs[0]) / 20 <= 1.0


def test_the_counter_sees_host_reads():
    # the counting must not be vacuous: the loop's own reads, one by one, count
    count = HostReads()
    t = torch.ones(3, dtype=torch.float64)
    with count:
        float(t.sum())
        t.tolist()
        t.max().item()
        bool(t[0] > 0)
        t.to("cpu")
        np.asarray(t)
    assert count.syncs == 6


@pytest.mark.parametrize(("am", "base"), [("am-mgd", "mgd"), ("am-sgd", "msgd")])
def test_am_momentum_costs_at_most_twelve_ops_above_its_fixed_momentum(am, base):
    """The AM rule runs on the host: its step adds only the sums' dot products on the device."""
    _, ops_am = _per_iteration(am)
    _, ops_base = _per_iteration(base)
    assert ops_am - ops_base <= 12


@pytest.mark.parametrize(("am", "base"), [("am-adam", "adam"), ("am-adamw", "adamw")])
def test_am_adam_ops_are_array_work_only(am, base):
    """AM-Adam above Adam: its preconditioner, its sums (one dot each) and its apply.

    Counted from algorithms.md section 3 with ``weight_decay`` 0 (am-adam) or decoupled
    (am-adamw, whose extra numerator terms cost a dot each): ``p`` and its ``1 + lam p``
    (4 ops beyond Adam's second moment), ``u``, ``w``, ``d - g`` and the weighted
    factors of the sums (6), a dot per sum (5 to 7), the momentum update (4), at most
    24 in all; the rule's scalar arithmetic adds nothing (it runs on the host).
    """
    _, ops_am = _per_iteration(am)
    _, ops_base = _per_iteration(base)
    assert ops_am - ops_base <= 24


def _ops(fn):
    count = HostReads()
    with count:
        fn()
    return count.total_ops


def _step_ops(method, x, g):
    """Dispatched ops of one core step of ``method`` (past its first) at ``x``, ``g``."""
    from amopt.core.config import AMConfig
    from amopt.optimize import split as _split
    from amopt.optimize import steps as _core

    xs, gs = (x,), (g,)
    if method == "gd":
        return _ops(lambda: _core.gd_step(xs, gs, lr=0.01))
    if method == "mgd":
        state = _core.HeavyBallState(1, (g + 1.0,))
        return _ops(lambda: _core.heavy_ball_step(xs, gs, state, lr=0.01, beta=0.9))
    if method in ("adam", "adamw"):
        state = _core.AdamState(1, (g + 1.0,), (g * g,))
        return _ops(
            lambda: _core.adam_step(
                xs,
                gs,
                state,
                lr=0.01,
                decoupled=method == "adamw",
                weight_decay=0.01 if method == "adamw" else 0.0,
            )
        )
    config = AMConfig()
    state = _core.AMState(1, (g + 1.0,), 1.0, True)
    pending, sums = [], []

    def sums_part():
        pending[:], sums[:] = _split.am_momentum_sums(xs, gs, state, config=config)

    ops = _ops(sums_part)
    values = [float(s) for s in sums]
    return ops + _ops(
        lambda: _split.am_momentum_apply(
            xs, gs, state, tuple(pending), values, lr=0.01, f=0.5, config=config
        )
    )


@pytest.mark.parametrize("method", ["gd", "mgd", "am-mgd", "adam", "adamw"])
def test_the_loop_adds_six_ops_to_the_objective_and_the_step(method):
    """Per iteration: the objective, the core step, and the loop's own work: the copy of
    the returned gradient, ``max|x|``, ``max|g|`` (``abs`` and ``max`` each on the CPU,
    one infinity norm on CUDA) and the stack of the values read."""
    prob = _DeviceLeastSquares()
    x = torch.full((20,), 0.1, dtype=torch.float64)
    objective = _ops(lambda: prob.value_and_grad(x))
    _, g = prob.value_and_grad(x)
    _, per_iteration = _per_iteration(method)
    assert per_iteration <= objective + _step_ops(method, x, g) + 6


@pytest.mark.parametrize("method", ["am-mgd", "am-adamw", "am-sgd"])
def test_the_rule_runs_on_host_numbers(monkeypatch, method):
    seen = []
    for name in ("momentum_beta", "adam_beta"):
        rule = getattr(_rule, name)

        def spy(xp, sums, *args, _rule_fn=rule, **kwargs):
            seen.append(type(sums))
            return _rule_fn(xp, sums, *args, **kwargs)

        monkeypatch.setattr(_rule, name, spy)
    prob = _DeviceLeastSquares()
    amopt.minimize(
        prob, torch.zeros(20, dtype=torch.float64), method=method, options=_options(method, False)
    )
    # NumPy values (several scopes, or a rule that cannot be recorded), or the rule
    # recorded once (amopt.core.tape) and its tape run on host floats: never a tensor
    assert seen and set(seen) <= {np.ndarray, _tape._Sums}


# --------------------------------------------------------------------------- same iterates


class _Recording:
    def __init__(self, inner):
        self.inner, self.n_samples, self.batches = inner, inner.n_samples, []

    def value_and_grad(self, x):
        return self.inner.value_and_grad(x)

    def batch_value_and_grad(self, x, idx):
        # host indices for the test objective (a read per step: this test is about values)
        idx = np.asarray(idx.tolist() if hasattr(idx, "tolist") else idx)
        self.batches.append(idx)
        return self.inner.batch_value_and_grad(x, idx)


def _trajectory(xp, method, opts, as_list=False, dtype="float64"):
    X, y = logreg_data()
    prob = _Recording(Logistic(xp, X, y, as_list=as_list))
    dt = getattr(xp, dtype)
    x0 = (
        [xp.full(8, 0.1, dtype=dt), xp.zeros(1, dtype=dt)]
        if as_list
        else xp.full(8, 0.1, dtype=dt)
    )
    xs = []

    def callback(intermediate_result):
        parts = intermediate_result.x if as_list else [intermediate_result.x]
        xs.append(
            np.concatenate(
                [np.asarray(a.tolist() if hasattr(a, "tolist") else a).ravel() for a in parts]
            )
        )

    opts = {"lr": 0.5 / prob.inner.L, "maxiter": 25, "gtol": 0.0, **opts}
    res = amopt.minimize(prob, x0, method=method, options=opts, callback=callback)
    return res, np.array(xs), prob.batches


_SAME = [
    *[(m, {}) for m in FULL],
    *[(m, {"seed": 0}) for m in STOCHASTIC],
    ("am-mgd", {"numerator": "linear", "lam": 0.1, "weight_decay": 0.1, "variant": "clip"}),
    ("am-sgd", {"replace": True, "seed": 4, "batch_size": 5}),
    ("am-sgd", {"numerator": "exact", "weight_decay": 0.01, "seed": 1}),
    ("am-adamw", {"batch_size": 9, "seed": 2, "weight_decay_mode": "proximal"}),
    ("am-adam", {"numerator": "exact", "per_layer": False, "variant": "restart"}),
    ("msgd", {"batch_size": 7, "replace": True, "seed": 5}),
    ("adam", {"batch_size": 60, "seed": 6}),  # batch_size = n_samples: one batch per epoch
]


@pytest.mark.parametrize("as_list", [False, True])
@pytest.mark.parametrize(("method", "options"), _SAME)
def test_torch_runs_the_numpy_iterates_and_batches(method, options, as_list):
    """Same seed, same batches (drawn on the host, moved once per epoch) and iterates."""
    if as_list and method.startswith("am") and "per_layer" not in options:
        options = {**options, "per_layer": True}
    want, xs_np, batches_np = _trajectory(npx, method, options, as_list)
    got, xs_t, batches_t = _trajectory(tx, method, options, as_list)
    assert got.nit == want.nit == 25 and got.nfev == want.nfev and got.status == want.status
    assert len(batches_t) == len(batches_np)
    for b_t, b_np in zip(batches_t, batches_np, strict=True):
        np.testing.assert_array_equal(b_t, b_np)
    # float64, 25 steps of a well-conditioned problem: a few ulps per step
    np.testing.assert_allclose(xs_t, xs_np, rtol=0, atol=1e-12)
    assert math.isclose(float(got.fun), want.fun, rel_tol=1e-12)
    if "betas" in want:
        # the exact numerator divides a difference of f values by lr: 1e-9 absolute
        np.testing.assert_allclose(got.betas, want.betas, rtol=0, atol=1e-9)


@pytest.mark.parametrize("replace", [False, True])
def test_indices_move_to_the_device_once_per_block(monkeypatch, replace):
    moves = []
    real = _loop.to_device

    def counted(xp, a, like):
        moves.append(a.size)
        return real(xp, a, like)

    monkeypatch.setattr(_loop, "to_device", counted)
    prob = _DeviceLeastSquares(n=100)
    opts = {"lr": 0.01, "maxiter": 23, "batch_size": 10, "seed": 0, "replace": replace}
    res = amopt.minimize(prob, torch.zeros(20, dtype=torch.float64), method="am-sgd", options=opts)
    assert res.nit == 23
    # 10 steps per epoch of 100 samples: 3 epochs (with replacement, blocks of 10 steps,
    # the last one cut to the 3 steps left)
    assert moves == ([100] * 3 if not replace else [100, 100, 30])


# --------------------------------------------------------------------------- non-finite runs


class _Blowup:
    """A FiniteSum whose steps diverge: f = |x|^2 / 2 with a gradient 1000 x."""

    n_samples = 10

    def __init__(self, xp):
        self.xp = xp

    def batch_value_and_grad(self, x, idx):
        return 0.5 * self.xp.sum(x * x), 1e3 * x

    def value_and_grad(self, x):
        return self.batch_value_and_grad(x, None)


class _Seen(list):
    """A callback that records the ``nit`` of every iterate it is given."""

    def __call__(self, intermediate_result):
        self.append(intermediate_result.nit)


@pytest.mark.parametrize("with_callback", [False, True])
@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("gd", {"lr": 3.0}),
        ("am-mgd", {"lr": 1e306}),  # the first step's iterate overflows
        ("adam", {"lr": 1e308}),
        ("sgd", {"lr": 3.0}),
        ("am-sgd", {"lr": 3.0}),
        ("sgd", {"lr": 1e306}),  # the first step's iterate overflows
        ("am-adamw", {"lr": 1e308, "batch_size": 3}),
    ],
)
def test_non_finite_runs_stop_where_numpy_stops(method, options, with_callback):
    results = []
    for xp, x0 in ((np, np.ones(3)), (torch, torch.ones(3, dtype=torch.float64))):
        seen = _Seen()
        cb = seen if with_callback else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = amopt.minimize(
                _Blowup(xp),
                x0,
                method=method,
                callback=cb,
                options={"maxiter": 500, "gtol": 0.0, **options},
            )
        results.append((res, seen))
    (want, seen_np), (got, seen_t) = results
    assert got.status == want.status == 2 and got.nit == want.nit
    assert seen_t == seen_np
    np.testing.assert_array_equal(np.asarray(got.x.tolist()), want.x)
    assert float(got.fun) == want.fun
    assert len(got.get("betas", [])) == len(want.get("betas", []))


class _Overflow(_Blowup):
    """f and the gradient finite wherever x is: only a step can overflow."""

    def batch_value_and_grad(self, x, idx):
        return 1e-300 * self.xp.sum(self.xp.abs(x)), 1e-300 * x


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("with_callback", [False, True])
@pytest.mark.parametrize("method", ["sgd", "am-sgd"])
def test_a_last_step_that_overflows_is_taken_back(monkeypatch, method, pipelined, with_callback):
    # the step to iterate maxiter overflows: no mini-batch is drawn there, so the
    # waiting device loop reads that iterate only after the loop and takes it back
    def run(xp, x0, maxiter):
        seen = _Seen()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = amopt.minimize(
                _Overflow(xp),
                x0,
                method=method,
                callback=seen if with_callback else None,
                # x grows 1000-fold per step (sgd)
                options={"maxiter": maxiter, "gtol": 0.0, "lr": 1.001e303},
            )
        return res, seen

    first = run(np, np.ones(3), 500)[0]
    assert first.nit < 500 and np.isfinite(first.fun)  # ended on an overflowing step
    assert first.status == 2 and first.nit > 0  # the step after first.nit overflows
    want, seen_np = run(np, np.ones(3), first.nit + 1)
    monkeypatch.setattr(_loop, "_PIPELINE", pipelined)
    got, seen_t = run(torch, torch.ones(3, dtype=torch.float64), first.nit + 1)
    assert (got.status, got.nit, got.message) == (want.status, want.nit, want.message)
    assert want.nit == first.nit and seen_t == seen_np
    np.testing.assert_array_equal(np.asarray(got.x.tolist()), want.x)
    assert np.isfinite(want.x).all() and float(got.fun) == want.fun
    assert len(got.get("betas", [])) == len(want.get("betas", [])) == want.nit * (method != "sgd")


# --------------------------------------------------------------------------- import layers


def _imports(path: Path) -> set[str]:
    """The amopt modules ``path`` imports, at module level or inside functions."""
    parts = path.relative_to(Path(amopt.__file__).parents[1]).with_suffix("").parts
    package = parts[:-1]  # the package a relative import starts from
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("amopt")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join((*base, node.module) if node.module else base)
            else:
                module = node.module or ""
            if module.startswith("amopt"):
                out.add(module)
                out |= {f"{module}.{a.name}" for a in node.names}
    return out


def test_no_import_circle_through_the_loop_and_the_lazy_package():
    root = Path(amopt.__file__).parent
    files = [
        root / "optimize" / "loop.py",
        root / "backends" / "device.py",
        *sorted((root / "backends" / "dask").glob("*.py")),
    ]
    names = {
        ".".join(f.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): f
        for f in files
    }
    graph = {
        name: {m for m in _imports(f) if m in names and m != name} for name, f in names.items()
    }
    # nothing in the lazy package imports the loop (or anything above it)
    for name in names:
        if name.startswith(("amopt.backends.dask", "amopt.backends.device")):
            assert "amopt.optimize.loop" not in _imports(names[name]), name
            assert not any(
                m.startswith(("amopt.optimize.methods", "amopt.optimize.minimize"))
                for m in _imports(names[name])
            ), name

    def reaches(start, target, seen=()):
        return any(
            m == target or (m not in seen and reaches(m, target, (*seen, m))) for m in graph[start]
        )

    assert not any(reaches(name, name) for name in graph)


# --------------------------------------------------------------------------- GPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("method", "batch"), _cases())
def test_torch_cuda_synchronises_once_per_iteration(method, batch):
    """CUDA's own count: torch warns at every synchronising call in sync-debug mode."""
    prob = _DeviceLeastSquares()
    prob.A, prob.b = prob.A.cuda(), prob.b.cuda()
    counts = []
    for maxiter in (10, 30):
        opts = _options(method, batch) | {"maxiter": maxiter}
        x0 = torch.zeros(20, dtype=torch.float64, device="cuda")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                res = amopt.minimize(prob, x0, method=method, options=opts)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert res.nit == maxiter and res.x.is_cuda
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
    assert (counts[1] - counts[0]) / 20 <= 1.0


@pytest.mark.skipif(not library_available("cupy"), reason="needs CuPy and a GPU")
@pytest.mark.parametrize(("method", "options"), _SAME)
def test_cupy_runs_the_numpy_iterates_and_batches(method, options):
    import array_api_compat.cupy as cpx

    want, xs_np, batches_np = _trajectory(npx, method, options)
    got, xs_c, batches_c = _trajectory(cpx, method, options)
    assert got.nit == want.nit and got.status == want.status
    for b_c, b_np in zip(batches_c, batches_np, strict=True):
        np.testing.assert_array_equal(b_c, b_np)
    np.testing.assert_allclose(xs_c, xs_np, rtol=0, atol=1e-12)
    if "betas" in want:
        np.testing.assert_allclose(got.betas, want.betas, rtol=0, atol=1e-9)


@pytest.mark.skipif(not library_available("cupy"), reason="needs CuPy and a GPU")
@pytest.mark.parametrize(("method", "options"), [m for m in _SAME if m[0] not in FULL])
def test_cupy_pipelined_mini_batch_runs_are_the_numpy_runs(method, options):
    """Without a callback a CuPy mini-batch run is pipelined: same batches, same result."""
    import array_api_compat.cupy as cpx

    runs = []
    for xp in (npx, cpx):
        X, y = logreg_data()
        prob = _Recording(Logistic(xp, X, y))
        opts = {"lr": 0.5 / prob.inner.L, "maxiter": 25, "gtol": 0.0, **options}
        res = amopt.minimize(prob, xp.full(8, 0.1, dtype=xp.float64), method=method, options=opts)
        runs.append((res, prob.batches))
    (want, batches_np), (got, batches_c) = runs
    assert got.nit == want.nit == 25 and got.status == want.status and got.nfev == want.nfev
    for b_c, b_np in zip(batches_c, batches_np, strict=True):
        np.testing.assert_array_equal(b_c, b_np)
    np.testing.assert_allclose(got.x.get(), want.x, rtol=0, atol=1e-12)
    assert math.isclose(float(got.fun), want.fun, rel_tol=1e-12)
    if "betas" in want:
        np.testing.assert_allclose(got.betas, want.betas, rtol=0, atol=1e-9)
