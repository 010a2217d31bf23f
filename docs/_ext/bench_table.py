"""Tables of the docs rendered from the JSON that ``python -m amopt.bench --json`` writes.

Two directives, each given a JSON file (relative to the page, or to ``docs/`` with a
leading ``/``), each writing the machine and setup of the run above its table:

``bench-table``
    The bench's rows: row (key), metric, AM side, baseline, ratio, target, met.
    Options: ``:rows:`` keys or shell patterns (``adamw-*``) of the rows to show, in the
    JSON's order (default: every row); ``:exclude:`` patterns of rows to leave out;
    ``:notes:`` (a flag) also lists the rows' notes under the table; ``:no-setup:`` (a
    flag) leaves out the setup line, for a table of a file whose setup the page showed
    above.

``bench-problem-set``
    The table of ``python -m amopt.bench --problem-set``: per problem, each method's
    iterations to the stopping test and the wall time of its run, or, where the test was not
    reached, its suboptimality ``f - f_best`` at the iteration limit.

Written with MyST as::

    ```{bench-table} _data/bench-cpu.json
    :rows: adamw-* amsgd
    ```

A page is rebuilt when its JSON changes. Nothing here is typed by hand: a table is what
the JSON holds, formatted.
"""

from __future__ import annotations

import fnmatch
import json
import math
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

#: the columns of ``bench-table``
COLUMNS = ("row", "metric", "AM side", "baseline", "ratio", "target", "met")

#: what every stored bench JSON has to say about where and how it was measured
MACHINE_KEYS = ("cpu", "vector ISA", "logical cores", "python", "numpy", "amopt")


def load(path: str | Path) -> dict[str, Any]:
    """The payload of a bench JSON file."""
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def number(value: float | None) -> str:
    """A measured value with three significant digits (as the bench's own report)."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) < 0.01:
        return f"{value:.2e}"
    return f"{value:.2f}"


def setup_line(payload: dict[str, Any], *, paired: bool = True) -> str:
    """One sentence: machine, software versions, date, command and the bench's settings
    (``paired`` False: the problem set, one run per method, no pairs)."""
    m = payload.get("machine", {})
    s = payload.get("settings", {})
    cpu = m.get("cpu", "unknown CPU")
    if m.get("cpu family/model"):
        cpu += f" (family/model {m['cpu family/model']})"
    parts = [
        f"{cpu}, {m.get('vector ISA', 'ISA unknown')}, {m.get('logical cores', '?')} logical "
        f"cores, {m.get('memory', 'memory unknown')}",
        ", ".join(
            f"{name} {m[key]}"
            for name, key in (
                ("Python", "python"),
                ("NumPy", "numpy"),
                ("SciPy", "scipy"),
                ("torch", "torch"),
                ("amopt", "amopt"),
            )
            if key in m
        ),
        f"GPU: {m.get('gpu', 'not recorded')}",
    ]
    threads = s.get("threads")
    if paired:
        setting = f"{s.get('repeat', '?')} interleaved pairs per row"
        if s.get("row_seconds"):
            setting += f" (at most about {s['row_seconds']:g} s of pairs per row)"
        setting += f", torch threads {threads if threads else 'default'}"
    else:
        setting = "one run of each method on each problem, one process, float64 NumPy arrays"
    if s.get("quick"):
        setting += ", QUICK sizes (not the targets' sizes)"
    parts.append(setting)
    load_b, load_a = payload.get("load_before"), payload.get("load_after")
    if load_b and load_a:
        parts.append(f"load average (1 min) {load_b[0]:.2f} before, {load_a[0]:.2f} after")
    bw_b = payload.get("memory_bandwidth_gbs_before")
    bw_a = payload.get("memory_bandwidth_gbs_after")
    if bw_b and bw_a:
        parts.append(f"one torch copy {bw_b:.1f} GB/s before, {bw_a:.1f} GB/s after")
    line = "; ".join(parts)
    date = payload.get("date") or "date not recorded"
    command = payload.get("command") or "python -m amopt.bench"
    head = f"Measured {date} with {command}: "
    if not payload.get("complete", True):
        line += " (the run was cut short: the rows it measured)"
    return head + line + "."


def select(rows: list[dict], patterns: list[str] | None, exclude: list[str] | None) -> list[dict]:
    """The rows whose key matches a pattern of ``patterns`` (all without) and none of
    ``exclude``, in the JSON's order."""

    def hit(key: str, pats: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(key, p) for p in pats)

    return [
        r
        for r in rows
        if (not patterns or hit(r["key"], patterns)) and not (exclude and hit(r["key"], exclude))
    ]


