"""The installed package works on its own: no checkout, no ``../shared/data``, no git.

A wheel is built from a copy of the sources, installed (without dependencies)
into a fresh virtual environment that then sees the packages of the environment
running the tests (numpy, scipy, torch, ...: the system's or a virtual
environment's), and the three commands of the README are run from an empty folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import array_api_compat
import pytest

import amopt
from amopt.__main__ import main as demo_main

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 180


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _suite_site_dirs() -> list[str]:
    """The site-packages folders of the interpreter running the tests, in import order.

    A venv made with ``--system-site-packages`` sees the *base* interpreter's
    packages, not those of a virtual environment the tests may run in; the
    installed venv is given these folders instead (after its own).
    """
    dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and user in sys.path and user not in dirs:
        dirs.append(user)
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """A wheel of the sources installed into a fresh venv; its python, a work folder, an env."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "amopt", src / "amopt", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["AMOPT_DATA_DIR"] = str(tmp / "data")  # an empty data folder: only bundled data
    env.pop("AMOPT_A9A", None)
    wheels = tmp / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(src)],
        tmp,
        env,
    )  # fmt: skip
    (wheel,) = wheels.glob("amopt-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp, env)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
         tmp, env)  # fmt: skip
    # only now the suite's packages (after the install: pip would otherwise see the
    # suite's own amopt, e.g. an editable install, as already installed); a .pth line
    # is a folder appended to sys.path, its own .pth files (an editable finder) unread
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                   tmp, env).stdout.strip()  # fmt: skip
    (Path(purelib) / "_amopt_test_suite_env.pth").write_text("\n".join(_suite_site_dirs()) + "\n")
    work = tmp / "work"
    work.mkdir()
    return {"python": str(python), "venv": venv, "wheel": wheel, "work": work, "env": env}


@pytest.mark.slow
def test_installed_venv_sees_the_suite_packages(installed):
    """The dependencies come from the environment running the tests, amopt from the wheel."""
    import numpy
    import scipy

    mods = {"numpy": numpy, "scipy": scipy, "array_api_compat": array_api_compat}
    code = "import importlib, sys; print(importlib.import_module(sys.argv[1]).__file__)"
    for name, mod in mods.items():
        out = _run([installed["python"], "-c", code, name], installed["work"], installed["env"])
        assert Path(out.stdout.strip()) == Path(mod.__file__), name
    out = _run([installed["python"], "-c", code, "amopt"], installed["work"], installed["env"])
    assert Path(out.stdout.strip()).is_relative_to(installed["venv"])


