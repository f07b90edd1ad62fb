"""The paper's published values of Tables 4-9, attached beside the report's medians (pure).

[`attach`][fedhead.report.paper.attach] sets ``Cell.paper`` (and so ``Cell.ratio``, ours /
paper) on every report cell that measures what the paper's cell does; the values that measure
something else appear in the claims instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from fedhead.report.tables import Cell, Table


@dataclass(frozen=True)
class PaperValue:
    """One published cell and the report cell it belongs to.

    Only cells that fedhead's tables compute are listed: where the report's cell measures
    something else (Table 7's removed fraction divides by ``L_trained − L_local``, the paper's by
    ``L_raw``; Table 8's ``data_size`` rows are per setting, the paper's pool both) no value is
    attached.

    Attributes
    ----------
    table : int
        The paper's table number.
    paper_row, paper_column : str
        The row and column as the paper names them.
    value : float
        The printed value (a percentage for ``%`` columns, e.g. 100.0 or -0.2).
    key : str
        The report table (``table4``, ...).
    row : mapping
        Label column key -> the label (str, exact) or a pattern (full match) of the report row.
    column : str
        The report's value column.
    """

    table: int
    paper_row: str
    paper_column: str
    value: float
    key: str
    row: Mapping[str, str | re.Pattern]
    column: str

    def matches(self, row: Mapping[str, Cell]) -> bool:
        """True when ``row``'s label cells match [`row`][fedhead.report.paper.PaperValue.row]."""
        for k, want in self.row.items():
            if k not in row:
                return False
            text = row[k].text()
            if isinstance(want, re.Pattern):
                if not want.fullmatch(text):
                    return False
            elif text != want:
                return False
        return True


def _row(table: int, key: str, labels: Mapping, paper_row: str, columns, values) -> list[PaperValue]:
    """The values of one paper row: ``columns`` = ``((paper column, report column), ...)``."""
    return [PaperValue(table, paper_row, pc, v, key, labels, col) for (pc, col), v in zip(columns, values)]


#: Table 4's columns (paper column, report column): uncorrected and corrected rows
_T4_PLAIN = (
    ("Endpoint e_F (no corr.)", "endpoint"),
    ("Trajectory e_F (no corr.)", "trajectory"),
    ("δ_last", "delta_last"),
)
_T4_CORR = (("Round 1 d (corr.)", "d_cen_1"), ("Round 1 e_F (corr.)", "e_cen_1"), ("Round 8 e_F (corr.)", "endpoint"))

TABLE4 = (
    _row(4, "table4", {"procedure": "ordinary"}, "Ordinary", _T4_PLAIN, (1.63e-2, 3.44e-2, 1.85e-1))
    + _row(4, "table4", {"procedure": "proximal"}, "Proximal", _T4_PLAIN, (2.90e-4, 3.39e-4, 4.47e-3))
    + _row(4, "table4", {"procedure": "corrected"}, "Ordinary (corr.)", _T4_CORR, (8.35e-2, 3.08e-1, 5.06e-3))
    + _row(4, "table4", {"procedure": "corrected_proximal"}, "Proximal (corr.)", _T4_CORR, (4.21e-3, 2.29e-2, 7.08e-5))
)

#: Table 5: ρ -> (δ_last, relative original-objective gap, e_F(G_8, G_star))
TABLE5_ROWS = {
    0.0: (1.91e-1, 1.43e-5, 1.71e-2),
    1e-5: (1.19e-1, 1.49e-5, 7.38e-3),
    1e-4: (3.73e-2, 1.53e-5, 9.14e-4),
    1e-3: (5.33e-3, 4.05e-5, 3.08e-4),
    1e-2: (3.31e-2, 1.40e-3, 4.17e-3),
    1e-1: (1.32e-1, 1.81e-2, 4.26e-2),
    1.0: (3.56e-1, 1.57e-1, 3.80e-1),
}
_T5_COLS = (
    ("Distance to selected heads δ_last", "delta_last"),
    ("Relative original-objective gap", "objective_gap"),
    ("e_F(G_8,G_⋆)", "endpoint"),
)
TABLE5 = [
    v
    for rho, vals in TABLE5_ROWS.items()
    for v in _row(5, "table5", {"rho": f"{rho:g}"}, f"ρ = {rho:g}", _T5_COLS, vals)
]

_T6_PLAIN = (
    ("δ_last (no corr.)", "delta_last"),
    ("Trajectory e_F (no corr.)", "trajectory"),
    ("Endpoint e_F", "endpoint"),
)
_T6_CORR = (("Round 8 e_F (corrected)", "endpoint"),)
TABLE6 = (
    _row(6, "table6", {"procedure": "ordinary"}, "Ordinary", _T6_PLAIN, (1.87e-1, 6.75e-2, 1.86e-2))
    + _row(6, "table6", {"procedure": "proximal"}, "Proximal", _T6_PLAIN, (6.35e-3, 3.63e-4, 3.24e-4))
    + _row(6, "table6", {"procedure": "aligned"}, "Aligned", _T6_PLAIN, (1.54e-4, 1.12e-4, 1.10e-4))
    + _row(6, "table6", {"procedure": "corrected"}, "Ordinary (corrected)", _T6_CORR, (7.07e-3,))
    + _row(6, "table6", {"procedure": "corrected_proximal"}, "Proximal (corrected)", _T6_CORR, (7.06e-5,))
    + _row(6, "table6", {"procedure": "aligned_corrected"}, "Aligned (corrected)", _T6_CORR, (6.27e-5,))
)

