"""A typed :class:`fedhead.results.schema.Results` for tests of its pure readers (importable:
tests/ is on sys.path)."""

from __future__ import annotations

from fedhead.results.rounds import RoundRecord
from fedhead.results.schema import SCHEMA_VERSION, DatasetInfo, Results, Timing


def typed_results(*rounds: dict) -> Results:
    """A completed :class:`Results` whose round ``t`` has the fields and ``extra`` entries of
    ``rounds[t]`` (every other round field ``None``; for the pure measures)."""
    records = [
        RoundRecord(
            round=t,
            gram=None,
            bias=None,
            e_f_star=None,
            e_f_cen=None,
            e_f_within=None,
            d_star=None,
            d_cen=None,
            d_within=None,
            e_f_reference=None,
            recursion_gram=None,
            e_f_recursion=None,
            trajectory_error=None,
            predicted_gram=None,
        )
        for t in range(len(rounds))
    ]
    records = [RoundRecord.from_dict({**r.to_dict(), **extra}) for r, extra in zip(records, rounds)]
    return Results(
        schema_version=SCHEMA_VERSION,
        status="completed",
        procedure={"name": "ordinary", "gamma": 0.0},
        reference="star",
        config={},
        seeds={},
        git_revision="unknown",
        provenance={},
        dataset=DatasetInfo(name="hopper", num_clients=3),
        diagnosis=None,
        moments=None,
        targets=None,
        rounds=records,
        timing=Timing(),
    )