@pytest.mark.slow
def test_wheel_carries_the_bundled_data(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for f in ("mushrooms.bz2", "a1a.bz2"):
        assert f"amopt/datasets/data/{f}" in names
    assert "amopt/datasets/registry.csv" in names  # the registry of the data sets
    assert "amopt/experiments/__main__.py" in names and "amopt/bench/_timing.py" in names
    assert not any(n.startswith(("tests/", "docs/", "benchmarks/")) for n in names)


@pytest.mark.slow
def test_wheel_is_pure_and_carries_the_kernel_sources(installed):
    """A package index takes the wheel: pure Python, no compiled file, the C sources in it."""
    wheel = installed["wheel"]
    assert wheel.name == f"amopt-{amopt.__version__}-py3-none-any.whl", wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dylib", ".dll"))]
    assert {f"amopt/torch/csrc/{f}" for f in _fused_sources()} <= names
    wheel_info = zipfile.ZipFile(wheel).read(f"amopt-{amopt.__version__}.dist-info/WHEEL")
    assert b"Root-Is-Purelib: true" in wheel_info
    assert "amopt/py.typed" in names
    meta = zipfile.ZipFile(wheel).read(f"amopt-{amopt.__version__}.dist-info/METADATA").decode()
    assert "License-Expression: BSD-3-Clause" in meta
    assert "Classifier: Typing :: Typed" in meta
    assert f"amopt-{amopt.__version__}.dist-info/licenses/LICENSE" in names


def _fused_sources() -> tuple[str, ...]:
    torch_dir = ROOT / "amopt" / "torch" / "csrc"
    return tuple(sorted(p.name for p in torch_dir.iterdir() if p.suffix in (".c", ".h")))


@pytest.mark.slow
def test_installed_wheel_compiles_the_fused_kernels_at_first_use(installed, tmp_path):
    """The installed package builds its kernels from the shipped sources into the cache."""
    pytest.importorskip("torch")
    if not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler: the kernels cannot be built here")
    env = dict(installed["env"], AMOPT_KERNEL_CACHE=str(tmp_path / "kernels"))
    code = (
        "import json; from amopt.torch._fused import fused_status as s; "
        "print(json.dumps({k: s()[k] for k in ('available', 'origin', 'path')}))"
    )
    out = _run([installed["python"], "-c", code], installed["work"], env)
    status = json.loads(out.stdout.strip().splitlines()[-1])
    assert status["available"] and status["origin"] == "cache", status
    assert Path(status["path"]).parent == tmp_path / "kernels", status
    # the second process finds the cached library (origin "cache" again, no new build)
    built = sorted((tmp_path / "kernels").iterdir())
    again = json.loads(_run([installed["python"], "-c", code], installed["work"], env)
                       .stdout.strip().splitlines()[-1])  # fmt: skip
    assert again == status and sorted((tmp_path / "kernels").iterdir()) == built


@pytest.mark.slow
def test_installed_demo_matches_the_sources(installed, capsys):
    py, work, env = installed["python"], installed["work"], installed["env"]
    where = _run([py, "-c", "import amopt; print(amopt.__file__)"], work, env).stdout.strip()
    assert Path(where).is_relative_to(installed["venv"]), where  # the wheel, not the checkout
    out = _run([py, "-m", "amopt", "--maxiter", "20"], work, env).stdout
    assert "logistic regression on mushrooms: n=8124, d=112" in out
    assert demo_main(["--maxiter", "20"]) == 0
    here = capsys.readouterr().out

    def values(text: str) -> dict[str, str]:  # method -> f(x_T) of the ranked rows
        rows = (re.match(r"\s*\d+\s+(.*?)\s+(\d+\.\d+)\s", line) for line in text.splitlines())
        return {m[1]: m[2] for m in rows if m}

    assert values(out) == values(here) and len(values(out)) == 7  # the demo's seven methods


@pytest.mark.slow
def test_installed_bench_quick(installed):
    py, work, env = installed["python"], installed["work"], installed["env"]
    selected = ["core-numpy", "minimize-a9a", "amsgd", "adamw-default"]
    cmd = [py, "-m", "amopt.bench", "--quick", "--repeat", "3", "--rows", *selected]
    out = _run(cmd, work, env).stdout
    assert f"Machine: amopt: {amopt.__version__}; " in out and "QUICK sizes" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "metric" not in line]
    assert len(rows) == len(selected)
    core = next(r for r in rows if "NumPy core" in r)
    assert float(core.split("|")[4].split()[0]) > 0  # the measured ratio
    a9a = Path(env["AMOPT_DATA_DIR"]) / "libsvm" / "a9a"
    assert f"skipped: a9a not found at {a9a}" in out and "--data-dir" in out


@pytest.mark.slow
def test_installed_experiment_quick(installed):
    py, work, env = installed["python"], installed["work"], installed["env"]
    proc = _run([py, "-m", "amopt.experiments", "quadratic", "--quick", "--out", "res"], work, env)
    assert "quadratic: done" in proc.stderr
    res = json.loads((work / "res" / "quadratic" / "results.json").read_text())
    env_rec = res["environment"]
    assert env_rec["amopt"] == amopt.__version__ and env_rec["cpu"]
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", env_rec["python"]) and "numpy" in env_rec
    assert not any(k.startswith("git") for k in env_rec)
    assert res["quick"] is True and res["summary"]["problems"]
    assert (work / "res" / "quadratic" / "quadratic.png").stat().st_size > 10_000
