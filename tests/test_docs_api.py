"""Every public name of amopt has a page in the API reference.

Reads the autosummary sources of ``docs/api/`` (no Sphinx build): each name in the
``__all__`` of ``amopt``, ``amopt.torch``, ``amopt.problems`` and ``amopt.datasets`` must be
listed under an ``autosummary`` directive with a ``:toctree:`` (which makes its page) of
that module's page, and nothing may be listed there that the module does not export.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[1] / "docs" / "api"
MODULES = ("amopt", "amopt.torch", "amopt.problems", "amopt.datasets")


def _autosummary_entries(text: str) -> set[str]:
    """Names listed under ``.. autosummary::`` blocks that have a ``:toctree:`` option."""
    names: set[str] = set()
    for block in re.split(r"^\.\. ", text, flags=re.M)[1:]:
        head, _, body = block.partition("\n")
        if head.strip() != "autosummary::":
            continue
        lines = body.splitlines()
        options = [ln.strip() for ln in lines if ln.strip().startswith(":")]
        if not any(o.startswith(":toctree:") for o in options):
            continue
        for ln in lines:
            if not ln.strip():
                continue
            if not ln.startswith((" ", "\t")):
                break  # the end of the directive's indented body
            if not ln.strip().startswith(":"):
                names.add(ln.strip().lstrip("~"))
    return names


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_has_an_api_page(module):
    if module == "amopt.torch":
        pytest.importorskip("torch")
    mod = importlib.import_module(module)
    page = API / f"{module}.rst"
    assert page.is_file(), f"no API page {page} for {module}"
    text = page.read_text()
    assert f".. currentmodule:: {module}" in text
    listed = _autosummary_entries(text)
    public = set(mod.__all__)
    assert public - listed == set(), f"public names of {module} without an API page"
    assert listed - public == set(), f"names on the {module} page that it does not export"


def test_every_module_page_is_in_the_api_index():
    index = (API / "index.rst").read_text()
    for module in MODULES:
        assert re.search(rf"^\s+{re.escape(module)}$", index, re.M), module


def test_the_parser_sees_what_a_toctree_autosummary_lists():
    text = (
        ".. autosummary::\n   :toctree: generated/\n\n   a\n   ~b\n\nafter\n"
        ".. autosummary::\n\n   not_a_page\n"
    )
    assert _autosummary_entries(text) == {"a", "b"}
