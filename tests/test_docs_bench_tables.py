"""The docs' performance tables are the bench JSON under ``docs/_data``, rendered.

A small Sphinx project renders each stored JSON with the ``bench-table`` and
``bench-problem-set`` directives of ``docs/_ext/bench_table.py``; the HTML tables are
read back and compared, cell by cell, with the JSON parsed here: every row in the JSON's
order, its key, metric and side labels, each printed number within the rounding of the
digits it shows, the target, and a status that agrees with ratio <= target. Every JSON
under ``docs/_data`` must name the machine, the software, the date and the settings it
was measured with.
"""

from __future__ import annotations

import io
import json
import math
import re
import shutil
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
DATA = DOCS / "_data"
JSONS = sorted(DATA.glob("*.json"))


class _Tables(HTMLParser):
    """The text of every cell of the tables of class ``bench-table``, and the paragraphs
    of class ``bench-setup``."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.setups: list[str] = []
        self._depth = 0  # inside a bench table
        self._cell: list[str] | None = None
        self._setup: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if tag == "table" and "bench-table" in classes:
            self.tables.append([])
            self._depth = 1
        elif tag == "table" and self._depth:
            self._depth += 1
        elif tag == "tr" and self._depth:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self._depth:
            self._cell = []
        elif tag == "p" and "bench-setup" in classes:
            self._setup = []

    def handle_endtag(self, tag):
        if tag == "table" and self._depth:
            self._depth -= 1
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "p" and self._setup is not None:
            self.setups.append(" ".join("".join(self._setup).split()))
            self._setup = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._setup is not None:
            self._setup.append(data)


def _build(src: Path, out: Path) -> str:
    """Build the Sphinx project in ``src`` into ``out``; its warnings."""
    testing = pytest.importorskip("sphinx.testing.util")
    warnings = io.StringIO()
    # SphinxTestApp undoes what a build registers in docutils, so builds can follow
    app = testing.SphinxTestApp(
        "html", srcdir=src, builddir=out, freshenv=True, status=io.StringIO(), warning=warnings
    )
    try:
        app.build()
    finally:
        app.cleanup()
    return warnings.getvalue()


def _project(tmp_path: Path, body: str, files: list[Path]) -> Path:
    """A one-page Sphinx project whose page is ``body`` (reST), with ``files`` beside it."""
    src = tmp_path / "src"
    src.mkdir()
    for f in files:
        shutil.copy(f, src / f.name)
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(DOCS / '_ext')!r})\nextensions = ['bench_table']\n"
    )
    (src / "index.rst").write_text("Bench\n=====\n\n" + body)
    return src


def _render(tmp_path: Path, body: str, files: list[Path]) -> _Tables:
    """The tables of a one-page site whose page is ``body``, built with no warning."""
    src = _project(tmp_path, body, files)
    assert _build(src, tmp_path / "build") == ""
    parser = _Tables()
    parser.feed((tmp_path / "build" / "html" / "index.html").read_text(encoding="utf-8"))
    return parser


def _close(printed: str, value: float) -> bool:
    """``printed`` is ``value`` rounded to the digits it shows."""
    if printed in ("inf", "nan"):
        return str(value) == printed
    if "e" in printed:
        mantissa, exp = printed.split("e")
        digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
        half = 0.5 * 10.0 ** (int(exp) - digits)
    else:
        decimals = len(printed.split(".")[1]) if "." in printed else 0
        half = 0.5 * 10**-decimals
    return abs(float(printed) - value) <= half * (1 + 1e-9)


def _check_side(cell: str, label: str, value: float, unit: str) -> None:
    assert cell.startswith(f"{label}: ") and cell.endswith(f" {unit}"), (cell, label, unit)
    printed = cell[len(label) + 2 : len(cell) - len(unit) - 1]
    assert _close(printed, value), (cell, value)


def _check_row(cells: list[str], row: dict) -> None:
    assert cells[0] == row["key"] and cells[1] == " ".join(row["metric"].split())
    target = row["target"]
    assert cells[5] == ("-" if target is None else f"<= {target:g}")
    m = row["measured"]
    if m is None:
        assert cells[2:5] == ["-", "-", "-"] and cells[6].startswith(row["status"])
        return
    _check_side(cells[2], row["side_a"], m["a"], m["unit"])
    _check_side(cells[3], row["side_b"], m["b"], m["unit"])
    found = re.fullmatch(r"(\S+)(?: \(IQR (\S+)-(\S+)\))?", cells[4])
    assert found, cells[4]
    assert _close(found.group(1), m["ratio"])
    if m["spread"] is not None:
        assert _close(found.group(2), m["spread"][0]) and _close(found.group(3), m["spread"][1])
    else:
        assert found.group(2) is None
    # the status is the one in the JSON, and it is what ratio <= target says
    assert cells[6] == row["status"]
    expected = "info" if target is None else ("met" if m["ratio"] <= target else "MISSED")
    assert row["status"] == expected


def _bench_jsons() -> list[Path]:
    return [p for p in JSONS if json.loads(p.read_text())["rows"]]


@pytest.mark.parametrize("path", JSONS, ids=[p.name for p in JSONS])
def test_every_stored_json_names_its_machine_and_setup(path):
    payload = json.loads(path.read_text())
    machine = payload["machine"]
    for key in ("cpu", "cpu family/model", "vector ISA", "logical cores", "memory", "python",
                "numpy", "scipy", "torch", "amopt"):  # fmt: skip
        assert machine.get(key) and machine[key] != "unknown", (path.name, key)
    datetime.strptime(payload["date"], "%Y-%m-%dT%H:%M:%SZ")
    assert payload["command"].startswith("python -m amopt.bench")
    assert payload["settings"]["repeat"] >= 1 and "threads" in payload["settings"]
    assert payload["complete"] is True
    assert payload["rows"], path.name
    for row in payload["rows"]:
        assert row["status"] in ("met", "MISSED", "info", "skipped", "error")


def _with_odd_rows(path: Path, out: Path) -> Path:
    """A copy of ``path`` whose first rows are skipped, failed and without a spread."""
    payload = json.loads(path.read_text())
    rows = payload["rows"]
    rows[0].update(status="skipped", skipped="no GPU", measured=None)
    rows[1].update(status="error", error="RuntimeError: boom (x.py:1)", measured=None)
    rows[2]["measured"]["spread"] = None
    out.write_text(json.dumps(payload))
    return out


def test_the_bench_table_is_the_json(tmp_path):
    files = _bench_jsons()
    if not files:
        pytest.skip("no bench JSON under docs/_data")
    files.append(_with_odd_rows(files[0], tmp_path / "odd.json"))
    body = "".join(f".. bench-table:: {p.name}\n\n" for p in files)
    parsed = _render(tmp_path, body, files)
    assert len(parsed.tables) == len(files) == len(parsed.setups)
    for path, table, setup in zip(files, parsed.tables, parsed.setups, strict=True):
        payload = json.loads(path.read_text())
        header, *body_rows = table
        assert header == ["row", "metric", "AM side", "baseline", "ratio", "target", "met"]
        assert [c[0] for c in body_rows] == [r["key"] for r in payload["rows"]]
        for cells, row in zip(body_rows, payload["rows"], strict=True):
            _check_row(cells, row)
        m = payload["machine"]
        for text in (m["cpu"], m["cpu family/model"], m["vector ISA"], m["python"], m["numpy"],
                     m["torch"], payload["date"], payload["command"]):  # fmt: skip
            assert text in setup, (text, setup)
        assert f"{payload['settings']['repeat']} interleaved pairs" in setup


def test_the_rows_option_selects_by_pattern(tmp_path):
    files = _bench_jsons()
    if not files:
        pytest.skip("no bench JSON under docs/_data")
    payload = json.loads(files[0].read_text())
    keys = [r["key"] for r in payload["rows"]]
    first = keys[0].split("-")[0]  # a pattern that matches some rows
    body = (
        f".. bench-table:: {files[0].name}\n"
        f"   :rows: {first}-* {keys[-1]}\n   :exclude: {keys[0]}\n"
    )
    parsed = _render(tmp_path, body, files[:1])
    shown = [c[0] for c in parsed.tables[0][1:]]
    expected = [k for k in keys if (k.startswith(f"{first}-") or k == keys[-1]) and k != keys[0]]
    assert shown == expected and shown


def test_the_problem_set_table_is_the_json(tmp_path):
    files = [p for p in JSONS if "problem_set" in json.loads(p.read_text())]
    if not files:
        pytest.skip("no problem-set JSON under docs/_data")
    body = "".join(f".. bench-problem-set:: {p.name}\n\n" for p in files)
    parsed = _render(tmp_path, body, files)
    assert len(parsed.tables) == len(files) == len(parsed.setups)
    for path, table, setup in zip(files, parsed.tables, parsed.setups, strict=True):
        payload = json.loads(path.read_text())
        for text in (payload["machine"]["cpu"], payload["machine"]["numpy"], payload["date"]):
            assert text in setup, (text, setup)
        ps = payload["problem_set"]
        header, *body_rows = table
        assert header == ["problem", *ps["methods"]]
        assert [c[0] for c in body_rows] == [p["label"] for p in ps["problems"]]
        for cells, prob in zip(body_rows, ps["problems"], strict=True):
            finite = [o["fun"] for o in prob["methods"].values() if math.isfinite(o["fun"])]
            f_best = min(finite)
            for cell, method in zip(cells[1:], ps["methods"], strict=True):
                o = prob["methods"][method]
                if o["nit"] is not None:
                    assert re.fullmatch(rf"{o['nit']} \((\S+) s\)", cell), cell
                    assert _close(cell.split("(")[1].split()[0], o["seconds"])
                    assert o["nit"] <= ps["maxiter"]
                    continue
                found = re.fullmatch(rf">{ps['maxiter']} \(gap (\S+), (\S+) s\)", cell)
                assert found, cell
                assert _close(found.group(1), o["fun"] - f_best)
                assert _close(found.group(2), o["seconds"])
                # not reached: its gradient is above the test
                assert o["g_rel"] > ps["rtol"]


def test_rows_of_a_pattern_that_matches_nothing_fail_the_build(tmp_path):
    files = _bench_jsons()
    if not files:
        pytest.skip("no bench JSON under docs/_data")
    body = f".. bench-table:: {files[0].name}\n   :rows: no-such-row\n"
    src = _project(tmp_path, body, files[:1])
    assert "no row of" in _build(src, tmp_path / "build")


def test_the_performance_page_shows_every_row_of_its_json():
    """No measured row is left out of docs/performance.md's tables, none is shown twice."""
    import fnmatch

    page = (DOCS / "performance.md").read_text()
    blocks = re.findall(r"```\{bench-table\} (\S+)\n((?::[^\n]*\n)*)```", page)
    assert blocks
    shown: dict[str, list[str]] = {}
    for name, options in blocks:
        rows = json.loads((DOCS / name).read_text())["rows"]
        pats = re.search(r"^:rows: (.*)$", options, flags=re.M)
        for row in rows:
            if pats is None or any(
                fnmatch.fnmatchcase(row["key"], p) for p in pats.group(1).split()
            ):
                shown.setdefault(name, []).append(row["key"])
    for name in {n for n, _ in blocks}:
        keys = [r["key"] for r in json.loads((DOCS / name).read_text())["rows"]]
        assert sorted(shown[name]) == sorted(keys), name
