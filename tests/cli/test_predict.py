"""fedhead-predict (fedhead/cli/predict.py): a saved model on a CSV, Parquet or .npz file; every bad
input is one ``fedhead-predict: error:`` line naming the file (and column), exit status 2; the
console entry point; loading imports neither the training code nor the Flower app (statically;
in a fresh process: slow).

Attacks: non-finite or overflowing input rows, a model that yields non-finite predictions, a
``program`` outside the model folder, a program file changed after the export (a crafted one
that runs code when torch loads it is never loaded), a model.json without the program's sha256.
Nothing is written to OUT on any refusal, and a file already there is left as it was.

Two models are exported per module (torch.export's first call costs about 10 s on 2 busy cores).
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhead.cli.predict import main
from fedhead.models import ResMLP
from fedhead.models.export import PredictionModule, export_model, load_model

REPO = Path(__file__).resolve().parents[2]
FEATURES = ["f1", "f2", "f3"]
T_OFF, T_SCALE = np.array([100.0, -2.0]), np.array([20.0, 0.5])
I_OFF, I_SCALE = np.array([1.0, -50.0, 0.0]), np.array([2.0, 10.0, 0.1])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(folder, in-memory PredictionModule) of a small ResMLP with standardised inputs and targets."""
    folder = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    module = PredictionModule(
        ResMLP(3, width=8, depth=1, feature_dim=4),
        rng.normal(size=(2, 4)),
        rng.normal(size=2),
        T_OFF,
        T_SCALE,
        I_OFF,
        I_SCALE,
    )
    meta = {
        "inputs": {
            "kind": "table",
            "features": FEATURES,
            "shape": [3],
            "dtype": "float64",
            "standardization": {"mode": "pooled"},
        },
        "targets": {"names": ["t1", "t2"]},
        "partition": 1,
        "round": 4,
        "procedure": "proximal",
    }
    export_model(folder, module, torch.zeros((2, 3), dtype=torch.float64), meta)
    return folder, module


def _rows(n: int = 6) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(n, 3)) * I_SCALE + I_OFF


def _csv(path: Path, cols: dict[str, list]) -> Path:
    names = list(cols)
    lines = [",".join(names)] + [",".join(str(cols[c][i]) for c in names) for i in range(len(cols[names[0]]))]
    path.write_text("\n".join(lines) + "\n")
    return path


def _table(x: np.ndarray) -> dict[str, list]:
    """The features in another order than the model's, plus a text column it ignores."""
    cols = {"note": ["a"] * len(x)}
    for name in ("f3", "f1", "f2"):
        cols[name] = [repr(float(v)) for v in x[:, FEATURES.index(name)]]
    return cols


def test_predictions_in_every_output_format_are_the_module_s(model, tmp_path, capsys):
    folder, module = model
    x = _rows()
    with torch.no_grad():
        want = module(torch.as_tensor(x)).numpy()
    src = _csv(tmp_path / "rows.csv", _table(x))
    assert main([str(folder), str(src), "--out", str(tmp_path / "p.csv"), "--batch-size", "4"]) == 0
    assert capsys.readouterr().out.strip().startswith("fedhead-predict: 6 rows -> ")
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "t1,t2" and len(lines) == 7
    np.testing.assert_allclose(np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1), want, rtol=1e-12)
    np.savez(tmp_path / "rows.npz", x=x)  # an .npz: x (N, F) in the model's feature order, no y needed
    assert main([str(folder), str(tmp_path / "rows.npz"), "--out", str(tmp_path / "p.npz")]) == 0
    with np.load(tmp_path / "p.npz") as z:
        np.testing.assert_allclose(z["y"], want, rtol=1e-12)
        assert z["target_names"].tolist() == ["t1", "t2"]
    assert main([str(folder), str(src), "--out", str(tmp_path / "p.parquet")]) == 0
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "p.parquet")
    assert table.column_names == ["t1", "t2"]
    np.testing.assert_allclose(np.stack([table[c].to_numpy() for c in ("t1", "t2")], 1), want, rtol=1e-12)
    np.testing.assert_allclose(load_model(folder).predict(x), want, rtol=1e-12)
    meta = json.loads((folder / "model.json").read_text())
    assert meta["format_version"] == 2 and meta["program"] == "model.pt2"
    assert meta["program_sha256"] == hashlib.sha256((folder / "model.pt2").read_bytes()).hexdigest()
    std = meta["inputs"]["standardization"]
    assert std["mode"] == "pooled" and std["offset"] == I_OFF.tolist() and std["scale"] == I_SCALE.tolist()


