"""``python -m amopt.experiments --out DIR``: an output folder that cannot take the results is
refused at once, naming the option and the path, before any experiment runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

from amopt.experiments import __main__ as cli  # noqa: E402


@pytest.fixture
def runs(monkeypatch):
    """The experiments started (none may start when --out is unusable)."""
    started: list[str] = []

    def spy(name, ctx):
        started.append(name)
        raise AssertionError(f"{name} started with --out {ctx.out}")

    monkeypatch.setattr(cli, "run_experiment", spy)
    monkeypatch.setattr(cli, "write_report", lambda out: started.append("report"))
    return started


def _refused(argv, capsys, runs) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2  # argparse's usage error
    assert runs == []
    err = capsys.readouterr().err
    assert "argument --out:" in err and "nothing was run" in err
    return err


@pytest.mark.parametrize("name", ["quadratic", "all", "report"])
def test_out_that_is_a_file(tmp_path, capsys, runs, name):
    out = tmp_path / "results.txt"
    out.write_text("not a folder")
    err = _refused([name, "--quick", "--out", str(out)], capsys, runs)
    assert f"{out} is a file, not a folder" in err
    assert out.read_text() == "not a folder"


def test_out_below_a_file(tmp_path, capsys, runs):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "results"
    err = _refused(["theory", "--quick", "--out", str(out)], capsys, runs)
    assert f"{blocker} is a file, so the folder {out} cannot be created" in err


def test_experiment_folder_inside_out_that_is_a_file(tmp_path, capsys, runs):
    (tmp_path / "quadratic").write_text("x")
    err = _refused(["quadratic", "--quick", "--out", str(tmp_path)], capsys, runs)
    assert f"{tmp_path / 'quadratic'} is a file, not a folder" in err


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere"
)
@pytest.mark.parametrize("below", [False, True])
def test_out_not_writable(tmp_path, capsys, runs, below):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    out = locked / "results" if below else locked
    try:
        err = _refused(["quadratic", "--quick", "--out", str(out)], capsys, runs)
    finally:
        locked.chmod(0o700)
    assert f"cannot write to {out}" in err and "Permission denied" in err


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/sys/kernel").is_dir(),
    reason="needs Linux sysfs (a place no one, root included, can create a folder in)",
)
def test_out_inside_a_read_only_place(capsys, runs):
    out = Path("/sys/amopt-experiment-results")
    assert not out.exists()
    err = _refused(["logreg", "--quick", "--out", str(out)], capsys, runs)
    assert f"cannot write to {out}" in err
    assert not out.exists()


def test_usable_out_is_created_and_left_clean(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(
        cli, "run_experiment", lambda name, ctx: started.append(ctx.out) or {"plots": []}
    )
    out = tmp_path / "new" / "results"
    assert cli.main(["quadratic", "--quick", "--quiet", "--out", str(out)]) == 0
    assert started == [out / "quadratic"]
    assert sorted(p.name for p in out.rglob("*")) == ["quadratic"]  # no probe file left
