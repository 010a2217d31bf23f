"""The GPU rows of the bench: selection, "no GPU" without one, errors that do not stop the
run, the JSON, the time cap, and the CuPy rows' comparisons run on NumPy stand-ins.

On a machine with CUDA the rows themselves run with ``python -m benchmarks --gpu``;
here they must say why they cannot.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import amopt  # noqa: E402
from amopt.bench import cases  # noqa: E402
from amopt.bench._records import Measured, Row, Settings  # noqa: E402
from amopt.bench._timing import timed_rounds  # noqa: E402
from benchmarks import cli as _cli  # noqa: E402
from benchmarks import gpu as _gpu  # noqa: E402

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the rows measure on a GPU here")

GPU_KEYS = [
    "gpu-gpt2-bf16-fused",
    "gpu-gpt2-bf16",
    "gpu-gpt2-fp32-fused",
    "gpu-gpt2-fp32",
    "gpu-host-adamw",
    "gpu-host-adamw-1480",
    "gpu-host-amsgd",
    "gpu-host-amsgd-1480",
    "gpu-amsgd",
    "gpu-foreach",
    "gpu-1b-bf16",
    "gpu-gpt2-train",
    "gpu-quad-mgd",
    "gpu-quad-am-mgd",
    "gpu-quad-am-mgd-torch",
    "gpu-libsvm",
    "gpu-am-sgd-256",
    "gpu-am-sgd-4096",
    "gpu-am-sgd-256-hand",
    "gpu-graph",
    "gpu-fsdp2",
    "gpu-compiled",
]


def test_gpu_rows_and_targets():
    assert [r.key for r in _gpu.ROWS] == GPU_KEYS
    targets = {r.key: r.target for r in _gpu.ROWS}
    assert targets["gpu-gpt2-bf16-fused"] == 1.5 and targets["gpu-gpt2-bf16"] == 1.0
    assert targets["gpu-gpt2-fp32"] == 1.0 and targets["gpu-gpt2-fp32-fused"] is None
    assert all(targets[k] == 1.5 for k in GPU_KEYS if k.startswith("gpu-host"))
    assert targets["gpu-graph"] == 1.3 and targets["gpu-compiled"] == 1.5
    assert targets["gpu-1b-bf16"] == 1.3 and targets["gpu-amsgd"] == 1.3
    assert targets["gpu-fsdp2"] == 1.5 and targets["gpu-gpt2-train"] == 1.005
    assert targets["gpu-quad-mgd"] == 1.1 and targets["gpu-quad-am-mgd"] == 1.3
    assert targets["gpu-libsvm"] == targets["gpu-am-sgd-256"] == 1.0
    assert targets["gpu-am-sgd-256-hand"] is None and targets["gpu-quad-am-mgd-torch"] is None
    keys = [r.key for r in (*_cli.ROWS, *_cli.EXTRA_ROWS, *_cli.GPU_ROWS)]
    assert len(keys) == len(set(keys))


def test_gpu_flag_selects_the_gpu_rows(capsys):
    assert _cli.main(["--list", "--gpu"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.strip().splitlines()]
    assert listed == GPU_KEYS
    assert _cli.main(["--list", "--rows", "gpu-graph", "adamw-global"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.strip().splitlines()]
    assert listed == ["adamw-global", "gpu-graph"]
    assert _cli.main(["--list"]) == 0  # the default run has no GPU row
    assert not any(line.startswith("gpu-") for line in capsys.readouterr().out.splitlines())
    assert _cli.main(["--list", "--all"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.strip().splitlines()]
    assert listed == [r.key for r in (*_cli.ROWS, *_cli.EXTRA_ROWS, *_cli.GPU_ROWS)]


def test_the_package_bench_has_no_gpu_row_and_says_where_they_are():
    from amopt.bench import _cli as user

    with pytest.raises(SystemExit, match="python -m benchmarks --gpu"):
        user.main(["--gpu", "--list"])
    assert not any(r.key.startswith("gpu-") for r in (*user.ROWS, *user.EXTRA_ROWS))


@no_cuda
def test_gpu_rows_say_no_gpu_and_the_json_says_so(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert _cli.main(["--gpu", "--quick", "--check", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert payload["settings"]["row_seconds"] == _cli.GPU_ROW_SECONDS
    assert [r["key"] for r in payload["rows"]] == GPU_KEYS
    for r in payload["rows"]:
        assert r["status"] == "skipped" and r["skipped"].startswith("no GPU"), r
    assert "skipped: no GPU" in capsys.readouterr().out


@no_cuda
def test_child_process_rows_say_no_gpu():
    with pytest.raises(cases.SkipCase, match="no GPU"):
        _gpu._child("compiled", Settings(quick=True), timeout=120)


def _failing(s):
    raise RuntimeError("NYI: aten._pin_memory.default")


def test_a_failing_row_is_an_error_and_the_run_goes_on(monkeypatch, tmp_path, capsys):
    ok = Row("ok", "fine", "A", "B", 2.0, lambda s: Measured(1.0, 1.0, 1.0, "ms"))
    bad = Row("bad", "broken", "A", "B", 1.5, _failing)
    monkeypatch.setattr(_cli, "ROWS", (bad, ok))
    out = tmp_path / "r.json"
    assert _cli.main(["--repeat", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| broken | - | - | - | <= 1.5 | error: RuntimeError: NYI: aten._pin_memory" in text
    rows = json.loads(out.read_text())["rows"]
    assert [r["status"] for r in rows] == ["error", "met"]
    assert "test_bench_gpu.py" in rows[0]["error"]  # where it was raised
    assert _cli.main(["--repeat", "1", "--check"]) == 1  # an error is not a met target


def test_time_cap_stops_after_the_minimum_rounds():
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.02)

    out = timed_rounds({"a": slow}, rounds=50, warmup=1, max_seconds=0.01, min_rounds=3)
    assert len(out["a"]["total"]) == 3 and len(calls) == 4
    out = timed_rounds({"a": slow}, rounds=5, warmup=0)
    assert len(out["a"]["total"]) == 5


# --------------------------------------------------------------------------- CuPy rows on NumPy


@pytest.fixture
def numpy_as_cupy(monkeypatch):
    """The CuPy rows with NumPy standing in for CuPy (both sides then run on the CPU)."""
    device = SimpleNamespace(synchronize=lambda: None, id=0)
    fake = SimpleNamespace(
        __version__="(NumPy stand-in)",
        asarray=np.asarray,
        ones=np.ones,
        zeros=np.zeros,
        cuda=SimpleNamespace(
            Device=lambda *a: device,
            runtime=SimpleNamespace(getDeviceProperties=lambda i: {"name": b"CPU"}),
        ),
    )
    monkeypatch.setattr(_gpu, "require_cupy", lambda: fake)
    monkeypatch.setattr(_gpu, "_sync_cupy", lambda: None)
    return fake


def test_hand_loop_has_the_iterates_of_minimize_mgd():
    """The hand-written baseline is the same algorithm as the side it is compared with."""
    h = np.geomspace(1e-3, 1.0, 100)

    def vg(x):
        return 0.5 * float(h @ (x * x)), h * x

    x0 = np.ones(100)
    hand = _gpu.HandHeavyBall(vg, x0, lr=1.0).run(30)
    ours = amopt.minimize(vg, x0, jac=True, method="mgd", options={"lr": 1.0, "maxiter": 30})
    assert ours.nit == 30
    np.testing.assert_allclose(hand, ours.x, rtol=1e-13, atol=1e-15)


def test_hand_mini_batch_loop_has_the_iterates_of_minimize_msgd():
    """The hand-written mini-batch baseline: minimize's msgd with the same seed, over
    epochs whose last batch is smaller (100 rows in batches of 30)."""
    from amopt.problems import LeastSquares

    rng = np.random.default_rng(1)
    problem = LeastSquares(rng.standard_normal((100, 8)), rng.standard_normal(100))
    x0 = np.zeros(8)
    hand = _gpu.HandMiniBatch(problem, x0, 0.05, 30, np.asarray, seed=3).run(17)
    opts = {"lr": 0.05, "maxiter": 17, "batch_size": 30, "seed": 3}
    ours = amopt.minimize(problem, x0, method="msgd", options=opts)
    assert ours.nit == 17
    # float64, 17 steps of a well-conditioned least-squares problem: rounding only
    np.testing.assert_allclose(hand, ours.x, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "key", ["gpu-quad-mgd", "gpu-quad-am-mgd", "gpu-am-sgd-256", "gpu-am-sgd-256-hand"]
)
def test_cupy_rows_measure_per_iteration(key, numpy_as_cupy):
    row = next(r for r in _gpu.ROWS if r.key == key)
    m = row.measure(Settings(repeat=2, quick=True))
    assert m.unit == "ms/it" and m.a > 0 and m.b > 0 and m.ratio > 0
    assert "(NumPy stand-in)" in m.note and "2 pairs" in m.note


def test_libsvm_row_reads_the_data_folder_file(numpy_as_cupy, monkeypatch, tmp_path):
    rng = np.random.default_rng(0)
    lines = []
    for i in range(40):
        feats = sorted(rng.choice(np.arange(1, 124), size=5, replace=False))
        lines.append(f"{1 if i % 2 else -1} " + " ".join(f"{j}:1" for j in feats))
    path = tmp_path / "a9a"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("AMOPT_A9A", str(path))
    m = next(r for r in _gpu.ROWS if r.key == "gpu-libsvm").measure(Settings(repeat=2, quick=True))
    assert "40 x 123" in m.note and m.a > 0
    monkeypatch.setenv("AMOPT_A9A", str(tmp_path / "missing"))
    with pytest.raises(cases.SkipCase, match="a9a not found"):
        next(r for r in _gpu.ROWS if r.key == "gpu-libsvm").measure(Settings(quick=True))


def test_a_long_error_keeps_its_start_and_its_end():
    def compile_error(s):
        raise RuntimeError("g++ " + "-O3 " * 500 + "internal compiler error: Segmentation fault")

    (result,) = _cli.run_rows([Row("long", "long", "A", "B", 1.0, compile_error)], Settings())
    assert result.status == "error" and result.error.startswith("RuntimeError: g++ -O3")
    assert "... " in result.error and "internal compiler error: Segmentation fault" in result.error
    assert len(result.error) < 800


def test_json_is_written_after_every_row(monkeypatch, tmp_path):
    """A run cut short by a time limit keeps the rows it measured."""
    out = tmp_path / "partial.json"
    seen = {}

    def second(s):
        seen.update(json.loads(out.read_text()))
        return Measured(1.0, 1.0, 1.0, "ms")

    first = Row("first", "first", "A", "B", 2.0, lambda s: Measured(1.0, 2.0, 0.5, "ms"))
    monkeypatch.setattr(_cli, "ROWS", (first, Row("second", "second", "A", "B", 2.0, second)))
    assert _cli.main(["--repeat", "1", "--quick", "--json", str(out)]) == 0
    assert seen["complete"] is False and [r["key"] for r in seen["rows"]] == ["first"]
    final = json.loads(out.read_text())
    assert final["complete"] is True and [r["key"] for r in final["rows"]] == ["first", "second"]


def test_am_sgd_row_counts_the_iterations_not_the_full_evaluation(numpy_as_cupy, monkeypatch):
    """The row's time per iteration leaves out the full evaluation that ends a mini-batch
    run: made 0.2 s slower, it changes neither side's figure by that much."""
    from amopt.problems import LogisticRegression

    row = next(r for r in _gpu.ROWS if r.key == "gpu-am-sgd-256")
    settings = Settings(repeat=3, quick=True)
    base = row.measure(settings)
    full = LogisticRegression.value_and_grad

    def slow_full(self, x):
        time.sleep(0.2)
        return full(self, x)

    monkeypatch.setattr(LogisticRegression, "value_and_grad", slow_full)
    slowed = row.measure(settings)
    # 0.2 s over the row's 10 iterations would add 20 ms per iteration
    assert slowed.a < base.a + 5.0 and slowed.b < base.b + 5.0, (base, slowed)
    assert "timed apart" in slowed.note
