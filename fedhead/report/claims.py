"""Verdicts on the paper's claims about the network experiments (pure machinery).

A [`Claim`][fedhead.report.claims.Claim] has a check: a function of the runs of its sweeps
([`Evidence`][fedhead.report.claims.Evidence]) returning a verdict or what is missing;
[`evaluate`][fedhead.report.claims.evaluate] turns it into the final verdict. The helpers at the
end are the vocabulary the checks are written in.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fedhead.report import measures
from fedhead.report.collect import Collection, RunEntry, RunRef
from fedhead.report.tables import Table, fmt, paired, procedure_label

#: The largest last-round trained gap of a client that counts as "reached its local optimum"
OPTIMUM_GAP = 1e-3
#: Proximal weights above this are not judged by the (unpenalised) gap
RHO_JUDGED_BY_GAP = 1e-3

HOLDS, FAILS, NOT_TESTABLE, NOT_MEASURED = "holds", "does not hold", "not testable", "not measured"
VERDICTS = (HOLDS, FAILS, NOT_TESTABLE, NOT_MEASURED)


@dataclass(frozen=True)
class Verdict:
    """A verdict: one of [`VERDICTS`][fedhead.report.claims.VERDICTS], the numbers (one line) and the runs behind
    them."""

    status: str
    detail: str
    runs: tuple[RunRef, ...] = ()


@dataclass(frozen=True)
class Missing:
    """The runs given to a checker do not measure what the claim needs (``why``)."""

    why: str


@dataclass(frozen=True)
class Evidence:
    """What a checker sees: the runs and the report tables built from exactly these runs."""

    runs: Sequence[RunEntry]
    tables: dict[str, Table] = field(default_factory=dict)

    def of(self, *sweeps: str, procedure: str | None = None) -> list[RunEntry]:
        """The runs of ``sweeps`` (all when none given), of ``procedure`` when given."""
        return [
            r
            for r in self.runs
            if (not sweeps or r.sweep in sweeps) and (procedure is None or procedure_label(r) == procedure)
        ]


Check = Callable[[Evidence], "Verdict | Missing"]


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims.

    Attributes
    ----------
    id : str
        ``C1`` ... ``C32`` (the paper's numbering).
    text : str
        A short paraphrase, with the paper's numbers.
    tables : tuple of int
        The paper tables it concerns (empty: a figure or text only).
    sweeps : tuple of str
        The ``fedhead-sweep`` sweeps whose runs it reads (and that fill it).
    criterion : str
        What the checker tests, in words.
    check : callable or None
        ``Evidence -> Verdict | Missing``; None when the report cannot check the claim
        (``unchecked`` says why).
    unchecked : str
    needs_optima : bool
        False for a claim about the data, not the training (the fully active condition).
    """

    id: str
    text: str
    tables: tuple[int, ...]
    sweeps: tuple[str, ...]
    criterion: str
    check: Check | None = None
    unchecked: str = ""
    needs_optima: bool = True


# ------------------------------------------------------------------------------ local optima
def last_gap(run: RunEntry) -> float | None:
    """The last round's largest trained gap of the run's clients (None when not recorded)."""
    res = run.counted_results
    lo = getattr(res, "local_optimality", None)
    gap = measures.num(getattr(lo, "last_round_max_trained_gap", None)) if lo is not None else None
    if gap is not None:
        return gap
    last = measures.last_round(res)
    gap = measures.num(last.max_trained_gap)
    if gap is not None:
        return gap
    gaps = [g for g in (measures.num(x) for x in (last.trained_gaps or last.objective_gaps or [])) if g is not None]
    return max(gaps) if gaps else None


def stopped_early(run: RunEntry) -> bool:
    """True when the run's clients did not reach their local optima at the last round (gap above
    [`OPTIMUM_GAP`][fedhead.report.claims.OPTIMUM_GAP]; runs with ``rho > 1e-3`` and runs without a recorded gap are not
    judged)."""
    rho = measures.num(measures.param(run.counted_results, run.params, "rho"))
    if rho is not None and rho > RHO_JUDGED_BY_GAP:
        return False
    gap = last_gap(run)
    return gap is not None and gap > OPTIMUM_GAP


# ------------------------------------------------------------------------------ evaluation
def runs_text(refs: Sequence[RunRef], limit: int = 4) -> str:
    """``sweep_dir: run_dir, run_dir, ... and k more`` for the report (every run is in the CSV)."""
    if not refs:
        return "-"
    by_sweep: dict[str, list[str]] = {}
    for r in sorted(set(refs)):
        by_sweep.setdefault(r.sweep_dir, []).append(r.run_dir)
    parts = []
    for sweep_dir, dirs in by_sweep.items():
        shown = ", ".join(f"`{d}`" for d in dirs[:limit])
        more = f" and {len(dirs) - limit} more" if len(dirs) > limit else ""
        parts.append(f"`{sweep_dir}`: {shown}{more}")
    return "; ".join(parts)


