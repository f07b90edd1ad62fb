"""What results.json says of the clients' local training over a whole run, written when it ends:
[`local_optimality`][fedhead.driver.local_summary.local_optimality] (did every client reach its local
optimum, per round) and [`local_steps`][fedhead.driver.local_summary.local_steps] (the epochs and
optimiser steps each client ran against the fixed recipe).
"""

from __future__ import annotations

import numpy as np

from fedhead.federation.local_fit import LOCAL_GAP_THRESHOLD
from fedhead.results.rounds import ClientMetric, RoundRecord
from fedhead.results.schema import LocalOptimality, LocalSteps
from fedhead.strategies.secure import SITES_AT_OPTIMUM, SITES_SUMMED


def local_optimality(records: list[RoundRecord]) -> LocalOptimality:
    """results.json's ``local_optimality``: did every client reach its local optimum, per round? (In secure
    mode as the sites report it of themselves, pass or fail: the gaps are null.)"""
    reported = [r for r in records if SITES_SUMMED in r.extra]
    if reported:
        short = [r.round for r in reported if (r.extra.get(SITES_AT_OPTIMUM) or 0) < (r.extra.get(SITES_SUMMED) or 0)]
        return LocalOptimality(
            threshold=LOCAL_GAP_THRESHOLD,
            rounds_above_threshold=short,
            last_round_max_trained_gap=None,
            last_round_max_objective_gap=None,
            reached=not short or short[-1] != reported[-1].round,
        )
    trained = [r for r in records if r.max_trained_gap is not None]
    above = [r.round for r in trained if r.max_trained_gap is not None and r.max_trained_gap > LOCAL_GAP_THRESHOLD]
    last = trained[-1] if trained else None
    max_objective_gap = None
    if last is not None:
        if last.objective_gaps is None:  # both come from the same LocalFit
            raise ValueError(f"round {last.round} has trained_gaps but no objective_gaps")
        max_objective_gap = float(max(last.objective_gaps))
    return LocalOptimality(
        threshold=LOCAL_GAP_THRESHOLD,
        rounds_above_threshold=above,
        last_round_max_trained_gap=None if last is None else last.max_trained_gap,
        last_round_max_objective_gap=max_objective_gap,
        reached=None if last is None else not above or above[-1] != last.round,
    )


def local_steps(records: list[RoundRecord], local_epochs: int, num_clients: int) -> LocalSteps | None:
    """results.json's ``local_steps``: each client's epochs and optimiser steps summed over the
    rounds, against the fixed recipe of ``local_epochs`` (E) epochs in each of its rounds.

    Parameters
    ----------
    records : list of RoundRecord
        The run's rounds; a client's round counts where ``client_metrics`` holds its reply
        (``partition-id``, ``local_epochs``, ``n_steps``).
    local_epochs : int
        E, the cap ``local_epochs=``.
    num_clients : int
        M; the lists have one entry per partition ``0..M-1``.

    Returns
    -------
    LocalSteps or None
        None when no round holds a client's reply (a diagnosis, a run that failed before round 1).
        A client's steps per epoch is ``n_steps / local_epochs`` of a round where it ran an epoch
        (the trainer's ``ceil(N_m / batch size)``); without such a round its fixed steps are None.
    """
    pid_key, epochs_key, steps_key = (
        ClientMetric.PARTITION_ID.name,
        ClientMetric.LOCAL_EPOCHS.name,
        ClientMetric.N_STEPS.name,
    )
    rounds, epochs, steps = np.zeros(num_clients, int), np.zeros(num_clients, int), np.zeros(num_clients, int)
    per_epoch: list[int | None] = [None] * num_clients
    for rec in records:
        for i, cm in enumerate(rec.client_metrics):
            if epochs_key not in cm or steps_key not in cm:
                continue
            m = int(cm.get(pid_key, i))
            e, k = int(cm[epochs_key]), int(cm[steps_key])
            rounds[m] += 1
            epochs[m] += e
            steps[m] += k
            if e > 0 and per_epoch[m] is None:
                per_epoch[m] = round(k / e)
    if not rounds.any():
        return None
    fixed_epochs = [int(local_epochs * t) for t in rounds]
    fixed_steps = [None if s is None else f * s for f, s in zip(fixed_epochs, per_epoch)]
    ratios = [None if not f or not k else f / int(k) for f, k in zip(fixed_steps, steps)]
    defined = [r for r in ratios if r is not None]
    return LocalSteps(
        local_epochs=int(local_epochs),
        rounds=rounds.tolist(),
        epochs=epochs.tolist(),
        steps=steps.tolist(),
        fixed_epochs=fixed_epochs,
        fixed_steps=fixed_steps,
        ratios=ratios,
        median_ratio=float(np.median(defined)) if defined else None,
    )
