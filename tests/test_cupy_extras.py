"""The CuPy extras: one per CUDA major, and every ``amopt[...]`` the README and the docs'
install page name exists."""

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


def _named_extras(path: Path) -> set[str]:
    named = set(re.findall(r"amopt\[([a-z0-9_,-]+)\]", path.read_text()))
    return {n for group in named for n in group.split(",")}


def test_every_extra_named_in_the_readme_is_defined():
    names = _named_extras(ROOT / "README.md")
    assert {"cupy12", "cupy13"} <= names
    assert names <= set(_extras()), names - set(_extras())


def test_the_install_page_names_every_extra_and_only_defined_ones():
    names = _named_extras(ROOT / "docs" / "getting-started.md")
    assert names == set(_extras()) - {"dev"}, names ^ (set(_extras()) - {"dev"})
