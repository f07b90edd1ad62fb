"""``fedhead-predict MODEL_DIR FILE --out OUT``: a client's saved model on new rows.

MODEL_DIR is a folder a client wrote at the end of a run (``model.json`` + ``model.pt2``,
[`fedhead.models.export`][fedhead.models.export]); FILE a CSV, Parquet or ``.npz`` file with the model's feature
columns (CSV/Parquet, by name, in any order; other columns are ignored) or an ``x`` array
(``.npz``: ``(N, F)``, or images ``(N, ch, H, W)`` of the model's shape). OUT gets one column
per target, in the original target units, one row per input row, as CSV, Parquet or ``.npz``
(array ``y`` ``(N, C)`` and ``target_names``), by its suffix; it is written atomically.

Bad input ends with one ``fedhead-predict: error: ...`` line naming the file (and column, and
the first bad row) and exit status 2, before the model is loaded: a missing or unreadable model
folder; a ``model.json`` of an older format, whose ``program`` is not a file in the folder or
that lacks the program's sha256; an input file that is missing, unreadable, lacks a feature
column or has non-numeric, missing or non-finite values, or values whose standardisation
overflows the model's float32 inputs; an ``.npz`` without ``x``, images of another shape or
dtype. A program file whose sha256 is not ``model.json``'s is refused the same way, without
torch ever reading it; predictions that are not finite are refused naming the row. OUT is
written only when everything succeeded (a file already there is left as it was otherwise).
Loading uses torch only: neither the training code nor the Flower app is imported.
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

PROG = "fedhead-predict"
EXIT_USAGE = 2
OUT_SUFFIXES = (".csv", ".parquet", ".npz")


class PredictInputError(ValueError):
    """Bad input to fedhead-predict; the message names the file and column."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Predictions of a client's saved model (MODEL_DIR: model.json + model.pt2) on FILE's rows, "
        "in the original target units.",
    )
    p.add_argument("model", metavar="MODEL_DIR", help="a model folder a client saved at the end of a run")
    p.add_argument("file", metavar="FILE", help="CSV, Parquet or .npz file with the model's inputs")
    p.add_argument("--out", required=True, metavar="OUT", help="predictions: .csv, .parquet or .npz (by suffix)")
    p.add_argument("--batch-size", type=int, default=4096, help="rows per forward pass (default 4096)")
    return p


def _row(path: str | Path, i: int) -> str:
    """How messages name row ``i`` (0-based) of the input file: 1-based, header not counted."""
    return f"x row {i + 1}" if Path(path).suffix.lower() == ".npz" else f"data row {i + 1}"


def _check_columns(x: np.ndarray, meta: dict, path: str | Path) -> None:
    """Refuse tabular inputs ``(N, F)`` with a missing or non-finite value, or one the model's
    float32 backbone cannot take after standardisation
    ([`fedhead.models.export.input_overflow`][fedhead.models.export.input_overflow]), naming the
    column, the count and the first row."""
    from fedhead.data.table_files import file_label
    from fedhead.models.export import input_overflow

    features = list(meta["inputs"].get("features") or [])
    bad, what = ~np.isfinite(x), "missing or non-finite value(s)"
    if not bad.any():
        bad, what = input_overflow(x, meta), "value(s) that overflow the model's float32 inputs after standardisation"
    if bad.any():
        row, j = (int(v) for v in np.argwhere(bad)[0])
        col = repr(features[j]) if len(features) == x.shape[1] else str(j + 1)
        value = "" if what.startswith("missing") else f": {float(x[row, j])!r}"
        raise PredictInputError(
            f"{file_label(path)}: column {col} has {int(bad[:, j].sum())} {what} (first in {_row(path, row)}{value})"
        )


