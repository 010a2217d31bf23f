"""The experiments' figures, tables and log lines say what they show: each panel's beta*,
the optimizer's real name, readable columns, legends clear of the data, tidy log lines and
the implementation the stored runs used."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

from amopt.experiments import (  # noqa: E402
    RunContext,
    llm,
    logreg,
    quadratic,
    render_summary,
    theory,
    vision,
)

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def _stored(name: str) -> dict:
    path = RESULTS / name / "results.json"
    if not path.is_file():
        pytest.skip(f"{path} not in this checkout")
    return json.loads(path.read_text())


@pytest.fixture
def figures(monkeypatch):
    """The figures the experiment modules save (drawn, as the PNG is), by file name."""
    saved: dict[str, object] = {}
    for module in (logreg, quadratic, theory, vision):
        original = module.save_figure

        def capture(fig, path, _original=original):
            name = _original(fig, path)  # lays the figure out and writes the PNG
            fig.canvas.draw()
            saved[name] = fig
            return name

        monkeypatch.setattr(module, "save_figure", capture)
    return saved


def _legends(fig) -> list:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


def _texts(fig) -> list[str]:
    out = [t.get_text() for t in fig.texts]
    for leg in _legends(fig):
        out += [t.get_text() for t in leg.get_texts()]
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
    return out


def _assert_legends_clear_of_panels(fig) -> None:
    """Every legend lies outside every panel with data (so it covers no line)."""
    legends = _legends(fig)
    assert legends, "no legend"
    panels = [ax for ax in fig.axes if ax.axison and ax.has_data()]
    for leg in legends:
        box = leg.get_window_extent()
        for ax in panels:
            assert not box.overlaps(ax.get_window_extent()), (
                f"legend {[t.get_text() for t in leg.get_texts()][:3]} lies on panel "
                f"{ax.get_title()!r}"
            )


def test_logreg_figure_names_each_panels_beta_star(tmp_path, figures):
    rng = np.random.default_rng(0)
    data = {}
    for name, b, hb in (("a9a", 0.99, 0.9), ("w8a", 0.95, 0.99), ("phishing", 0.9, 0.7)):
        gaps = {
            m: np.abs(rng.standard_normal(50)) + 1e-3 for m in logreg.STYLES if "Adam" not in m
        }
        gaps = {
            m: gaps[m] for m in ("GD", "MGD (0.9)", "MGD (beta*)", "HB (beta*)", *logreg.AM_MGD)
        }
        data[name] = {"gaps": gaps, "betas": {}, "beta_star": b, "beta_star_heavy_ball": hb}
    logreg._plot(RunContext(out=tmp_path, quiet=True), data, 50)
    fig = figures["logreg.png"]
    titles = [ax.get_title() for ax in fig.axes if ax.axison]
    for (name, d), title in zip(data.items(), titles, strict=True):
        assert name in title
        assert f"MGD beta* = {d['beta_star']}" in title
        assert f"HB beta* = {d['beta_star_heavy_ball']}" in title
    labels = [t.get_text() for leg in _legends(fig) for t in leg.get_texts()]
    # no beta* value in the one legend: it would be one panel's value shown for all
    assert not any(re.search(r"beta\*\s*=\s*0\.\d", label) for label in labels), labels
    assert any("classical undamped" in label for label in labels)
    assert any("damped heavy ball" in label for label in labels)
    _assert_legends_clear_of_panels(fig)


def test_quadratic_figure_legend_clear_of_data_and_beta_star_per_panel(tmp_path, figures):
    result = quadratic.run(RunContext(out=tmp_path, quick=True, quiet=True))
    fig = figures["quadratic.png"]
    _assert_legends_clear_of_panels(fig)
    first = {p["cond"]: p for p in result["summary"]["problems"] if p["seed"] == 0}
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    for cond, p in first.items():
        want = f"MGD beta* = {p['beta_star_damped']}, HB beta* = {p['beta_star_heavy_ball']}"
        assert any(f"cond = {cond:g}" in t and want in t for t in titles), titles


def test_theory_legend_covers_no_bound_line(tmp_path, figures):
    rows = _stored("theory")["summary"]["checks"]
    theory._plot(RunContext(out=tmp_path, quiet=True), rows)
    fig = figures["theory.png"]
    _assert_legends_clear_of_panels(fig)
    labels = [t.get_text() for leg in _legends(fig) for t in leg.get_texts()]
    for problem in {r["problem"] for r in rows}:
        assert f"{problem}: bound" in labels and f"{problem}: measured" in labels
    # one colour per problem in every panel (one legend serves them all)
    colours: dict[str, set] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            label = line.get_label()
            if label.endswith(": bound"):
                colours.setdefault(label, set()).add(line.get_color())
    assert all(len(c) == 1 for c in colours.values()), colours


def _vision_runs():
    rng = np.random.default_rng(1)
    runs = []
    for opt in ("MGD", "AM-MGD"):
        runs.append(
            {
                "optimizer": opt,
                "seed": 0,
                "losses": np.abs(rng.standard_normal(100)) + 0.1,
                "epochs": [{"epoch": e, "test_acc": 0.5 + 0.1 * e} for e in range(3)],
                "betas": rng.uniform(0, 0.9, 100) if opt == "AM-MGD" else None,
            }
        )
    cfg = {"milestones": [0.5, 0.75], "n_train": 100, "batch_size": 10, "lr": 0.1, "epochs": 2}
    return runs, cfg


def test_vision_figure_and_tables_call_the_optimizer_amsgd(tmp_path, figures):
    runs, cfg = _vision_runs()
    vision._plot_main(RunContext(out=tmp_path, quiet=True), runs, cfg)
    texts = _texts(figures["vision.png"])
    assert not any("AM-MGD" in t for t in texts), [t for t in texts if "AM-MGD" in t]
    assert "AMSGD" in texts and any("AMSGD beta_t" in t for t in texts)
    table = render_summary("vision", _stored("vision"))
    assert "| AMSGD |" in table and "| AM-MGD |" not in table


def test_quadratic_summary_columns_are_readable_and_right():
    result = _stored("quadratic")
    table = render_summary("quadratic", result)
    assert "exact: " not in table and "linear: " not in table
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cols = ["exact beats MGD(beta*)", "exact beats HB(beta*)"]
    cols += ["linear beats MGD(beta*)", "linear beats HB(beta*)"]
    assert header[-4:] == cols and header[2:4] == ["MGD beta*", "HB beta*"]
    problems = result["summary"]["problems"]
    for line, p in zip(lines[1 : 1 + len(problems)], problems, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2:4] == [str(p["beta_star_damped"]), str(p["beta_star_heavy_ball"])]

        def key(m):  # fewer iterations to the tolerance, then the lower final gap
            it = m["iters_to_tol"]
            return (np.inf if it is None else it, m["final_rel_gap"])

        ms = p["methods"]
        expected = [
            key(ms[am]) < key(ms[base])
            for am in ("AM-MGD (exact)", "AM-MGD (linear)")
            for base in ("MGD (beta*)", "HB (beta*)")
        ]
        assert cells[-4:] == ["yes" if e else "no" for e in expected]


def test_llm_timing_log_lines_are_tidy():
    timing = {
        "unavailable": {"AM-AdamW fused": "RuntimeError: no compiler"},
        "AdamW single-tensor": {"iter_s": 0.0045063, "step_s": 0.00061989},
        "AM-AdamW single-tensor": {"iter_s": 0.0055272, "step_s": 0.0026822},
        "overhead single-tensor": {
            "iter_pct": 100 * (0.0055272 - 0.0045063) / 0.0045063,
            "step_diff_pct_of_iter": 100 * (0.0026822 - 0.00061989) / 0.0045063,
            "step_ratio": 0.0026822 / 0.00061989,
        },
    }
    lines = llm.timing_lines("tiny-a", timing)
    assert len(lines) == 2
    assert not any("{" in line or "'" in line for line in lines)
    one = lines[0]
    assert one.startswith("[llm] tiny-a single-tensor:")
    assert "AdamW 4.51 (0.62)" in one and "AM-AdamW 5.53 (2.68)" in one
    assert "+22.7% per iteration" in one and "+45.8% of an iteration" in one
    assert lines[1] == "[llm] tiny-a AM-AdamW fused: not timed (RuntimeError: no compiler)"


def test_stored_results_say_which_implementation_ran():
    for name, optimizer in (("vision", "AMSGD"), ("llm", "AM-AdamW")):
        stored = _stored(name)
        table = render_summary(name, stored)
        if "optimizer_implementation" in stored["config"]:
            assert f"{optimizer} ran its default implementation: the " in table
        else:  # produced before the default became the fused kernels
            assert "single-tensor path" in table and "today's default" in table
        assert optimizer in table
    readme = (RESULTS / "README.md").read_text()
    assert "use the default (single-tensor) path" not in readme


def test_new_results_record_the_implementation_that_ran():
    torch = pytest.importorskip("torch")
    from amopt.experiments._common import implementation_note, optimizer_path
    from amopt.torch._common import default_path

    params = [torch.zeros(3, requires_grad=True), torch.zeros(2, 2, requires_grad=True)]
    path = optimizer_path(params)
    assert path.split()[0] == default_path(params, [], fused=None, foreach=None)[0]
    note = implementation_note({"optimizer_implementation": "fused"}, "AMSGD")
    assert note == "AMSGD ran its default implementation: the fused C kernels."