def _bad_inputs(tmp_path: Path, folder: Path) -> dict[str, tuple[list[str], str]]:
    """Case -> (arguments before --out, the expected part of the error line)."""
    x = _rows()
    good = _csv(tmp_path / "good.csv", _table(x))
    no_f2 = {k: v for k, v in _table(x).items() if k != "f2"}
    text = _table(x) | {"f2": ["1.0", "2.0", "high", "3.0", "4.0", "5.0"]}
    nan = _table(x) | {"f3": ["1.0", "", "2.0", "NaN", "3.0", "4.0"]}
    np.savez(tmp_path / "no_x.npz", y=np.zeros((3, 2)))
    np.savez(tmp_path / "wide.npz", x=np.zeros((3, 4)))
    broken = tmp_path / "broken_model"
    broken.mkdir()
    (broken / "model.json").write_text("{")
    return {
        "no model folder": ([str(tmp_path / "nowhere"), str(good)], "nowhere: no such model folder"),
        "unreadable model.json": ([str(broken), str(good)], "model.json: cannot read it as JSON"),
        "no input file": ([str(folder), str(tmp_path / "absent.csv")], "absent.csv: no such file"),
        "missing feature": (
            [str(folder), str(_csv(tmp_path / "no_f2.csv", no_f2))],
            "no_f2.csv: no column 'f2'",
        ),
        "non-numeric": (
            [str(folder), str(_csv(tmp_path / "text.csv", text))],
            "text.csv: column 'f2' (dataset.features) is not numeric [e.g. 'high' in data row 3]",
        ),
        "missing values": (
            [str(folder), str(_csv(tmp_path / "nan.csv", nan))],
            "nan.csv: column 'f3' has 2 missing or non-finite value(s) (first in data row 2)",
        ),
        "npz without x": ([str(folder), str(tmp_path / "no_x.npz")], "no_x.npz: the .npz has no array(s) ['x']"),
        "npz of another shape": (
            [str(folder), str(tmp_path / "wide.npz")],
            "wide.npz: x has sample shape [4] but the model takes inputs of shape [3]",
        ),
        "output type": ([str(folder), str(good), "--out", str(tmp_path / "out.xlsx")], "out.xlsx: unknown output type"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "no model folder",
        "unreadable model.json",
        "no input file",
        "missing feature",
        "non-numeric",
        "missing values",
        "npz without x",
        "npz of another shape",
        "output type",
    ],
)
def test_bad_input_is_one_line_naming_the_file_and_column(model, tmp_path, capsys, case):
    folder, _ = model
    out = str(tmp_path / "out.csv")
    argv, expected = _bad_inputs(tmp_path, folder)[case]
    if "--out" not in argv:
        argv = [*argv, "--out", out]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedhead-predict: error: ") and expected in err, err
    assert not Path(out).exists()


def test_image_inputs_of_another_shape_or_dtype_are_refused(tmp_path, capsys):
    """An image model's folder: only model.json is read before the inputs are checked."""
    (tmp_path / "model.json").write_text(
        json.dumps(
            {
                "format": "fedhead-model",
                "format_version": 2,
                "program": "model.pt2",
                "program_sha256": "0" * 64,
                "inputs": {
                    "kind": "image",
                    "shape": [3, 8, 8],
                    "dtype": "uint8",
                    "standardization": {"mode": "none", "offset": [], "scale": []},
                },
                "targets": {"names": ["t"]},
            }
        )
    )
    np.savez(tmp_path / "small.npz", x=np.zeros((2, 3, 4, 4), dtype=np.uint8))
    np.savez(tmp_path / "float.npz", x=np.zeros((2, 3, 8, 8), dtype=np.float32))
    for name, expected in (
        ("small.npz", "small.npz: x has sample shape [3, 4, 4] but the model takes images of shape [3, 8, 8]"),
        ("float.npz", "float.npz: x is float32 but the model takes uint8 images (0-255)"),
    ):
        assert main([str(tmp_path), str(tmp_path / name), "--out", str(tmp_path / "o.csv")]) == 2
        err = capsys.readouterr().err
        assert err == f"fedhead-predict: error: {expected}\n"


