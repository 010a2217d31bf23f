"""``python -m amopt.experiments``: every experiment in ``--quick`` mode, the report, the CLI."""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import amopt
from amopt.bench._timing import cpu_model
from amopt.experiments import EXPERIMENTS
from amopt.experiments.__main__ import build_parser, main
from amopt.experiments._common import downsample, first_below, sanitize
from amopt.experiments.llm import _lr_lambda, _steps_to

pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOP_KEYS = {
    "experiment",
    "title",
    "config",
    "summary",
    "claims",
    "plots",
    "wall_time_s",
    "environment",
    "quick",
    "seed",
}
VERDICTS = {"holds", "partly", "does not hold", "n/a", "see plot", "see table"}


def _needs(name: str) -> str | None:
    """Why an experiment cannot run here (missing data or package), or None."""
    if name == "vision" and not (SHARED / "fashion-mnist").is_dir():
        if not Path("/usr/share/datasets/fashion-mnist").is_dir():
            return "Fashion-MNIST not found"
    if name in ("vision", "llm"):
        try:
            import torch  # noqa: F401
        except ImportError:
            return "torch not installed"
    if name == "llm":
        if not (SHARED / "text" / "tinyshakespeare" / "input.txt").is_file():
            return "tiny-shakespeare not found"
        try:
            import transformers  # noqa: F401
        except ImportError:
            return "transformers not installed"
    return None


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory) -> Path:
    """Every runnable experiment in --quick mode, once, into one output folder.

    The data come from the shared data folder, passed explicitly, and nothing is
    downloaded.
    """
    out = tmp_path_factory.mktemp("experiments")
    common = ["--quick", "--quiet", "--out", str(out), "--seed", "0", "--no-download"]
    for name in EXPERIMENTS:
        if _needs(name) is None:
            assert main([name, *common, "--data-dir", str(SHARED)]) == 0
    return out


