"""The README's first command: ``python -m amopt`` on bundled data."""

import subprocess
import sys

import numpy as np

from amopt.__main__ import main
from amopt.problems import LogisticRegression


def test_demo_prints_every_method_and_real_values(capsys):
    assert main(["--maxiter", "20"]) == 0
    out = capsys.readouterr().out
    lines = {line[:32].strip(): line[32:].split() for line in out.splitlines()[2:]}
    assert set(lines) == {
        "GD",
        "MGD (beta=0.9)",
        "AM-MGD (exact numerator)",
        "AM-MGD (linearised numerator)",
    }
    # the printed GD value is the value of 20 gradient steps, recomputed here
    prob = LogisticRegression.from_libsvm("mushrooms")
    x = np.zeros(prob.dim)
    for _ in range(20):
        x = x - prob.grad(x) / prob.L
    assert float(lines["GD"][0]) == float(f"{float(prob.fun(x)):.10f}")
    assert lines["GD"][2] == "-" and 0 <= float(lines["AM-MGD (exact numerator)"][2]) <= 1


def test_module_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "amopt", "--dataset", "a1a", "--maxiter", "3"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "logistic regression on a1a: n=1605" in proc.stdout
