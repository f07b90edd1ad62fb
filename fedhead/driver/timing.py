"""Where a federation's wall time went: [`timing_summary`][fedhead.driver.timing.timing_summary] builds results.json's
``timing``."""

from __future__ import annotations

from collections.abc import Sequence

from fedhead.federation.progress_grid import ProgressGrid
from fedhead.results.rounds import ClientMetric, RoundRecord
from fedhead.results.schema import Timing

__all__ = ["timing_summary"]


def timing_summary(records: Sequence[RoundRecord], pgrid: ProgressGrid | None, t_sim: float, t_end: float) -> Timing:
    """Wall-time split of a run (used by benchmarks/bench_overhead.py).

    Parameters
    ----------
    records : sequence of RoundRecord
        The run's rounds (round 0 is skipped).
    pgrid : ProgressGrid or None
        The grid that timed the message phases (None: the run failed before it existed).
    t_sim, t_end : float
        ``time.perf_counter()`` at the procedure's start and end.

    Returns
    -------
    Timing
        ``phase_seconds`` sums the message phases by type; ``phases`` lists every phase in order
        as ``[type, seconds]``; ``round_train_seconds[t - 1]`` is the clients' summed
        training-loop time of round ``t``, ``round_local_seconds[t - 1]`` their summed local
        computation (the whole ``train_local``: set-up, epochs and finishing step).
    """
    rounds = [r for r in records if r.round >= 1]
    per_round = [
        sum(float(cm.get(ClientMetric.TRAIN_SECONDS.name, 0.0)) for cm in rec.client_metrics) for rec in rounds
    ]
    per_round_local = [
        sum(float(cm.get(ClientMetric.LOCAL_SECONDS.name, 0.0)) for cm in rec.client_metrics) for rec in rounds
    ]
    phases: dict[str, float] = {}
    first_phase = None
    listed = pgrid.phases if pgrid is not None else []
    for kind, start, secs in listed:
        phases[kind] = phases.get(kind, 0.0) + secs
        first_phase = start if first_phase is None else min(first_phase, start)
    return Timing(
        simulation_seconds=t_end - t_sim,
        startup_seconds=(first_phase - t_sim) if first_phase is not None else None,
        phase_seconds=phases,
        phases=[[kind, secs] for kind, _, secs in listed],
        client_train_seconds=sum(per_round),
        round_train_seconds=per_round,
        client_local_seconds=sum(per_round_local),
        round_local_seconds=per_round_local,
    )
