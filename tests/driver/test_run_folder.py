"""``fedhead-run`` run folders in process (no Ray): a failed run removes only what it created.

A run that never started undoes its bookkeeping (``.hydra/``, ``*.log``) and, when it created
the folder, the folder; a folder that existed before the run (``hydra.run.dir=`` naming the
user's own folder) keeps every file it held, ``*.log`` files included. Bad input ends with one
line and exit status 2 before anything trains.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fedhead.cli import run as cli_run
from fedhead.data.table_files import file_key
from fedhead.driver.errors import note_run_dir, remove_unused_dir


def _rows(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = x @ np.array([[1.0, 0.5], [-0.3, 2.0], [0.2, 0.1]]) + 0.3 * rng.normal(size=(n, 2)) + seed
    return {"f1": x[:, 0], "f2": x[:, 1], "f3": x[:, 2], "t1": y[:, 0], "t2": y[:, 1]}


def write_csv(path: Path, cols: dict[str, np.ndarray]) -> Path:
    rows = zip(*(cols[c] for c in cols))
    path.write_text("\n".join([",".join(cols)] + [",".join(repr(float(v)) for v in r) for r in rows]) + "\n")
    return path


def _fedhead_run(monkeypatch, capsys, *args: str) -> tuple[int, list[str]]:
    """``fedhead-run ARGS`` in this process: its exit status and its stderr lines."""
    monkeypatch.setattr(sys, "argv", ["fedhead-run", *args])
    with pytest.raises(SystemExit) as info:
        cli_run.main()
    return int(info.value.code or 0), capsys.readouterr().err.strip().splitlines()


BAD_NAME = ("procedure=ordinary", "procedure.name=../../x")
NAME_ERROR = "name must be letters, digits"


def test_a_failed_run_keeps_a_folder_that_existed_with_its_log_files(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "mine"  # the user's folder, only *.log files (what Hydra's bookkeeping looks like)
    mine.mkdir()
    (mine / "training.log").write_text("my own log\n")
    (mine / "fedhead-run.log").write_text("an earlier run's log\n")
    code, err = _fedhead_run(monkeypatch, capsys, *BAD_NAME, f"hydra.run.dir={mine}")
    assert code == 2 and len(err) == 1 and NAME_ERROR in err[0], err
    assert (mine / "training.log").read_text() == "my own log\n"
    assert (mine / "fedhead-run.log").read_text().startswith("an earlier run's log\n")
    assert sorted(p.name for p in mine.rglob("*")) == ["fedhead-run.log", "training.log"]  # .hydra/ undone
    assert not (tmp_path / "x").exists()  # procedure.name never left the run folder


def test_a_failed_run_removes_the_folder_it_created(tmp_path, monkeypatch, capsys):
    new = tmp_path / "new" / "run"
    code, err = _fedhead_run(monkeypatch, capsys, *BAD_NAME, f"hydra.run.dir={new}")
    assert code == 2 and NAME_ERROR in err[0]
    assert not new.exists()  # as before: a run that never started leaves nothing behind
    assert not (tmp_path / "new").exists()  # nor the empty folder it created on the way (outputs/<date>)
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "other.txt").write_text("the user's\n")
    code, _ = _fedhead_run(monkeypatch, capsys, *BAD_NAME, f"hydra.run.dir={tmp_path / 'kept' / 'a' / 'run'}")
    assert code == 2 and sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["other.txt"]


def test_remove_unused_dir_removes_only_what_the_run_created(tmp_path):
    root = tmp_path / "run"
    (root / ".hydra").mkdir(parents=True)
    (root / ".hydra" / "config.yaml").write_text("old run\n")
    (root / "old.log").write_text("old\n")
    note_run_dir(root)
    (root / ".hydra" / "overrides.yaml").write_text("new\n")
    (root / "fedhead-run.log").write_text("new\n")
    assert remove_unused_dir(root)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        ".hydra",
        ".hydra/config.yaml",
        "old.log",
    ]
    (root / "results.json").write_text("{}")  # a run that wrote outputs has started: nothing goes
    note_run_dir(root)
    (root / "new.log").write_text("x")
    (root / "procedure").mkdir()
    (root / "procedure" / "results.json").write_text("{}")
    assert not remove_unused_dir(root) and (root / "new.log").exists()
    assert not remove_unused_dir(tmp_path / "never-noted")  # unknown: left alone


def _sites(tmp_path: Path) -> list[Path]:
    return [write_csv(tmp_path / f"site_{i}.csv", _rows(30 + 5 * i, i)) for i in range(3)]


def _table_args(files, out: Path) -> tuple[str, ...]:
    listed = ",".join(f'"{f}"' for f in files)
    return (
        "dataset=table",
        f"dataset.files=[{listed}]",
        "dataset.targets=[t1,t2]",
        f"dataset.cache_dir={out.parent / 'cache'}",
        "model=free",
        "procedure=ordinary",
        "rounds=1",
        f"hydra.run.dir={out}",
    )


def test_fedhead_run_refuses_an_overflowing_cell_and_a_copied_site_with_exit_2(tmp_path, monkeypatch, capsys):
    files = _sites(tmp_path)
    cols = _rows(30, 9)
    cols["t1"][4] = 1e308
    big = write_csv(tmp_path / "big.csv", cols)
    code, err = _fedhead_run(monkeypatch, capsys, *_table_args([files[0], big], tmp_path / "run1"))
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("fedhead-run: error: big.csv: the mean or variance of target column 't1' is not finite")
    assert "1e" not in err[0] and "fully active" not in err[0]
    copy = tmp_path / "copy.csv"
    copy.write_bytes(files[1].read_bytes())
    code, err = _fedhead_run(monkeypatch, capsys, *_table_args([*files, copy], tmp_path / "run2"))
    assert code == 2 and err == [
        f"fedhead-run: error: copy.csv has the same bytes as site_1.csv (site key {file_key(copy)}): a site "
        "given twice would count its rows twice; give each site's file once"
    ]
    assert not (tmp_path / "run1").exists() and not (tmp_path / "run2").exists()
