"""No error about a site's file quotes the file's cells (data/table_files.py, data/site.py,
clients/messages.py): every refusal of a malformed site file names the file, the column and the
kind of problem; the offending value, its row and the counts are its ``detail`` (the node's own
log, the local console), never its text, which is what a ClientApp sends to the server."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from fedhead.clients.messages import ClientError, site_data_error
from fedhead.data.site import RowMinimum, TooFewRows, read_site
from fedhead.data.table_config import TableConfig
from fedhead.data.table_files import TableError
from fedhead.driver.errors import one_line

COLS = ("f1", "f2", "t1", "t2", "is_test")


def _cells(n: int, seed: int) -> dict[str, list[str]]:
    """Distinctive cells (9 significant digits, no two alike) and a 0/1 test column."""
    rng = np.random.default_rng(seed)
    out = {c: [f"{v:.9g}" for v in rng.uniform(1000.0, 9000.0, size=n)] for c in COLS[:4]}
    out["is_test"] = ["1" if i % 4 == 0 else "0" for i in range(n)]
    return out


def _write(path: Path, cells: dict[str, list[str]], *, ragged_row: int | None = None) -> Path:
    names = list(cells)
    rows = [",".join(cells[c][i] for c in names) for i in range(len(cells[names[0]]))]
    if ragged_row is not None:
        rows[ragged_row] = ",".join(cells[c][ragged_row] for c in names[:-2])  # two cells short
    path.write_text("\n".join([",".join(names), *rows]) + "\n")
    return path


def _malformed(tmp_path: Path, case: str) -> tuple[Path, dict[str, list[str]], dict, str]:
    """(file, its cells, TableConfig keywords, what the public text must say) of each case."""
    cells = _cells(30, 3)
    kw: dict = {}
    if case == "non-numeric target cell":
        cells["t2"][17] = "unknown-4471.25"
        expect = "column 't2' (dataset.targets) is not numeric"
    elif case == "non-numeric feature cell":
        cells["f1"][4] = "7743.2 kg"
        expect = "column 'f1' (dataset.features) is not numeric"
    elif case == "NaN with missing=refuse":
        for c, i in (("t1", 3), ("t1", 9), ("f2", 21)):
            cells[c][i] = "NaN"
        expect = "rows have NaN or Inf in used column(s) ['t1', 'f2']"
    elif case == "fewer rows than C + 1":
        cells = {c: v[:2] for c, v in cells.items()}
        kw["min_rows"] = 1
        expect = "fewer training rows than a client needs, C + 1 = 3"
    elif case == "fewer rows than privacy.min_rows":
        cells = {c: v[:8] for c, v in cells.items()}
        expect = "fewer training rows than the site's minimum (privacy.min_rows=10)"
    elif case == "a target column missing":
        cells.pop("t2")
        expect = "no column 't2' (dataset.targets)"
    elif case == "ragged row":
        path = _write(tmp_path / "site.csv", cells, ragged_row=12)
        return path, cells, kw, "cannot read it as CSV (ArrowInvalid)"
    elif case == "bad test cell":
        cells["is_test"][6] = "maybe-5"
        kw["test_column"] = "is_test"
        expect = "the test column 'is_test' has a value that is not true/false or 1/0"
    else:
        raise AssertionError(case)
    return _write(tmp_path / "site.csv", cells), cells, kw, expect


def _quoted(text: str, cells: dict[str, list[str]]) -> list[str]:
    """The cells of the file that ``text`` quotes: as written, as Python prints them, rounded."""
    out = []
    for values in cells.values():  # (the test column's 0 and 1 are too short to tell)
        for cell in values:
            forms = {cell.strip()}
            try:
                v = float(cell)
                forms |= {repr(v), f"{v:.6g}", f"{v:.4g}", f"{v:.2f}", f"{v:.1f}"}
            except ValueError:
                forms |= {part for part in cell.split() if len(part) >= 3}
            out += [f for f in forms if len(f) >= 3 and f in text and f.lower() != "nan"]
    return out


CASES = [
    "non-numeric target cell",
    "non-numeric feature cell",
    "NaN with missing=refuse",
    "fewer rows than C + 1",
    "fewer rows than privacy.min_rows",
    "a target column missing",
    "ragged row",
    "bad test cell",
]


@pytest.mark.parametrize("case", CASES)
def test_no_error_about_a_malformed_site_file_quotes_its_cells(tmp_path, case, caplog):
    path, cells, kw, expect = _malformed(tmp_path, case)
    minimum = RowMinimum(kw.pop("min_rows", 10))
    cfg = TableConfig(files=[], num_clients=2, targets=["t1", "t2"], features=["f1", "f2"], **kw)  # site-local
    with pytest.raises(TableError) as info:
        read_site(cfg, path, minimum)
    text = str(info.value)
    assert f"site.csv: {expect}" in text and "\n" not in text, text
    assert str(tmp_path) not in text, text  # the file's name, not where the node keeps it
    # what the ClientApp sends: the same public text, nothing of the detail
    with caplog.at_level(logging.WARNING, logger="fedhead.clients.messages"):
        sent = str(site_data_error(info.value, "node 7"))
    assert sent == f"node 7: {text}"
    for said in (text, sent, one_line(info.value)):
        assert not _quoted(said, cells), (said, _quoted(said, cells))
    # the detail (the local side only) says what the text may not, where there is something to say
    local = caplog.records[-1].getMessage()
    if case in ("non-numeric target cell", "non-numeric feature cell", "bad test cell"):
        assert _quoted(local, cells) and "data row" in local, local
    if case.startswith("fewer rows"):
        assert f"[{len(cells['t1'])} training row(s)]" in local, local
        assert isinstance(info.value, TooFewRows) == (case == "fewer rows than privacy.min_rows")
    assert one_line(info.value, local=True) == " ".join(info.value.local_text().split())


def test_an_unexpected_failure_reading_a_site_sends_only_its_kind(caplog):
    secret = "row 12 holds 4471.25"
    with caplog.at_level(logging.WARNING, logger="fedhead.clients.messages"):
        err = site_data_error(OSError(secret), "node 3")
    assert isinstance(err, ClientError) and secret not in str(err) and "OSError" in str(err), str(err)
    assert secret in caplog.text  # the node's own log


def test_another_data_error_sends_its_text_which_names_no_value(caplog):
    from fedhead.data.base import DataError

    text = "site.npz: dataset.image_size=64 exceeds the native (32, 32) images"
    with caplog.at_level(logging.WARNING, logger="fedhead.clients.messages"):
        assert str(site_data_error(DataError(text), "node 3")) == f"node 3: {text}"
    assert text in caplog.text