def model_inputs(meta: dict, path: str | Path) -> np.ndarray:
    """The model's inputs ``(N, ...)`` from ``path`` (checked against ``meta["inputs"]``; tabular
    inputs also for values the model cannot take)."""
    from fedhead.data.table_files import TableError, file_label, numeric, read_file

    inputs = meta["inputs"]
    shape = tuple(int(s) for s in inputs["shape"])
    features = list(inputs.get("features") or [])
    name = file_label(path)
    try:
        table = read_file(path, targets=False)
        if table.x is None:  # CSV / Parquet: the feature columns by name
            if inputs["kind"] != "table" or not features:
                raise PredictInputError(f"{name}: the model takes an .npz 'x' array {list(shape)} per row, not columns")
            x = np.stack([numeric(table, f, "features") for f in features], axis=1)
            _check_columns(x, meta, path)
            return x
    except TableError as exc:  # the user's own file: its detail (the offending value) too
        raise PredictInputError(exc.local_text()) from None
    x = table.x
    if tuple(x.shape[1:]) != shape:
        what = "images" if inputs["kind"] == "image" else "inputs"
        raise PredictInputError(
            f"{name}: x has sample shape {list(x.shape[1:])} but the model takes {what} of shape {list(shape)}"
        )
    if inputs["dtype"] == "uint8" and x.dtype != np.uint8:
        raise PredictInputError(f"{name}: x is {x.dtype} but the model takes uint8 images (0-255)")
    if inputs["kind"] == "table" and x.ndim == 2:
        _check_columns(x, meta, path)
    elif x.dtype.kind == "f" and not np.isfinite(x).all():
        rows = np.unique(np.argwhere(~np.isfinite(x.reshape(x.shape[0], -1)))[:, 0])
        raise PredictInputError(
            f"{name}: x has missing or non-finite values in {rows.size} row(s) (first: row {int(rows[0]) + 1})"
        )
    return x


def check_outputs(y: np.ndarray, names: Sequence[str], path: str | Path) -> None:
    """Refuse predictions ``(N, C)`` with a non-finite value, naming the first such row of ``path``."""
    from fedhead.data.table_files import file_label

    bad = ~np.isfinite(y)
    if bad.any():
        row, c = (int(v) for v in np.argwhere(bad)[0])
        raise PredictInputError(
            f"{file_label(path)}: the model's prediction for {_row(path, row)} is not finite "
            f"({names[c]} = {float(y[row, c])!r}; {int(bad.any(axis=1).sum())} row(s) in all); nothing written"
        )


def write_predictions(path: str | Path, y: np.ndarray, names: Sequence[str]) -> Path:
    """``y`` ``(N, C)`` as CSV, Parquet or ``.npz`` by ``path``'s suffix, written atomically."""
    from fedhead.results.io import write_bytes_atomic

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        buf = io.BytesIO()
        np.savez(buf, y=y, target_names=np.asarray(list(names)))
        return write_bytes_atomic(path, buf.getvalue())
    import pyarrow as pa

    table = pa.table({n: y[:, i] for i, n in enumerate(names)})
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        return write_bytes_atomic(path, sink.getvalue().to_pybytes())
    text = io.StringIO()
    text.write(",".join(names) + "\n")
    for row in y:
        text.write(",".join(repr(float(v)) for v in row) + "\n")
    return write_bytes_atomic(path, text.getvalue().encode("utf-8"))


def predict_file(model_dir: str | Path, path: str | Path, out: str | Path, *, batch_size: int = 4096):
    """Check everything, load the model, predict ``path``'s rows and write ``out``; returns
    ``(y (N, C), meta)``. Bad input raises [`PredictInputError`][fedhead.cli.predict.PredictInputError] (or
    [`fedhead.models.export.ModelFileError`][fedhead.models.export.ModelFileError]) before torch loads the
    program (a program file whose sha256 is not ``model.json``'s is never loaded), and non-finite
    predictions raise it before ``out`` is written (``out`` is written only when all went well)."""
    from fedhead.models.export import load_model, read_meta

    if Path(out).suffix.lower() not in OUT_SUFFIXES:
        raise PredictInputError(f"{out}: unknown output type; use one of {', '.join(OUT_SUFFIXES)}")
    if batch_size < 1:
        raise PredictInputError(f"--batch-size must be at least 1, got {batch_size}")
    meta = read_meta(model_dir)
    x = model_inputs(meta, path)
    model = load_model(model_dir)
    y = model.predict(x, batch_size=batch_size)
    check_outputs(y, model.target_names, path)
    write_predictions(out, y, model.target_names)
    return y, meta


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status (0, 2 for bad input, 1 otherwise)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
    from fedhead.models.export import ModelFileError

    try:
        y, meta = predict_file(args.model, args.file, args.out, batch_size=args.batch_size)
    except (PredictInputError, ModelFileError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - anything else: one line too (a torch failure)
        print(f"{PROG}: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(
        f"{PROG}: {y.shape[0]} rows -> {args.out} (targets {', '.join(meta['targets']['names'])}; "
        f"partition {meta.get('partition')}, round {meta.get('round')} of {meta.get('procedure')})"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
