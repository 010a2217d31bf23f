"""The README's code blocks run as written (in order, in one namespace) and do what they say."""

import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    pytest.importorskip("torch")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 4
    ns: dict = {}
    exec(compile(blocks[0], "README quick start", "exec"), ns)
    assert ns["res"].success
    np.testing.assert_allclose(ns["A"] @ ns["res"].x, ns["b"], atol=1e-6)
    exec(compile(blocks[1], "README building blocks", "exec"), ns)
    np.testing.assert_allclose(ns["x"], [-0.375, -0.125])  # worked by hand in _core's doctest
    exec(compile(blocks[2], "README problems", "exec"), ns)
    assert ns["res"].nit == 1000 and 0 < ns["res"].fun - ns["prob"].f_star < 0.02
    exec(compile(blocks[3], "README torch", "exec"), ns)
    assert len(ns["betas"]) == 1 and len(ns["betas"][0]) == 2  # one group, two tensors


def test_readme_test_command_is_what_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    line = 'pip install "torch==2.13.0" -e ".[test]" && python -m pytest'
    assert line in README.read_text() and line in ci
