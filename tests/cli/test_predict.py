"""fedhead-predict (fedhead/cli/predict.py): a saved model on a CSV, Parquet or .npz file; every bad
input is one ``fedhead-predict: error:`` line naming the file (and column), exit status 2; the
console entry point; loading imports neither the training code nor the Flower app (statically;
in a fresh process: slow).

One model is exported per module (torch.export's first call costs about 10 s on 2 busy cores).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
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
        "inputs": {"kind": "table", "features": FEATURES, "shape": [3], "dtype": "float64"},
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
            "text.csv: column 'f2' (dataset.features) is not numeric (e.g. '1.0')",
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
    import json

    (tmp_path / "model.json").write_text(
        json.dumps(
            {
                "format": "fedhead-model",
                "format_version": 1,
                "inputs": {"kind": "image", "shape": [3, 8, 8], "dtype": "uint8"},
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