def row_cells(row: dict[str, Any]) -> list[str]:
    """The cells of one bench row, in :data:`COLUMNS` order."""
    target = "-" if row.get("target") is None else f"<= {row['target']:g}"
    m = row.get("measured")
    if m is None:
        why = row.get("error") or row.get("skipped") or ""
        return [row["key"], row["metric"], "-", "-", "-", target, f"{row['status']}: {why}"]
    side_a = row.get("side_a") or "AM side"
    side_b = row.get("side_b") or "baseline"
    ratio = f"{m['ratio']:.3f}"
    if m.get("spread"):
        ratio += f" (IQR {m['spread'][0]:.3f}-{m['spread'][1]:.3f})"
    return [
        row["key"],
        row["metric"],
        f"{side_a}: {number(m['a'])} {m['unit']}",
        f"{side_b}: {number(m['b'])} {m['unit']}",
        ratio,
        target,
        row["status"],
    ]


def problem_set_header(payload: dict[str, Any]) -> list[str]:
    """The columns of ``bench-problem-set``: the problem, then one per method."""
    return ["problem", *payload["problem_set"]["methods"]]


def problem_set_cells(payload: dict[str, Any]) -> list[list[str]]:
    """One row per problem: each method's iterations and time, or its gap at the limit."""
    ps = payload["problem_set"]
    out = []
    for prob in ps["problems"]:
        cells = [prob["label"]]
        for method in ps["methods"]:
            o = prob["methods"][method]
            if o["nit"] is not None:
                cells.append(f"{o['nit']} ({o['seconds']:.2f} s)")
                continue
            gap = o["fun"] - prob["f_best"] if math.isfinite(o["fun"]) else math.inf
            what = f"gap {gap:.1e}" if math.isfinite(gap) else "diverged"
            cells.append(f">{ps['maxiter']} ({what}, {o['seconds']:.1f} s)")
        out.append(cells)
    return out


def _table(header: list[str], body: list[list[str]], classes: list[str]) -> nodes.table:
    # the cells hold code-like text (minimize(method='am-mgd')): no typographic quotes
    table = nodes.table(classes=["bench-table", *classes], support_smartquotes=False)
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)

    def line(cells: list[str]) -> nodes.row:
        row = nodes.row()
        for text in cells:
            entry = nodes.entry()
            entry += nodes.paragraph(text=text)
            row += entry
        return row

    thead = nodes.thead()
    thead += line(header)
    tbody = nodes.tbody()
    for cells in body:
        tbody += line(cells)
    group += thead
    group += tbody
    return table


def _patterns(argument: str) -> list[str]:
    return argument.replace(",", " ").split()


class _BenchDirective(SphinxDirective):
    required_arguments = 1
    has_content = False

    def _payload(self) -> dict[str, Any]:
        rel, path = self.env.relfn2path(self.arguments[0], self.env.docname)
        self.env.note_dependency(rel)
        return load(path)

    def _setup(self, payload: dict[str, Any], paired: bool = True) -> nodes.paragraph:
        return nodes.paragraph(
            text=setup_line(payload, paired=paired),
            classes=["bench-setup"],
            support_smartquotes=False,
        )


class BenchTable(_BenchDirective):
    """``bench-table``: rows of a bench JSON as a table, with the run's setup above."""

    option_spec = {
        "rows": _patterns,
        "exclude": _patterns,
        "notes": directives.flag,
        "no-setup": directives.flag,
    }

    def run(self) -> list[nodes.Node]:
        payload = self._payload()
        rows = select(payload["rows"], self.options.get("rows"), self.options.get("exclude"))
        if not rows:
            raise self.error(f"no row of {self.arguments[0]} matches {self.options.get('rows')}")
        out: list[nodes.Node] = [_table(list(COLUMNS), [row_cells(r) for r in rows], [])]
        if "no-setup" not in self.options:
            out.insert(0, self._setup(payload))
        if "notes" in self.options:
            notes = nodes.bullet_list(support_smartquotes=False)
            for r in rows:
                note = (r.get("measured") or {}).get("note")
                if note:
                    item = nodes.list_item()
                    para = nodes.paragraph()
                    para += nodes.literal(text=r["key"])
                    para += nodes.Text(f": {note}")
                    item += para
                    notes += item
            if len(notes):
                out.append(notes)
        return out


class BenchProblemSet(_BenchDirective):
    """``bench-problem-set``: the problem set's table of a bench JSON, with its setup."""

    def run(self) -> list[nodes.Node]:
        payload = self._payload()
        if not payload.get("problem_set", {}).get("problems"):
            raise self.error(f"{self.arguments[0]} holds no problem set (--problem-set)")
        return [
            self._setup(payload, paired=False),
            _table(problem_set_header(payload), problem_set_cells(payload), ["problem-set"]),
        ]


def setup(app) -> dict[str, Any]:
    app.add_directive("bench-table", BenchTable)
    app.add_directive("bench-problem-set", BenchProblemSet)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
