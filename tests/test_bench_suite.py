"""The benchmark code runs: every case, the side-by-side command and every asv body, once.

CI checks correctness only: small sizes (``AMOPT_BENCH_QUICK=1``), no timing
assertions. Rows and benchmarks that need a missing data set, package or device
are skipped by the code under test, and that path is exercised too.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from amopt.bench import _cli, cases
from benchmarks import cases as harness_cases

torch = pytest.importorskip("torch")

#: the harness's folder: asv.conf.json, and the asv suite in asv_suite/
ASV_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def quick_env(monkeypatch):
    monkeypatch.setenv(cases.QUICK_ENV, "1")


# --------------------------------------------------------------------------- the table

#: The CPU stand-ins of the GPU targets, by row; checked with the rest of
#: the table here and in ``tests/test_bench_standins.py``.
STANDIN_TARGETS = {
    "triton-host-adamw": 1.0,
    "triton-host-adamw-1480": 1.0,  # against 3x the 148-tensor budget
    "triton-host-amsgd": 1.0,
    "triton-host-amsgd-1480": 1.0,
    "triton-host-adamw-compiled": None,  # informational
    "triton-host-adamw-sharded": None,  # informational
    "foreach-ops": 1.0,
    "foreach-ops-1480": 1.0,
    "minimize-syncs": 1.0,
    "minimize-ops": 1.0,
    "minimize-bytes-mgd": 1.1,
    "minimize-bytes-am-mgd": 1.3,
    "minimize-host-mgd": None,  # informational: host time against hand loops
    "minimize-host-am-mgd": None,
    "minimize-host-am-sgd": None,
}


def test_rows_carry_the_targets_of_the_issue():
    from benchmarks import cli as harness

    targets = {row.key: row.target for row in harness.ROWS}
    assert targets == {
        "adamw-layers": None,  # its target is the step over its memory-traffic floor:
        "adamw-layers-over-floor": 1.25,
        "adamw-global": 2.0,
        "adamw-default": 1.0,
        "adamw-foreach": 2.0,
        "adamw-compiled": 1.6,
        "amsgd-foreach": 2.0,
        "adamw-single-compiled": 1.6,
        "adamw-foreach-compiled": 1.6,
        "amsgd-single-compiled": None,  # their target is the step over its floor:
        "amsgd-foreach-compiled": None,
        "amsgd-compiled-floor": None,  # what a two-pass AMSGD step costs at least, here
        "amsgd-single-compiled-over-floor": 1.25,
        "amsgd-foreach-compiled-over-floor": 1.25,
        "amsgd-default": 1.3,
        "amsgd-default-global": None,
        "foreach-peakmem": None,
        "amsgd": 1.6,
        "minimize-a9a": 1.05,
        "core-numpy": 1.6,
        "peakmem": 1.05,
        "llama": 1.01,
        **STANDIN_TARGETS,  # the CPU stand-ins of the GPU targets
    }
    # python -m amopt.bench: the same rows, in the same order, without the stand-ins
    assert _cli.ROWS == tuple(r for r in harness.ROWS if r.key not in STANDIN_TARGETS)
    assert all(row.target is None for row in harness.EXTRA_ROWS)
    assert set(_cli.EXTRA_ROWS) <= set(harness.EXTRA_ROWS)
    # every row names its two sides and a unique key
    keys = [row.key for row in (*harness.ROWS, *harness.EXTRA_ROWS)]
    assert len(keys) == len(set(keys))


def test_quick_run_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    status = _cli.main(
        ["--quick", "--repeat", "2", "--rows", "adamw-global", "amsgd", "core", "--json", str(out)]
    )
    assert status == 0
    text = capsys.readouterr().out
    assert "| metric | AM side | baseline | ratio | target | status |" in text
    assert "QUICK sizes" in text and "Load average" in text
    # the header's memory-bandwidth probe: two positive GB/s figures, also in the JSON
    line = next(x for x in text.splitlines() if x.startswith("Memory bandwidth"))
    assert len(re.findall(r"\d+\.\d GB/s", line)) == 2
    payload = json.loads(out.read_text())
    assert payload["memory_bandwidth_gbs_before"] > 0
    assert payload["memory_bandwidth_gbs_after"] > 0
    assert [r["key"] for r in payload["rows"]] == ["adamw-global", "amsgd", "core-numpy"]
    for r in payload["rows"]:
        m = r["measured"]
        assert m["a"] > 0 and m["b"] > 0 and m["ratio"] > 0
        assert r["status"] in ("met", "MISSED")


def test_memory_bandwidth_counts_the_bytes_read_and_written(monkeypatch):
    from amopt.bench import _timing

    clock = itertools.count(0.0, 0.25)  # every copy takes 0.25 s on this clock
    monkeypatch.setattr(_timing.time, "perf_counter", lambda: next(clock))
    bw = _timing.memory_bandwidth(mib=2, repeat=3)
    assert bw == pytest.approx(2 * 2 * 2**20 / 0.25 / 1e9, rel=1e-12)


def _fake_row(key, target, ratio=None, skip=None):
    def measure(settings):
        if skip:
            raise cases.SkipCase(skip)
        return _cli.Measured(a=ratio, b=1.0, ratio=ratio, unit="ms")

    return _cli.Row(key, f"fake {key}", "A", "B", target, measure)


def test_check_exits_nonzero_when_a_target_is_missed(monkeypatch, capsys):
    monkeypatch.setattr(_cli, "ROWS", (_fake_row("good", 2.0, 1.5), _fake_row("bad", 1.0, 1.2)))
    assert _cli.main(["--repeat", "1"]) == 0  # without --check: report only
    assert _cli.main(["--repeat", "1", "--check"]) == 1
    captured = capsys.readouterr()
    assert "| fake bad |" in captured.out and "MISSED" in captured.out
    assert "targets missed: bad" in captured.err


def test_skipped_rows_are_reported_and_do_not_fail_the_check(monkeypatch, capsys):
    monkeypatch.setattr(
        _cli, "ROWS", (_fake_row("ok", 2.0, 1.0), _fake_row("nodata", 1.0, skip="no data here"))
    )
    assert _cli.main(["--check", "--repeat", "1"]) == 0
    assert "skipped: no data here" in capsys.readouterr().out


def test_list_and_row_filter(capsys):
    assert _cli.main(["--list", "--rows", "llama"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("llama")


# --------------------------------------------------------------------------- the cases


@pytest.mark.parametrize("kind", list(cases.OPTIMIZER_KINDS))
def test_optimizer_cases_step(kind):
    case = cases.OptimizerCase(kind, 3_000, 3, per_layer=True)
    before = [p.detach().clone() for p in case.params]
    case.run()
    assert any(not torch.equal(a, p) for a, p in zip(before, case.params, strict=True))
    assert case.state_bytes() >= (0 if kind == "sgd_foreach" else 3_000 * 4)


def test_read_floor_case_reads_gradients_and_buffers_then_steps_sgd():
    case = cases.ReadFloorCase(3_000, 3)
    # the read pass: <g, d> of every tensor, against float64 dots
    got = case._read(case.grads, case.bufs)
    pairs = zip(case.grads, case.bufs, strict=True)
    want = [float(torch.dot(g.double(), d.double())) for g, d in pairs]
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-4)  # float32 sums of 1000
    # then the compiled SGD step: one step of torch's SGD on copies
    params = [p.detach().clone().requires_grad_() for p in case.case.params]
    ref = torch.optim.SGD(params, lr=1e-3, momentum=0.9, dampening=0.9)
    ref.state.update(
        {q: {"momentum_buffer": b.clone()} for q, b in zip(params, case.bufs, strict=True)}
    )
    for q, g in zip(params, case.grads, strict=True):
        q.grad = g.clone()
    ref.step()
    case.run()
    for q, p in zip(params, case.case.params, strict=True):
        torch.testing.assert_close(p.detach(), q.detach())


def test_a_compiled_row_compiles_after_other_steps_spent_the_recompile_limit(monkeypatch):
    """Every optimizer's ``step`` is one code object to Dynamo: a compiled row starts with
    an empty cache, so its steps make their graph even after other optimizers' compiled
    steps spent the recompile limit (here 1); a row that timed eager steps would fail."""
    from amopt.bench import Settings

    # Dynamo's graphs run as traced (no inductor): the cache and its limit are Dynamo's
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    row = next(r for r in _cli.ROWS if r.key == "amsgd-single-compiled")
    with torch._dynamo.config.patch(recompile_limit=1):
        torch._dynamo.reset()
        cases.OptimizerCase("sgd_single_compiled", 3_000, 3).run()  # the one compile allowed
        m = row.measure(Settings(quick=True, repeat=2))
    torch._dynamo.reset()
    assert "1 graph(s) at the first step, 0 recompilation(s)" in m.note
    assert m.a > 0 and m.b > 0


def test_am_adamw_state_is_adamw_state_plus_scalars():
    am = cases.OptimizerCase("am_adamw_fused", 10_000, 4)
    ref = cases.OptimizerCase("adamw_fused", 10_000, 4)
    am.run()
    ref.run()
    extra = am.state_bytes() - ref.state_bytes()
    assert 0 <= extra <= 4 * 16  # per tensor: a 0-d beta1_prod and beta, at most


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_peak_state_memory_measures_the_state():
    out = cases.peak_state_memory("am_adamw_fused", 50_000, 2, True)
    assert out["state_bytes"] >= 2 * 50_000 * 4
    assert out["peak_extra_bytes"] >= 0


@pytest.mark.parametrize("backend", cases.array_backends())
@pytest.mark.parametrize("method", ["am-mgd", "mgd"])
def test_core_step_cases(backend, method):
    case = cases.CoreStepCase(method, 1_000, backend)
    case.run()


def test_core_step_case_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown method"):
        cases.CoreStepCase("adam", 10)
    with pytest.raises(ValueError, match="unknown backend"):
        cases.CoreStepCase("mgd", 10, "jax")


def test_minimize_case_both_sides():
    try:
        am = cases.MinimizeCase("am-mgd", iterations=3)
    except cases.SkipCase as exc:
        pytest.skip(str(exc))
    hb = cases.MinimizeCase("heavy-ball", iterations=3)
    xa, xb = am.run(), hb.run()
    assert xa.shape == xb.shape == (123,) and np.all(np.isfinite(xa))


def test_minimize_case_skips_without_data(monkeypatch, tmp_path):
    monkeypatch.setenv("AMOPT_A9A", str(tmp_path / "missing"))
    with pytest.raises(cases.SkipCase, match="a9a not found"):
        cases.MinimizeCase("am-mgd")


def _tiny_llama(path):
    try:
        return cases.LlamaCase(
            "am-adamw", batch=2, seq_len=16, hidden=32, layers=1, vocab=64, path=path
        )
    except cases.SkipCase as exc:
        assert "transformers" in str(exc)
        pytest.skip(str(exc))


def test_llama_case_or_clean_skip():
    loss = _tiny_llama("fused").run()
    assert np.isfinite(loss)


@pytest.mark.parametrize("path", [p for p in cases.LLAMA_PATHS if p != "default"])
def test_llama_paths_train_the_same_model(path):
    """Every path of the LLaMA rows steps the same model the same way.

    The paths differ only in the rounding of the update (about 1e-7 relative in float32),
    which moves the loss of the next iterations by about as much; torch's AdamW in place
    of AM-AdamW moves it by 6e-6 after one step and 2e-5 after three, so 1e-6 separates
    a different optimizer from a different rounding.
    """
    ref, case = _tiny_llama("default"), _tiny_llama(path)
    losses = [(ref.run(), case.run()) for _ in range(4)]
    np.testing.assert_allclose(*zip(*losses, strict=True), rtol=1e-6)
    with pytest.raises(ValueError, match="path must be one of"):
        cases.LlamaCase("am-adamw", path="jit")


@pytest.mark.parametrize("method", harness_cases.QUALITY_METHODS)
def test_solver_quality_on_the_quadratic(method):
    out = harness_cases.solver_quality("quadratic", method, maxiter=2000)
    assert out["final_suboptimality"] < 1e-6
    assert 1 <= out["iterations_to_1e-6"] <= 2000


def test_solver_quality_reports_nan_when_not_reached():
    out = harness_cases.solver_quality("mushrooms", "gd", maxiter=3)
    assert out["final_suboptimality"] > 1e-6 and np.isnan(out["iterations_to_1e-6"])


# --------------------------------------------------------------------------- asv bodies


def _asv_modules():
    sys.path.insert(0, str(ASV_DIR))
    try:
        names = sorted(
            p.stem for p in (ASV_DIR / "asv_suite").glob("*.py") if p.stem != "__init__"
        )
        # as asv imports them: the package asv_suite, with its parent folder on sys.path
        return [importlib.import_module(f"asv_suite.{name}") for name in names]
    finally:
        sys.path.remove(str(ASV_DIR))


def _benchmark_classes():
    for module in _asv_modules():
        for name in dir(module):
            obj = getattr(module, name)
            if isinstance(obj, type) and obj.__module__ == module.__name__:
                methods = [
                    m for m in dir(obj) if m.startswith(("time_", "peakmem_", "track_", "mem_"))
                ]
                if methods:
                    yield f"{module.__name__}.{name}", obj, methods


def test_asv_config_is_valid_json_with_comments():

    text = (ASV_DIR / "asv.conf.json").read_text()
    conf = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
    assert conf["benchmark_dir"] == "asv_suite" and conf["repo"] == ".."


@pytest.mark.parametrize(
    ("name", "cls", "methods"),
    [pytest.param(*b, id=b[0]) for b in _benchmark_classes()],
)
def test_asv_benchmark_bodies_run_once(name, cls, methods, quick_env):
    params = getattr(cls, "params", ())
    if params and not isinstance(params[0], list | tuple):
        params = (params,)
    combos = list(itertools.product(*params)) if params else [()]
    bench = cls()
    cache = (bench.setup_cache(),) if hasattr(bench, "setup_cache") else ()
    ran = 0
    for combo in combos:
        args = (*cache, *combo)
        try:
            if hasattr(bench, "setup"):
                bench.setup(*args)
        except NotImplementedError:
            continue  # asv's way to skip a combination (missing data, package or device)
        for m in methods:
            value = getattr(bench, m)(*args)
            if m.startswith("track_"):
                assert isinstance(value, int | float)
        if hasattr(bench, "teardown"):
            bench.teardown(*args)
        ran += 1
    if ran == 0:
        pytest.skip(f"{name}: every combination is skipped here")
