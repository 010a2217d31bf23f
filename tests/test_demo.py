"""The README's first command: ``python -m amopt`` on bundled data, ranked honestly."""

import subprocess
import sys

import numpy as np
import pytest
import scipy.optimize

from amopt.__main__ import main
from amopt.problems import LogisticRegression

LABELS = {
    "GD",
    "MGD, damped (beta=0.9)",
    "heavy ball (beta=0.9)",
    "Nesterov (beta=0.9)",
    "L-BFGS-B (scipy)",
    "AM-MGD, linear numerator",
    "AM-MGD, exact numerator",
}


def _table(out):
    lines = out.splitlines()
    assert lines[0].startswith("computing f* of logistic regression on mushrooms")
    assert "mu = 0 (not strongly convex)" in lines[1]
    rows = {}
    for line in lines[3:]:
        rank, rest = int(line[:4]), line[6:]
        rows[rest[:34].strip()] = (rank, *rest[34:].split())
    return rows


def test_demo_ranks_every_method_by_the_values_it_reached(capsys):
    T = 20
    assert main(["--maxiter", str(T)]) == 0
    rows = _table(capsys.readouterr().out)
    assert set(rows) == LABELS
    ranked = sorted(rows.values())
    assert [r[0] for r in ranked] == list(range(1, len(LABELS) + 1))
    assert [float(r[1]) for r in ranked] == sorted(float(r[1]) for r in ranked)
    # GD and the classical heavy ball recomputed here, from their definitions
    prob = LogisticRegression.from_libsvm("mushrooms")
    lr = 1.0 / prob.L
    x = np.zeros(prob.dim)
    for _ in range(T):
        x = x - lr * prob.grad(x)
    assert float(rows["GD"][1]) == pytest.approx(float(prob.fun(x)), abs=1e-10)
    x = x_prev = np.zeros(prob.dim)
    for _ in range(T):
        x, x_prev = x - lr * prob.grad(x) + 0.9 * (x - x_prev), x
    assert float(rows["heavy ball (beta=0.9)"][1]) == pytest.approx(float(prob.fun(x)), abs=1e-10)
    ref = scipy.optimize.minimize(
        prob.value_and_grad,
        np.zeros(prob.dim),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": T, "gtol": 0.0},
    )
    assert float(rows["L-BFGS-B (scipy)"][1]) == pytest.approx(ref.fun, abs=1e-10)
    # the classical heavy ball is ahead of the damped MGD it is often confused with
    assert rows["heavy ball (beta=0.9)"][0] < rows["MGD, damped (beta=0.9)"][0]


def test_help_says_what_is_compared(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name in (
        "GD",
        "damped momentum (MGD)",
        "classical heavy ball",
        "Nesterov",
        "L-BFGS-B",
        "AM-MGD",
        "textbook tuning",
    ):
        assert name in out


def test_module_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "amopt", "--dataset", "a1a", "--maxiter", "3"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "logistic regression on a1a: n=1605" in proc.stdout
