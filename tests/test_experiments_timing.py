"""The one timing harness (``amopt.bench._timing``) that the bench and the experiments share."""

from __future__ import annotations

import os
import statistics
import time

import pytest

from amopt.bench import _cli
from amopt.bench._timing import PhaseClock, cpu_model, interleave, machine_info, timed_rounds


def test_rounds_alternate_the_order_and_reduce_each_round():
    calls = []
    seconds = {"a": iter([1.0, 3.0, 2.0, 10.0, 20.0, 30.0]), "b": iter([5.0] * 6)}

    def workload(key):
        def run():
            calls.append(key)
            return {"x": next(seconds[key])}

        return run

    out = timed_rounds(
        {"a": workload("a"), "b": workload("b")},
        rounds=2,
        inner=3,
        warmup=0,
        reduce=statistics.median,
    )
    assert calls == ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3  # A B, then B A
    assert out == {"a": {"x": [2.0, 20.0]}, "b": {"x": [5.0, 5.0]}}


def test_rounds_time_a_workload_that_reports_nothing():
    warm = []
    out = timed_rounds(
        {"sleep": lambda: time.sleep(0.002), "warm": lambda: warm.append(1)},
        rounds=3,
        warmup=2,
    )
    assert len(out["sleep"]["total"]) == 3 and min(out["sleep"]["total"]) >= 0.002
    assert len(warm) == 2 + 3  # warm-up calls, then one per round
    with pytest.raises(ValueError, match="rounds >= 1"):
        timed_rounds({"a": lambda: None}, rounds=0)


def test_interleave_pairs_and_ratio():
    p = interleave(lambda: time.sleep(0.004), lambda: time.sleep(0.001), repeat=4, warmup=1)
    assert len(p.a) == len(p.b) == 4
    assert min(p.a) >= 0.004 and min(p.b) >= 0.001
    assert p.median_ratio > 1.0 and p.spread()[0] <= p.spread()[1]


def test_phase_clock_laps_add_up_and_sync_runs_before_every_mark():
    syncs = []
    clock = PhaseClock(lambda: syncs.append(1))
    clock.start()
    time.sleep(0.002)
    first = clock.lap()
    second = clock.lap()
    assert first >= 0.002 and second >= 0.0
    assert clock.total == pytest.approx(first + second)
    assert len(syncs) == 3  # start and two laps


def test_machine_info_names_the_cpu_and_versions():
    info = machine_info()
    assert info["cpu"] == cpu_model() and info["cpu"]
    assert "amopt" in info and "numpy" in info and not any(k.startswith("git") for k in info)


def test_bench_reads_a9a_from_the_data_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(_cli.A9A_ENV, raising=False)
    monkeypatch.setenv("AMOPT_DATA_DIR", str(tmp_path / "env"))
    assert _cli.a9a_file() == tmp_path / "env" / "libsvm" / "a9a"
    assert _cli.a9a_file(tmp_path) == tmp_path / "libsvm" / "a9a"
    assert _cli.main(["--rows", "minimize-a9a", "--quick", "--repeat", "1",
                      "--data-dir", str(tmp_path)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"skipped: a9a not found at {tmp_path / 'libsvm' / 'a9a'}" in out
    assert "--data-dir" in out
    assert _cli.A9A_ENV not in os.environ  # restored after the run