# --------------------------------------------------------------------------- attacks and faults
KEEP = "an earlier file, not the command's\n"


def _refused(argv: list[str], out: Path, capsys) -> str:
    """Run fedhead-predict on ``argv`` with an OUT that exists already: exit status 2, one error
    line (returned), OUT unchanged and no other file left in its folder."""
    out.parent.mkdir(exist_ok=True)
    out.write_text(KEEP)
    before = sorted(out.parent.iterdir())
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedhead-predict: error: "), err
    assert out.read_text() == KEEP and sorted(out.parent.iterdir()) == before
    return err


def _npz(path: Path, x: np.ndarray) -> Path:
    np.savez(path, x=x)
    return path


#: case -> the error after "fedhead-predict: error: "
BAD_ROWS = {
    # standardised: (1e308 - 0) / 0.1 overflows float64 (the old code wrote nan,nan, exit status 0)
    "csv 1e308": "rows.csv: column 'f3' has 1 value(s) that overflow the model's float32 inputs after "
    "standardisation (first in data row 4: 1e+308)",
    # standardised 1e39: a float64, but inf as the backbone's float32
    "csv 1e40": "rows.csv: column 'f2' has 2 value(s) that overflow the model's float32 inputs after "
    "standardisation (first in data row 2: 1e+40)",
    "npz nan": "rows.npz: column 'f2' has 1 missing or non-finite value(s) (first in x row 3)",
    "npz inf": "rows.npz: column 'f1' has 2 missing or non-finite value(s) (first in x row 5)",
    "npz -1e308": "rows.npz: column 'f3' has 1 value(s) that overflow the model's float32 inputs after "
    "standardisation (first in x row 1: -1e+308)",
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_a_non_finite_or_overflowing_input_row_is_refused_naming_row_and_column(model, tmp_path, capsys, case):
    folder, _ = model
    x = _rows()
    if case == "csv 1e308":
        x[3, 2] = 1e308
    elif case == "csv 1e40":
        x[[1, 4], 1] = 1e40
    elif case == "npz nan":
        x[2, 1] = np.nan
    elif case == "npz inf":
        x[[4, 5], 0] = [np.inf, -np.inf]
    else:
        x[0, 2] = -1e308
    src = _npz(tmp_path / "rows.npz", x) if case.startswith("npz") else _csv(tmp_path / "rows.csv", _table(x))
    err = _refused([str(folder), str(src)], tmp_path / "out" / "p.csv", capsys)
    assert err == f"fedhead-predict: error: {BAD_ROWS[case]}\n"


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    """A real model whose prediction overflows for large inputs: an identity backbone, head
    ``W = [[1e300, 0, 0], [0, 1, 0]]``, inputs as they are."""
    folder = tmp_path_factory.mktemp("huge")
    w = np.array([[1e300, 0.0, 0.0], [0.0, 1.0, 0.0]])
    module = PredictionModule(torch.nn.Identity(), w, np.zeros(2), np.zeros(2), np.ones(2))
    meta = {"inputs": {"kind": "table", "features": FEATURES, "shape": [3], "dtype": "float64"}}
    export_model(folder, module, torch.zeros((2, 3), dtype=torch.float64), {**meta, "targets": {"names": ["t1", "t2"]}})
    return folder


def test_non_finite_predictions_are_refused_naming_the_row_and_nothing_is_written(huge, tmp_path, capsys):
    x = np.ones((5, 3))
    assert main([str(huge), str(_npz(tmp_path / "ok.npz", x)), "--out", str(tmp_path / "ok.csv")]) == 0
    np.testing.assert_allclose(np.loadtxt(tmp_path / "ok.csv", delimiter=",", skiprows=1)[:, 0], 1e300)
    capsys.readouterr()
    x[[2, 3], 0] = [1e10, -1e10]  # 1e310: inf in float64, though every input is a float32
    src = _csv(tmp_path / "rows.csv", {f: [repr(float(v)) for v in x[:, j]] for j, f in enumerate(FEATURES)})
    out = tmp_path / "new" / "p.parquet"
    assert main([str(huge), str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "fedhead-predict: error: rows.csv: the model's prediction for data row 3 is not finite "
        "(t1 = inf; 2 row(s) in all); nothing written\n"
    )
    assert not out.exists() and not out.parent.exists()
    err = _refused([str(huge), str(_npz(tmp_path / "rows.npz", x))], tmp_path / "p.npz", capsys)
    assert "rows.npz: the model's prediction for x row 3 is not finite (t1 = inf;" in err


def _copy(folder: Path, dest: Path, **changes) -> Path:
    """A copy of a model folder with ``model.json``'s keys changed (None: removed)."""
    shutil.copytree(folder, dest)
    meta = json.loads((dest / "model.json").read_text())
    meta.update(changes)
    meta = {k: v for k, v in meta.items() if v is not None}
    (dest / "model.json").write_text(json.dumps(meta))
    return dest


def _good_csv(tmp_path: Path) -> Path:
    return _csv(tmp_path / "rows.csv", _table(_rows()))


@pytest.mark.parametrize("where", ["absolute", "dotdot", "subfolder", "symlink"])
def test_a_program_outside_the_model_folder_is_refused(model, tmp_path, capsys, where):
    """The program: the exported file itself (its hash matches), placed outside the folder."""
    folder, _ = model
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(folder / "model.pt2", outside / "model.pt2")
    program = {"absolute": str(outside / "model.pt2"), "dotdot": "../elsewhere/model.pt2", "subfolder": "sub/m.pt2"}
    dest = _copy(folder, tmp_path / "m", program=program.get(where, "model.pt2"))
    if where == "symlink":
        (dest / "model.pt2").unlink()
        (dest / "model.pt2").symlink_to(outside / "model.pt2")
        expected = f"{dest / 'model.pt2'}: links to {(outside / 'model.pt2').resolve()}, outside the model folder"
    else:
        expected = f"'program' must be a file name inside the model folder, got {program[where]!r}"
    err = _refused([str(dest), str(_good_csv(tmp_path))], tmp_path / "p.csv", capsys)
    assert expected in err, err


def test_a_program_linked_inside_the_model_folder_is_loaded(model, tmp_path, capsys):
    folder, module = model
    dest = _copy(folder, tmp_path / "m", program="linked.pt2")
    (dest / "linked.pt2").symlink_to("model.pt2")
    x = _rows()
    assert main([str(dest), str(_csv(tmp_path / "rows.csv", _table(x))), "--out", str(tmp_path / "p.csv")]) == 0
    with torch.no_grad():
        want = module(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1), want, rtol=1e-12)


class _Payload:
    """Unpickling it creates the folder ``marker`` (what a crafted program could do instead)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _crafted(program: bytes, marker: Path) -> bytes:
    """The exported ``program`` with its first weight stored as a pickle that creates ``marker``:
    ``torch.export.load`` unpickles it (``torch.load(weights_only=False)``)."""
    with zipfile.ZipFile(io.BytesIO(program)) as zin:
        files = {info: zin.read(info.filename) for info in zin.infolist()}
    config = next(i for i in files if i.filename.endswith("model_weights_config.json"))
    cfg = json.loads(files[config])
    first = next(iter(cfg["config"].values()))
    first["use_pickle"] = True
    files[config] = json.dumps(cfg).encode()
    weight = next(i for i in files if i.filename.endswith(f"/weights/{first['path_name']}"))
    files[weight] = pickle.dumps(_Payload(marker))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zout:
        for info, body in files.items():
            zout.writestr(info, body)
    return out.getvalue()


@pytest.mark.parametrize("change", ["one byte", "crafted", "crafted, format 1"])
def test_a_program_changed_after_the_export_is_never_loaded(model, tmp_path, capsys, change):
    folder, _ = model
    marker = tmp_path / "the_program_ran"
    honest = (folder / "model.pt2").read_bytes()
    if change == "one byte":
        i = len(honest) // 2
        program = honest[:i] + bytes([honest[i] ^ 1]) + honest[i + 1 :]
        dest = _copy(folder, tmp_path / "m")
    elif change == "crafted":
        program = _crafted(honest, marker)
        dest = _copy(folder, tmp_path / "m")
    else:  # as the exporter before program_sha256 wrote it: the old fedhead-predict ran the payload
        program = _crafted(honest, marker)
        dest = _copy(folder, tmp_path / "m", format_version=1, program_sha256=None)
    (dest / "model.pt2").write_bytes(program)
    err = _refused([str(dest), str(_good_csv(tmp_path))], tmp_path / "p.csv", capsys)
    if change == "crafted, format 1":
        assert "model.json: format_version 1 records no program_sha256" in err and "re-export the model" in err, err
    else:
        digest = hashlib.sha256(program).hexdigest()
        assert f"model.pt2: its sha256 is {digest}, not model.json's program_sha256 " in err, err
        assert "(the file changed after the export); not loaded" in err
    assert not marker.exists()
    if change != "one byte":  # the crafted file does run code when torch loads it
        with pytest.raises(RuntimeError):  # torch cannot use the weight, after unpickling it
            torch.export.load(io.BytesIO(program))
        assert marker.is_dir()


def test_a_model_json_without_the_program_s_sha256_is_refused_with_a_re_export_message(model, tmp_path, capsys):
    folder, _ = model
    dest = _copy(folder, tmp_path / "m", program_sha256=None)
    err = _refused([str(dest), str(_good_csv(tmp_path))], tmp_path / "p.csv", capsys)
    assert err == (
        f"fedhead-predict: error: {dest / 'model.json'}: lacks program_sha256, so its program cannot be checked "
        "before torch loads it; re-export the model (rerun its training with this fedhead)\n"
    )


FORBIDDEN = ("fedhead.train", "fedhead.clients", "fedhead.strategies", "fedhead.federation", "flwr", "ray")


def _module_file(name: str) -> Path | None:
    rel = Path(*name.split("."))
    for cand in (REPO / rel.with_suffix(".py"), REPO / rel / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _fedhead_imports(start: str) -> set[str]:
    """Every module ``start`` imports, transitively through fedhead's own modules (static: every
    ``import``, at module level or in a function; packages' ``__init__`` included)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the parent packages run first
        path = _module_file(name)
        if path is None or parts[0] != "fedhead":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo.append(node.module)
                todo += [f"{node.module}.{a.name}" for a in node.names if _module_file(f"{node.module}.{a.name}")]
    return seen


def test_predict_imports_neither_training_nor_flower_code():
    found = _fedhead_imports("fedhead.cli.predict")
    assert {"fedhead.models.export", "fedhead.data.table_files", "torch"} <= found
    assert not [m for m in found if m.startswith(FORBIDDEN)], sorted(m for m in found if m.startswith(FORBIDDEN))
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fedhead-predict"] == "fedhead.cli.predict:main"


@pytest.mark.slow
def test_the_console_command_loads_without_training_or_flower_code(model, tmp_path):
    """The same in a fresh process, by sys.modules (slow: a fresh torch import, about 30 s on 2 busy cores)."""
    folder, module = model
    x = _rows(3)
    src = _csv(tmp_path / "rows.csv", _table(x))
    code = (
        "import sys; from fedhead.cli.predict import main; rc = main(sys.argv[1:]); "
        f"bad = sorted(m for m in sys.modules if m.startswith({FORBIDDEN!r})); "
        "print('imported:', bad); sys.exit(rc)"
    )
    out = tmp_path / "p.csv"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(folder), str(src), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "imported: []" in proc.stdout
    with torch.no_grad():
        np.testing.assert_allclose(
            np.loadtxt(out, delimiter=",", skiprows=1), module(torch.as_tensor(x)).numpy(), rtol=1e-12
        )