def _numbers(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _numbers(v)
    elif isinstance(obj, int | float) and not isinstance(obj, bool):
        yield obj


def _load(out: Path, name: str) -> dict:
    reason = _needs(name)
    if reason:
        pytest.skip(reason)
    return json.loads((out / name / "results.json").read_text())


def _check_common(out: Path, name: str, res: dict) -> None:
    assert TOP_KEYS <= set(res)
    assert res["experiment"] == name and res["quick"] is True and res["seed"] == 0
    env = res["environment"]
    assert env["amopt"] == amopt.__version__ and env["numpy"] == np.__version__
    assert env["python"] == platform.python_version() and env["cpu"] == cpu_model()
    assert not any(key.startswith("git") for key in env)
    assert res["wall_time_s"] > 0
    assert all(math.isfinite(v) for v in _numbers(res))
    assert res["claims"], "every experiment states the paper's claims it checks"
    for claim in res["claims"]:
        assert set(claim) == {"claim", "measured", "verdict"}
        assert claim["verdict"] in VERDICTS
    assert res["plots"]
    for plot in res["plots"]:
        data = (out / name / plot).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    summary = (out / name / "summary.md").read_text()
    assert summary.startswith("## ") and "| " in summary and "Wall time" in summary


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_quick_run_writes_json_plots_and_summary(quick_out, name):
    res = _load(quick_out, name)
    _check_common(quick_out, name, res)


def test_quadratic_keys(quick_out):
    res = _load(quick_out, "quadratic")
    problems = res["summary"]["problems"]
    assert problems
    for p in problems:
        assert set(p["methods"]) >= {"GD", "MGD (beta*)", "HB (beta*)", "AM-MGD (exact)",
                                     "AM-MGD (linear)"}  # fmt: skip
        for m in p["methods"].values():
            assert m["final_rel_gap"] is not None and m["best_rel_gap"] is not None
        assert 0 <= p["methods"]["AM-MGD (exact)"]["mean_beta"] <= 1
        assert p["beta_star_damped"] in res["config"]["betas"]
        assert len(p["verdict"]) == 4


def test_logreg_keys(quick_out):
    res = _load(quick_out, "logreg")
    sets = res["summary"]["datasets"]
    assert [s["dataset"] for s in sets] == ["mushrooms", "a1a"]
    for s in sets:
        assert s["lr"] == pytest.approx(1 / s["L"])
        for m in ("GD", "MGD (0.9)", "MGD (beta*)", "AM-MGD (exact)", "AM-MGD (linear)"):
            e = s["methods"][m]
            assert e["nit"] == res["config"]["maxiter"]
            assert e["final_gap"] >= -1e-12 and e["final_f"] == pytest.approx(
                e["final_gap"] + s["f_star"], abs=1e-12
            )
        for method in ("L-BFGS-B", "CG"):
            hit = s["scipy"][method]["to_am_exact"]
            assert hit["iterations"] is not None and hit["seconds"] >= 0
    curve = res["curves"]["a1a"]["GD"]
    assert curve["step"][0] == 0 and curve["step"][-1] == res["config"]["maxiter"]


def test_logreg_adam_keys(quick_out):
    res = _load(quick_out, "logreg-adam")
    for s in res["summary"]["datasets"]:
        assert set(s["methods"]) == {"Adam", "AM-Adam (linear)", "AM-Adam (exact)"}
        assert 0 <= s["methods"]["AM-Adam (linear)"]["mean_beta"] <= 0.9 + 1e-12


def test_theory_keys(quick_out):
    res = _load(quick_out, "theory")
    checks = res["summary"]["checks"]
    assert {c["theorem"] for c in checks} == {"3.1", "3.2", "fixed-cap"}
    for c in checks:
        assert c["measured"] >= 0 and c["bound"] > 0
        assert c["passed"] == (c["measured"] <= c["bound"])
        assert c["ratio"] == pytest.approx(c["measured"] / c["bound"])


def test_vision_keys(quick_out):
    res = _load(quick_out, "vision")
    main_ = res["summary"]["main"]
    for opt in ("MGD", "AM-MGD"):
        assert 0 <= main_[opt]["test_acc_mean"] <= 1
    beta = res["curves"]["AM-MGD seed 0"]["beta"]["value"]
    assert beta[0] == 0.0 and all(0 <= b <= 0.9 + 1e-6 for b in beta)  # step 0: d = g
    params = {(e["param"], e["optimizer"]) for e in res["summary"]["ablation"]}
    assert ("lam", "AM-MGD") in params and ("lr", "MGD") in params
    assert ("batch_size", "AM-MGD") in params


def test_llm_keys(quick_out):
    res = _load(quick_out, "llm")
    for size in res["summary"].values():
        runs = size["runs"]
        assert {"AdamW (warm-up)", "AdamW (no warm-up)", "AM-AdamW (warm-up)",
                "AM-AdamW (no warm-up)", "AM-AdamW (clip)", "AM-AdamW (restart)",
                "AM-AdamW beta_max=0.95", "AM-AdamW beta_max=0.99"} <= set(runs)  # fmt: skip
        for r in runs.values():
            assert r["final_val_loss"] is not None and 0 < r["final_val_loss"] < 6.0
        assert runs["AdamW (warm-up)"]["warmup_steps"] == 2
        assert runs["AdamW (no warm-up)"]["warmup_steps"] == 0
        assert 0 <= runs["AM-AdamW (warm-up)"]["beta_mean"] <= 0.9
        t = size["timing"]
        assert t["AdamW single-tensor"]["iter_s"] > 0 and "overhead foreach" in t
        assert "overhead fused" in t or "AM-AdamW fused" in t["unavailable"]
        assert len(size["runs"]["AM-AdamW (warm-up)"]["beta_mean_per_tensor"]) > 5
        seeds = size["seeds"]
        first = seeds["AdamW (warm-up)"]["final_val_per_seed"][0]
        assert first == pytest.approx(runs["AdamW (warm-up)"]["final_val_loss"])
        for won, n in seeds["paired"].values():
            assert 0 <= won <= n == len(seeds["seeds"])
    assert len(res["summary"]["tiny-a"]["seeds"]["seeds"]) == 2


def test_report_collects_every_experiment(quick_out):
    names = [n for n in EXPERIMENTS if _needs(n) is None]
    before = {n: (quick_out / n / "summary.md").read_text() for n in names}
    assert main(["report", "--out", str(quick_out), "--quiet"]) == 0
    for n in names:  # the tables rendered again from results.json are the same
        assert (quick_out / n / "summary.md").read_text() == before[n]
    text = (quick_out / "SUMMARY.md").read_text()
    assert "## The paper's claims and what was measured" in text
    for name in EXPERIMENTS:
        if _needs(name) is None:
            assert f"| {name} |" in text
            res = json.loads((quick_out / name / "results.json").read_text())
            for plot in res["plots"]:
                assert f"({name}/{plot})" in text


def test_report_without_results_fails_clearly(tmp_path, capsys):
    assert main(["report", "--out", str(tmp_path)]) == 1
    assert "no <experiment>/results.json" in capsys.readouterr().err


def test_help_lists_every_experiment(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for name in [*EXPERIMENTS, "all", "report"]:
        assert f"  {name} " in out
    flags = ("--quick", "--out", "--seed", "--data-dir", "--no-download", "--quiet", "--threads")
    for flag in flags:
        assert flag in out


def test_unknown_experiment_is_rejected(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["cifar"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_missing_data_gives_a_clear_message(tmp_path, capsys, monkeypatch):
    from amopt.experiments import _data

    monkeypatch.setattr(_data, "DEBIAN_FASHION_MNIST", tmp_path / "none")
    missing = tmp_path / "nowhere"
    args = ["--quick", "--data-dir", str(missing), "--out", str(tmp_path), "--no-download"]
    assert main(["vision", *args]) == 1
    err = capsys.readouterr().err
    assert "vision: missing data" in err and "Fashion-MNIST not found" in err
    assert str(missing / "fashion-mnist") in err and "--data-dir" in err
    assert "text/tinyshakespeare/input.txt" in err  # the layout of the data folder
    assert main(["llm", *args]) == 1
    err = capsys.readouterr().err
    assert f"not found at {missing / 'text' / 'tinyshakespeare' / 'input.txt'}" in err
    assert "--no-download" in err and _data.TEXT_URL in err
    assert main(["logreg", *args, "--datasets", "w8a"]) == 1
    err = capsys.readouterr().err
    assert f"not found at {missing / 'libsvm' / 'w8a'}" in err and "AMOPT_DATA_DIR" in err


def test_data_folder_defaults_to_the_environment_variable(tmp_path, capsys, monkeypatch):
    """Without --data-dir the experiments read $AMOPT_DATA_DIR, never the checkout."""
    monkeypatch.setenv("AMOPT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    out = ["--quick", "--out", str(tmp_path / "out"), "--no-download"]
    assert main(["logreg", *out, "--datasets", "a9a"]) == 1
    assert f"not found at {tmp_path / 'data' / 'libsvm' / 'a9a'}" in capsys.readouterr().err


def test_module_entry_point_help():
    proc = subprocess.run(
        [sys.executable, "-m", "amopt.experiments", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "logreg-adam" in proc.stdout and "theory" in proc.stdout


# --------------------------------------------------------------------------- helpers


def test_lr_schedule_warmup_then_cosine_to_zero():
    f = _lr_lambda(100, 10)
    assert f(0) == 0.0 and f(5) == pytest.approx(0.5) and f(10) == pytest.approx(1.0)
    assert f(55) == pytest.approx(0.5) and f(100) == pytest.approx(0.0, abs=1e-12)
    g = _lr_lambda(100, 0)
    assert g(0) == pytest.approx(1.0) and g(50) == pytest.approx(0.5)


def test_steps_to_interpolates_between_evaluations():
    val = [(0, 5.0), (10, 4.0), (20, 3.0)]
    assert _steps_to(val, 3.5) == pytest.approx(15.0)
    assert _steps_to(val, 5.0) == 0.0
    assert _steps_to(val, 2.0) is None


def test_helpers_curves_and_json():
    c = downsample(list(range(10_000)), 50)
    assert c["step"][0] == 0 and c["step"][-1] == 9999 and len(c["step"]) <= 52
    assert c["step"] == sorted(set(c["step"]))
    assert downsample([1.0, 2.0], None) == {"step": [0, 1], "value": [1.0, 2.0]}
    assert first_below([3, 2, 1], 0.5) is None
    assert sanitize({"x": float("nan"), "y": [float("inf"), 1]}) == {"x": None, "y": [None, 1]}
