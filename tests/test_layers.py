"""The package's layers, as ``[tool.importlinter]`` in pyproject.toml states them.

Each layer imports only those below it (experiments, bench, problems, the two surfaces
``amopt.torch`` and ``amopt.optimize``, backends, then core and datasets), ``amopt.core``
imports no concrete array library (NumPy only for the tape's host table), and the torch
optimizers and the ``minimize`` driver do not import each other. import-linter reads the
imports of every module, inside functions too; a broken contract fails here with its
report (the chain of imports that breaks it).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]

_RUN = """
from importlinter.cli import lint_imports
raise SystemExit(lint_imports(config_filename="pyproject.toml", no_cache=True, no_logo=True))
"""


def _lint(root: Path) -> tuple[int, str]:
    """import-linter's exit status and report on the package under ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", _RUN],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


def test_the_layers_hold():
    returncode, report = _lint(ROOT)
    assert returncode == 0, report
    assert "3 kept, 0 broken" in report, report


def test_a_library_import_in_core_breaks_the_contract(tmp_path):
    """The contract bites: the same configuration over a copy of the package whose core
    imports torch is broken, and the report names the import."""
    import shutil

    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "amopt", tmp_path / "amopt", ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    rule = tmp_path / "amopt" / "core" / "rule.py"
    rule.write_text(rule.read_text() + "\n\ndef _torch():\n    import torch\n\n    return torch\n")
    returncode, report = _lint(tmp_path)
    assert returncode != 0, report
    assert "amopt.core.rule -> torch" in report, report
