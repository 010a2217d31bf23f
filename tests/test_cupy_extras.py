"""The CuPy extras: one per CUDA major, and every ``amopt[...]`` the README names exists."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _extras() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]["optional-dependencies"]


def test_one_cupy_extra_per_cuda_major():
    extras = _extras()
    assert extras["cupy12"] == ["cupy-cuda12x"]
    assert extras["cupy13"] == ["cupy-cuda13x"]
    assert extras["cupy"] == extras["cupy12"]  # the name installs what it always did


def test_every_extra_named_in_the_readme_is_defined():
    named = set(re.findall(r"amopt\[([a-z0-9_,-]+)\]", (ROOT / "README.md").read_text()))
    names = {n for group in named for n in group.split(",")}
    assert {"cupy12", "cupy13"} <= names
    assert names <= set(_extras()), names - set(_extras())
