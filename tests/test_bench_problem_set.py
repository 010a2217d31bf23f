"""The problem set of ``python -m amopt.bench --problem-set``."""

import numpy as np
import pytest

from amopt.bench import _cli, _problem_set
from amopt.bench._records import Settings


def _case(key):
    return next(c for c in _problem_set.PROBLEMS if c.key == key)


def test_problem_set_rows_are_listed(capsys):
    assert _cli.main(["--problem-set", "--list"]) == 0
    out = capsys.readouterr().out
    for key in (
        "quad-cond10",
        "quad-cond1e3",
        "quad-cond1e5",
        "ls-well",
        "ls-ill",
        "logreg-mushrooms",
        "logreg-a1a",
        "rosenbrock",
        "nonconvex-logreg",
    ):
        assert f"problem-set-{key}" in out
    assert not any(r in _cli.ROWS for r in _cli.PROBLEM_SET_ROWS)  # not run by default


def test_gd_iterations_are_those_of_a_gradient_loop():
    case = _case("ls-well")
    got = _problem_set.measure_problem(case)
    prob, x0 = case.make()
    gtol = _problem_set.RTOL * np.max(np.abs(prob.grad(x0)))
    x, nit = x0.copy(), 0
    while np.max(np.abs(prob.grad(x))) > gtol:
        x = x - prob.grad(x) / prob.L
        nit += 1
    assert got["GD"].nit == nit
    # the row: minimize's default against GD, with the target 1 on a convex problem
    row = next(r for r in _problem_set.ROWS if r.key == "problem-set-ls-well")
    m = row.measure(Settings())
    assert row.target == 1.0 and m.b == nit and m.a == got["default"].nit
    assert m.ratio <= 1.0
    for label in _problem_set.METHODS:
        assert label in m.note


@pytest.mark.parametrize(("method", "kappa"), [("heavy-ball", 100.0), ("nesterov", 100.0)])
def test_textbook_tuning(method, kappa):
    L, mu = 2.0, 2.0 / kappa
    t = _problem_set.textbook(method, L, mu)
    rho = (np.sqrt(kappa) - 1) / (np.sqrt(kappa) + 1)
    if method == "heavy-ball":
        assert t["lr"] == pytest.approx(4 / (np.sqrt(L) + np.sqrt(mu)) ** 2)
        assert t["beta"] == pytest.approx(rho**2)
    else:
        assert t["lr"] == pytest.approx(1 / L) and t["beta"] == pytest.approx(rho)
    assert _problem_set.textbook(method, L, 0.0) == {"lr": 1 / L, "beta": 0.9}