def evaluate(
    claim: Claim, collection: Collection, tables_of: Callable[[Sequence[RunEntry]], dict[str, Table]]
) -> Verdict:
    """The claim's verdict on the counted runs of ``collection``.

    * ``not measured``: no counted run of the claim's sweeps, or the check finds nothing to measure
      on them (no test split, no corrected run, no run of a file-only data set, ...);
    * ``not testable``: the claim has no check (a UFM experiment: ``unchecked`` says why), or the
      measurement exists, but only on runs whose clients stopped before their local optima (the
      last round's largest trained gap above `OPTIMUM_GAP`): the numbers would measure the
      optimiser, not the theory;
    * ``holds`` / ``does not hold``: the check's verdict on the runs whose clients reached their
      optima (the runs left out, if any, are named in the verdict).

    Runs with a proximal weight ``rho > 1e-3`` are not judged by the gap: the recorded gap is of
    the original objective, which a proximal client with a large weight does not minimise by
    design (Table 5 measures exactly that). ``tables_of(runs)`` builds the report tables of a
    run subset (the check sees tables built from exactly the runs it judges)."""
    if claim.check is None:
        return Verdict(NOT_TESTABLE, claim.unchecked)
    runs = collection.of_sweep(*claim.sweeps)
    if not runs:
        sweeps = " or ".join(f"`{s}`" for s in claim.sweeps)
        return Verdict(NOT_MEASURED, f"no completed run of sweep {sweeps} (fedhead-sweep sweep={claim.sweeps[0]})")
    on_all = claim.check(Evidence(runs, tables_of(runs)))
    if isinstance(on_all, Missing):
        return Verdict(NOT_MEASURED, on_all.why)
    used = set(on_all.runs) or {r.ref for r in runs}
    stopped = [r for r in runs if r.ref in used and stopped_early(r)] if claim.needs_optima else []
    if not stopped:
        return on_all
    reached = [r for r in runs if not stopped_early(r)]
    worst = max(g for r in stopped if (g := last_gap(r)) is not None)
    why = (
        f"clients stopped at gap {fmt(worst)} > {fmt(OPTIMUM_GAP)} in {len(stopped)} of {len(used)} runs: "
        "the table measures the optimiser"
    )
    on_reached = claim.check(Evidence(reached, tables_of(reached))) if reached else Missing("")
    if isinstance(on_reached, Missing):
        return Verdict(
            NOT_TESTABLE,
            f"{why} (on all runs it would read: {on_all.status}; {on_all.detail})",
            tuple(sorted(r.ref for r in stopped)),
        )
    return Verdict(
        on_reached.status,
        f"{on_reached.detail} (on the {len(reached)} runs whose clients reached their optima; left out: {why})",
        on_reached.runs,
    )


# ------------------------------------------------------------------------------ checker helpers
def refs(*groups: Sequence[RunEntry]) -> tuple[RunRef, ...]:
    """The sorted refs of every run of ``groups``."""
    return tuple(sorted({r.ref for g in groups for r in g}))


def need(*groups: tuple[str, Sequence[RunEntry]]) -> Missing | None:
    """Missing when any named group of runs is empty (``(name, runs)`` pairs), else None."""
    absent = [name for name, runs in groups if not runs]
    return Missing("no " + " and no ".join(absent) + " runs") if absent else None


def verdict(ok: bool, detail: str, *groups: Sequence[RunEntry]) -> Verdict:
    """``holds`` when ``ok``, else ``does not hold``."""
    return Verdict(HOLDS if ok else FAILS, detail, refs(*groups))


def median(runs: Sequence[RunEntry], fn: Callable) -> float | None:
    """The median of ``fn(results)`` over ``runs`` (undefined values skipped; None when none)."""
    vals = [v for r in runs if (v := fn(r.counted_results)) is not None]
    return float(statistics.median(vals)) if vals else None


def final_value(name: str) -> Callable:
    """``results -> the last round's RoundRecord.<name>``."""
    return lambda res: measures.final(res, lambda t: getattr(t, name))


def round1_value(name: str) -> Callable:
    """``results -> round 1's RoundRecord.<name>``."""
    return lambda res: measures.first_round(res, lambda t: getattr(t, name))


def pair_wins(
    runs: Sequence[RunEntry], challenger: str, baseline: str, fn: Callable, name: Callable = procedure_label
) -> tuple[int, int, list[RunEntry]]:
    """``(pairs where the challenger's fn is lower, pairs with both defined, their runs)``."""
    pairs = [(a, b, fn(a.counted_results), fn(b.counted_results)) for a, b in paired(runs, challenger, baseline, name)]
    pairs = [(a, b, x, y) for a, b, x, y in pairs if x is not None and y is not None]
    return sum(1 for *_, x, y in pairs if x < y), len(pairs), [r for a, b, *_ in pairs for r in (a, b)]


def every(runs: Sequence[RunEntry], test: Callable) -> tuple[int, int]:
    """``(runs where test(results) is True, runs where it is defined)``."""
    out = [t for r in runs if (t := test(r.counted_results)) is not None]
    return sum(1 for t in out if t), len(out)


def closer(first: str, second: str) -> Callable:
    """``results -> final first < final second`` (None when either is undefined)."""

    def test(res):
        a, b = final_value(first)(res), final_value(second)(res)
        return None if a is None or b is None else a < b

    return test


def number_text(x: float | None) -> str:
    """A number for a verdict line (``-`` when undefined)."""
    return "-" if x is None else fmt(x)
