"""``amopt.minimize`` on dask arrays: constant cost per step, and the NumPy run's iterates.

The oracle is the same run on NumPy arrays in memory. Every dask run uses an
explicit scheduler: the synchronous one, the threaded one, or a
``dask.distributed`` LocalCluster (two worker processes with one thread each)
started by this module. Each test, and the cluster's start and stop, runs
under a deadline, so that a hang fails instead of blocking the suite.
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import amopt
from amopt.problems import LeastSquares, LogisticRegression

from _deadline import deadline

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

from dask.callbacks import Callback  # noqa: E402
from distributed.diagnostics.plugin import SchedulerPlugin  # noqa: E402

from amopt.backends.dask._session import record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEST_SECONDS = 40
CLUSTER_SECONDS = 60
N, D, CHUNKS = 400, 8, 4
# Chunked sums (X^T r summed over 4 row chunks, dask's tree reductions) round
# differently from NumPy's; on these problems (condition number ~10^3) the
# iterates then agree to a few units in the last place of max|x|.
ATOL = 1e-12


@pytest.fixture(autouse=True)
def _test_deadline(request):
    with deadline(TEST_SECONDS, request.node.name):
        yield


@pytest.fixture(scope="module")
def client():
    with deadline(CLUSTER_SECONDS, "starting the LocalCluster"):
        cluster = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            memory_limit="1GiB",
        )
        client = distributed.Client(cluster, set_as_default=False)
        client.register_plugin(_GraphCounter())
    yield client
    with deadline(CLUSTER_SECONDS, "stopping the LocalCluster"):
        client.close()
        cluster.close()


class _GraphCounter(SchedulerPlugin):
    """Counts the graphs submitted to the scheduler."""

    name = "amopt-graph-counter"

    def __init__(self):
        self.graphs = 0

    def update_graph(self, scheduler, **kwargs):
        self.graphs += 1


def _graphs_submitted(client) -> int:
    return client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.plugins["amopt-graph-counter"].graphs
    )


class _SchedulerRuns(Callback):
    """Counts the runs of a local (synchronous or threaded) scheduler."""

    def __init__(self):
        super().__init__()
        self.runs = 0

    def _start(self, dsk):
        self.runs += 1


@contextmanager
def _scheduler(name, request):
    target = request.getfixturevalue("client") if name == "distributed" else name
    with dask.config.set(scheduler=target):
        yield target


def _data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D)) * np.geomspace(0.3, 10.0, D)
    w = rng.standard_normal(D)
    y = X @ w + 0.1 * rng.standard_normal(N)
    labels = np.where(X @ w + rng.standard_normal(N) > 0, 1, 0)
    return X, y, labels


def _chunked(a):
    return da.from_array(a, chunks=(N // CHUNKS,) + a.shape[1:])


def _problems(kind):
    X, y, labels = _data()
    if kind == "least-squares":
        return LeastSquares(X, y, l2=1e-3), LeastSquares(_chunked(X), _chunked(y), l2=1e-3)
    return (
        LogisticRegression(X, labels, l2=1e-3),
        LogisticRegression(_chunked(X), _chunked(labels), l2=1e-3),
    )


def _flat(x):
    """One NumPy vector from an array or a list of arrays (NumPy or dask)."""
    return np.concatenate([np.asarray(a).ravel() for a in (x if isinstance(x, list) else [x])])


def _run(fun, x0, method, options, **kwargs):
    """The result, with ``x`` flattened to NumPy, and every iterate (from the callback)."""
    iterates = []

    def callback(intermediate_result):
        iterates.append(_flat(intermediate_result.x))

    res = amopt.minimize(fun, x0, method=method, callback=callback, options=options, **kwargs)
    res.x_lazy, res.x = res.x, _flat(res.x)
    return res, iterates


def _assert_same_run(res, iterates, ref, ref_iterates, atol=ATOL):
    assert (res.nit, res.status, res.nfev, res.njev) == (ref.nit, ref.status, ref.nfev, ref.njev)
    assert len(iterates) == len(ref_iterates) == ref.nit
    scale = max(1.0, float(np.max(np.abs(ref.x))))
    for k, (a, b) in enumerate(zip(iterates, ref_iterates, strict=True)):
        np.testing.assert_allclose(a, b, rtol=0, atol=atol * scale, err_msg=f"iterate {k + 1}")
    np.testing.assert_allclose(res.x, ref.x, rtol=0, atol=atol * scale)
    np.testing.assert_allclose(res.fun, ref.fun, rtol=1e-12, atol=0)
    if "betas" in ref:
        np.testing.assert_allclose(res.betas, ref.betas, rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- constant cost


@pytest.mark.parametrize(("scheduler", "lengths"), [("sync", (10, 100)), ("threads", (5, 15))])
def test_graph_of_the_result_and_submissions_do_not_grow_with_maxiter(scheduler, lengths):
    prob_np, prob = _problems("least-squares")
    sizes, runs = {}, {}
    for maxiter in lengths:
        options = {"lr": 1.0 / prob_np.L, "maxiter": maxiter, "gtol": 0.0}
        with dask.config.set(scheduler=scheduler), _SchedulerRuns() as counter, record() as t:
            res = amopt.minimize(prob, da.zeros(D, chunks=D), method="am-mgd", options=options)
        assert res.nit == maxiter and res.status == 1
        sizes[maxiter] = (len(res.x.__dask_graph__()), len(res.jac.__dask_graph__()))
        runs[maxiter] = counter.runs
        assert t[0].submissions == counter.runs
    short, long = lengths
    # the iterate and the gradient are persisted: one chunk each, whatever maxiter
    assert sizes[short] == sizes[long] == (1, 1)
    # the first evaluation, then exactly one scheduler run per step
    assert runs == {short: short + 1, long: long + 1}


def test_one_graph_per_step_on_a_cluster(request):
    prob_np, prob = _problems("least-squares")
    with _scheduler("distributed", request) as client:
        counts = {}
        for maxiter in (3, 8):
            before = _graphs_submitted(client)
            options = {"lr": 1.0 / prob_np.L, "maxiter": maxiter, "gtol": 0.0}
            res = amopt.minimize(prob, da.zeros(D, chunks=D), method="am-mgd", options=options)
            counts[maxiter] = _graphs_submitted(client) - before
            assert res.nit == maxiter and len(res.x.__dask_graph__()) == 1
    assert counts == {3: 4, 8: 9}


# --------------------------------------------------------------------------- NumPy's iterates


@pytest.mark.parametrize("scheduler", ["threads", "sync", "distributed"])
@pytest.mark.parametrize("kind", ["least-squares", "logistic"])
def test_iterates_equal_the_numpy_run(kind, scheduler, request):
    prob_np, prob = _problems(kind)
    maxiter = 12 if scheduler == "distributed" else 25
    options = {"lr": 1.0 / prob_np.L, "maxiter": maxiter, "gtol": 0.0}
    ref, ref_iterates = _run(prob_np, np.zeros(D), "am-mgd", options)
    with _scheduler(scheduler, request):
        res, iterates = _run(prob, da.zeros(D, chunks=D), "am-mgd", options)
    assert isinstance(res.x_lazy, da.Array) and isinstance(res.jac, da.Array)
    _assert_same_run(res, iterates, ref, ref_iterates)
    # the run is informative: far from converged, beta away from its bounds
    assert np.max(np.abs(ref.jac)) > 1e-3 and 0.05 < np.median(ref.betas) < 0.99


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("gd", {}),
        ("mgd", {"beta": 0.8}),
        ("am-mgd", {"lam": 0.1, "numerator": "linear", "variant": "clip"}),
        ("am-mgd", {"weight_decay": 0.05}),
        ("adam", {"lr": 0.05, "weight_decay": 0.01}),
        ("am-adam", {"lr": 0.05, "weight_decay": 0.01, "numerator": "exact"}),
        ("am-adamw", {"lr": 0.05, "weight_decay": 0.01, "numerator": "exact"}),
    ],
)
def test_every_full_batch_method_on_a_parameter_list(method, options):
    # a user objective over a list of two dask arrays, per-layer betas where the method has them
    X, y, _ = _data()
    Xd, yd = _chunked(X), _chunked(y)

    def make(X, y):
        def fun(p):
            r = X[:, :3] @ p[0] + X[:, 3:] @ p[1].reshape(-1) - y
            return 0.5 * (r * r).sum() / N

        def jac(p):
            r = X[:, :3] @ p[0] + X[:, 3:] @ p[1].reshape(-1) - y
            return [X[:, :3].T @ r / N, (X[:, 3:].T @ r / N).reshape(p[1].shape)]

        return fun, jac

    L = float(np.linalg.eigvalsh(X.T @ X / N)[-1])
    opts = {"lr": 1.0 / L, "maxiter": 15, "gtol": 0.0, **options}
    if method.startswith("am-"):
        opts["per_layer"] = True
    fun, jac = make(X, y)
    ref, ref_iterates = _run(fun, [np.zeros(3), np.zeros((5, 1))], method, opts, jac=jac)
    fun, jac = make(Xd, yd)
    with dask.config.set(scheduler="threads"), record() as t:
        res, iterates = _run(fun, [da.zeros(3), da.zeros((5, 1))], method, opts, jac=jac)
    assert isinstance(res.x_lazy, list) and all(isinstance(a, da.Array) for a in res.x_lazy)
    _assert_same_run(res, iterates, ref, ref_iterates)
    # weight decay and the other per-step reads of the loop add no submission
    assert t[0].submissions == res.nit + 1
    if method.startswith("am-"):
        assert res.betas.shape == (15, 2)


@pytest.mark.parametrize(
    ("method", "options", "scheduler"),
    [
        ("am-sgd", {"batch_size": 16, "seed": 3}, "threads"),
        (
            "am-sgd",
            {"batch_size": 16, "seed": 4, "weight_decay": 0.1, "numerator": "exact"},
            "sync",
        ),
        ("am-sgd", {"batch_size": 16, "seed": 3, "replace": True}, "distributed"),
        ("adam", {"lr": 0.05, "batch_size": 10, "seed": 1}, "sync"),
    ],
)
def test_stochastic_methods_on_a_dask_finite_sum(method, options, scheduler, request):
    prob_np, prob = _problems("least-squares")
    opts = {"lr": 0.5 / prob_np.L_max, "maxiter": 10 if scheduler == "distributed" else 20}
    opts.update(options)
    ref, ref_iterates = _run(prob_np, np.zeros(D), method, opts)
    with _scheduler(scheduler, request), record() as t:
        res, iterates = _run(prob, da.zeros(D, chunks=D), method, opts)
    _assert_same_run(res, iterates, ref, ref_iterates)
    # the starting point, one submission per step, the final full evaluation
    assert t[0].submissions == res.nit + 2


def test_gtol_stops_at_the_same_step_as_numpy():
    c = np.linspace(1.0, 4.0, 6)
    options = {"lr": 0.25, "maxiter": 500, "gtol": 1e-6, "numerator": "linear", "lam": 0.1,
               "beta_max": 0.9}  # fmt: skip

    def run(x0):
        return amopt.minimize(lambda x: 0.5 * (c * x * x).sum(), x0, jac=lambda x: c * x,
                              method="am-mgd", options=options)  # fmt: skip

    ref = run(np.ones(6))
    with dask.config.set(scheduler="sync"):
        res = run(da.ones(6, chunks=3))
    assert ref.status == 0 and 5 < ref.nit < 100
    assert (res.status, res.nit, res.message) == (ref.status, ref.nit, ref.message)
    assert float(np.max(np.abs(np.asarray(res.jac)))) <= 1e-6 < float(np.max(np.abs(c)))


# --------------------------------------------------------------------------- non-finite, errors


def _diverging():
    c = np.array([1.0, 2.0, 1e10])

    def fun(x):
        return 0.5 * (c * x * x).sum()

    def jac(x):
        return c * x

    return fun, jac


def test_nonfinite_stops_with_the_last_finite_iterate_like_numpy():
    fun, jac = _diverging()
    options = {"lr": 1.0, "maxiter": 1000, "gtol": 0.0}
    with np.errstate(over="ignore", invalid="ignore"):
        ref = amopt.minimize(fun, np.ones(3), method="gd", jac=jac, options=options)
        with dask.config.set(scheduler="sync"):
            res = amopt.minimize(fun, da.ones(3, chunks=3), method="gd", jac=jac, options=options)
    assert ref.status == 2 and 5 < ref.nit < 40
    assert (res.status, res.nit, res.nfev) == (ref.status, ref.nit, ref.nfev)
    np.testing.assert_array_equal(np.asarray(res.x), ref.x)
    assert np.all(np.isfinite(np.asarray(res.x))) and res.fun == ref.fun


def test_objective_is_never_evaluated_at_a_nonfinite_iterate():
    fun, jac = _diverging()
    seen = []

    def probe(block):
        seen.append(bool(np.all(np.isfinite(block))))
        return np.zeros(1)

    def checked_fun(x):
        # records, when the graph runs, whether the point of each evaluation is finite
        return fun(x) + x.map_blocks(probe, chunks=(1,), meta=np.empty(0)).sum()

    with np.errstate(over="ignore", invalid="ignore"), dask.config.set(scheduler="sync"):
        res = amopt.minimize(checked_fun, da.ones(3, chunks=3), method="gd", jac=jac,
                             options={"lr": 1.0, "maxiter": 1000, "gtol": 0.0})  # fmt: skip
    assert res.status == 2 and len(seen) == res.nit + 2 and all(seen)


def test_a_nonscalar_objective_is_rejected_with_its_shape():
    with pytest.raises(
        ValueError, match=r"fun must return a scalar; got an array of shape \(3,\)"
    ):
        amopt.minimize(lambda x: x * x, da.ones(3, chunks=3), jac=lambda x: 2 * x)


def test_amopt_imports_and_runs_without_dask():
    code = (
        "import sys\n"
        "sys.modules['dask'] = None\n"
        "import numpy as np, amopt, amopt.problems\n"
        "res = amopt.minimize(lambda x: float(x @ x), np.ones(3), jac=lambda x: 2 * x,\n"
        "                     options={'lr': 0.25})\n"
        "loaded = {m.split('.')[0] for m, mod in sys.modules.items() if mod is not None}\n"
        "assert res.success and 'dask' not in loaded\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