#: Table 6's round-1 corrected e_F (no report column; claim 23 reads it from the runs)
TABLE6_ROUND1_CORRECTED = {"corrected": 5.20e-1, "corrected_proximal": 2.38e-2, "aligned_corrected": 8.38e-5}

#: Table 7 as printed (percent of L_raw that alignment removes; common, independent). Not attached:
#: the report's removed fraction is (L_trained − L_aligned) / (L_trained − L_local).
TABLE7_PERCENT = {
    "beijing": (15.7, 15.4),
    "swimmer": (10.1, 10.5),
    "hopper": (17.7, 18.1),
    "halfcheetah": (23.6, 23.7),
    "shapes3d": (4.6, 6.0),
    "cifar_geo": (7.0, 8.3),
}

_T8_COLS = (("To G_⋆", "d_star"), ("To G_cen", "d_cen"), ("Closer to G_⋆", "closer"))


def _table8_row(sweep: str, variant: str, paper_row: str, vals: tuple[float, float, float]) -> list[PaperValue]:
    """One Table 8 row: the report row of ``sweep`` whose variant label matches the pattern ``variant``."""
    return _row(8, "table8", {"sweep": sweep, "variant": re.compile(variant)}, paper_row, _T8_COLS, vals)


_FULL_MODEL_VARIANT = r".* / full_model{} / .*paper_local_epochs={}\b.*"
TABLE8 = (
    _table8_row("architectures", r"rescnn / ordinary", "Residual CNN", (1.45e-2, 5.24e-1, 100.0))
    + _table8_row("architectures", r"rescnn / corrected", "Residual CNN + correction", (5.05e-1, 1.93e-3, 0.0))
    + _table8_row("architectures", r"resnet34 / ordinary", "ResNet-34", (1.29e-2, 5.19e-1, 100.0))
    + _table8_row("full_model", _FULL_MODEL_VARIANT.format("", 400), "Full-model E=400", (4.41e-1, 1.82e-1, 27.0))
    + _table8_row("full_model", _FULL_MODEL_VARIANT.format("", 4000), "Full-model E=4000", (2.14e-2, 6.20e-1, 100.0))
    + _table8_row(
        "full_model",
        _FULL_MODEL_VARIANT.format(r"\+correction", 4000),
        "Full-model E=4000 + correction",
        (6.22e-1, 8.08e-3, 0.0),
    )
)


def _table9_row(
    procedure: str, paper_row: str, column: tuple[str, str], value: float, split: str = ""
) -> list[PaperValue]:
    """One Table 9 cell of ``procedure`` (``split``: the MSE split of a change column)."""
    labels = {"sweep": "prediction", "procedure": procedure} | ({"split": split} if split else {})
    return _row(9, "table9", labels, paper_row, (column,), (value,))


#: Table 9, sweep ``prediction``: the report's endpoint is e_F to the procedure's own reference
#: (G_star; G_cen when corrected); its paired change is of the test MSE, or the train MSE where
#: the data set has no test split (column ``split``).
_CORRECTED_PROXIMAL = "Proximal + moment correction"
TABLE9 = (
    _table9_row("ordinary", "Ordinary", ("e_F(G_8,G_⋆)", "endpoint"), 1.37e-2)
    + _table9_row("proximal", "Proximal", ("e_F(G_8,G_⋆)", "endpoint"), 1.54e-4)
    + _table9_row("proximal", "Proximal", ("Test loss change", "change"), -0.1, "test")
    + _table9_row("proximal", "Proximal", ("Train loss change", "change"), -0.2, "train")
    + _table9_row("corrected_proximal", _CORRECTED_PROXIMAL, ("e_F(G_8,G_cen)", "endpoint"), 7.03e-5)
    + _table9_row("corrected_proximal", _CORRECTED_PROXIMAL, ("Test loss change", "change"), -1.5, "test")
    + _table9_row("corrected_proximal", _CORRECTED_PROXIMAL, ("Train loss change", "change"), -2.0, "train")
)

#: Every attached value
PAPER_VALUES: tuple[PaperValue, ...] = tuple(TABLE4 + TABLE5 + TABLE6 + TABLE8 + TABLE9)

#: What the report's cell and the paper's differ in, per report table (shown in the table's note)
CAVEATS = {
    "table5": "the paper takes the median across clients first, the report pools every client's gap",
    "table8": "'closer' is compared as a percentage of runs",
    "table9": "the paper's change is test loss (train loss where the row's split is train)",
}


def paper_value(table_key: str, row: Mapping[str, Cell], column: str) -> PaperValue | None:
    """The published value of the report cell ``(table_key, row, column)``, or None."""
    return next(
        (p for p in PAPER_VALUES if p.key == table_key and p.column == column and p.matches(row)),
        None,
    )


def attach(table: Table) -> Table:
    """``table`` with ``Cell.paper`` set on every cell the paper publishes (a new Table)."""
    rows, found = [], False
    for row in table.rows:
        new = dict(row)
        for col, _ in table.values:
            pv = paper_value(table.key, row, col) if col in row else None
            if pv is not None:
                new[col] = replace(row[col], paper=pv.value)
                found = True
        rows.append(new)
    if not found:
        return table
    note = table.note + "; paper: the paper's value of the cell, ×: ours / paper"
    if table.key in CAVEATS:
        note += f" ({CAVEATS[table.key]})"
    return replace(table, rows=rows, note=note)
