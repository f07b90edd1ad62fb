"""The client side of fedhead as a library: one function per message a fedhead strategy sends.

Each takes the incoming message's content and the client's own model and data, and returns the
reply's content under the names of :mod:`fedhead.federation.protocol`; a user's own ClientApp
wraps it in ``Message(content, reply_to=msg)`` (docs/library.md). fedhead's own handlers
(:mod:`fedhead.clients.app`) call the same functions, so there is one implementation.

* :func:`moment_reply`: the ``query`` reply of the moment exchange, ``(N_m, mu_m, Sigma_m)``.
* :func:`train_step`: one round of local work (training with the procedure's terms, or the
  ``exact`` rule in closed form), optional alignment, and the train reply: head and metrics.
* :func:`evaluate_step`: the ``evaluate`` reply, the broadcast head's MSE with the client's backbone.

The backbone is a :class:`fedhead.models.Backbone` (a user's own ``nn.Module`` wrapped by
:func:`fedhead.models.as_backbone`); it is trained in place and stays with the client, which
keeps it between rounds as it likes.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from torch import nn

from fedhead.analysis.procedure import ProcedureConfig
from fedhead.clients.state import ClientError, apply_shared_state, round_of, shared_state, sigma_cen_of
from fedhead.federation import protocol as P
from fedhead.results.rounds import ClientMetric as CM
from fedhead.train import (
    LocalProblem,
    TrainConfig,
    align,
    evaluate_local,
    exact_head,
    head_distances,
    round_seed,
    select_device,
    target_moments,
    train_local,
)

__all__ = ["evaluate_step", "moment_reply", "train_step"]

#: ``(mu_m (C,), Sigma_m (C, C))`` of a client's training targets (:func:`fedhead.train.target_moments`).
Moments = tuple[np.ndarray, np.ndarray]


def _moments(y: torch.Tensor | np.ndarray, moments: Moments | None) -> Moments:
    if moments is not None:
        return moments
    y64 = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    return target_moments(y64.astype(np.float64))


def moment_reply(y: torch.Tensor | np.ndarray, partition_id: int, *, moments: Moments | None = None) -> RecordDict:
    """The reply content of the moment query: ``(N_m, mu_m, Sigma_m)`` of the training targets.

    Parameters
    ----------
    y : Tensor or ndarray (N_m, C)
        The client's training targets (only these O(C^2) numbers leave it).
    partition_id : int
        The client's number ``0..M-1`` (distinct per client, the same in every reply).
    moments : (ndarray (C,), ndarray (C, C)), optional
        ``(mu_m, Sigma_m)`` already computed from ``y`` (:func:`fedhead.train.target_moments`).

    Returns
    -------
    RecordDict
        ``moments`` ArrayRecord (``mean``, ``cov``) and ``metrics`` (``num-examples``, ``partition-id``).
    """
    mu, sigma = _moments(y, moments)
    return RecordDict(
        {
            P.MOMENTS: ArrayRecord({P.MEAN: Array(np.asarray(mu)), P.COV: Array(np.asarray(sigma))}),
            P.METRICS: MetricRecord({P.NUM_EXAMPLES: int(y.shape[0]), P.PARTITION_ID: int(partition_id)}),
        }
    )


def _check_problem(procedure: ProcedureConfig, problem: LocalProblem) -> None:
    """The problem must carry the procedure's correction and centring (the server acts on them)."""
    if problem.gamma != procedure.gamma or problem.center_targets != procedure.centered:
        raise ClientError(
            f"LocalProblem(gamma={problem.gamma}, center_targets={problem.center_targets}) is not procedure "
            f"{procedure.name} (gamma={procedure.gamma}, centered={procedure.centered}); build it with "
            "LocalProblem.from_procedure"
        )


def _broadcast_head(content: RecordDict, pid: int) -> tuple[np.ndarray, np.ndarray]:
    if P.HEAD not in content.array_records:
        raise ClientError(f"partition {pid}: the message carries no '{P.HEAD}' record")
    return P.read_head(content.array_records[P.HEAD])


def train_step(
    content: RecordDict,
    backbone: nn.Module | None,
    x: torch.Tensor | None,
    y: torch.Tensor,
    *,
    procedure: ProcedureConfig,
    problem: LocalProblem,
    train: TrainConfig,
    partition_id: int,
    seed: int = 0,
    device: str | torch.device | None = "auto",
    moments: Moments | None = None,
) -> RecordDict:
    """One round of local work on a training message's ``content``; returns the reply content.

    The broadcast head ``(W_t, b_t)`` initialises the local head; with ``procedure.exact`` the head
    is ``Pi_m(W_t)`` in closed form (:func:`fedhead.train.exact_head`, no backbone), otherwise
    :func:`fedhead.train.train_local` trains ``backbone`` and the head on ``(x, y)`` for
    ``problem`` (proximal ``rho`` to ``W_t``, correction ``gamma`` with the message's
    ``Sigma_cen``, centring) with the recipe ``train``, then :func:`fedhead.train.align` rotates
    the head to ``W_t`` when ``procedure.align``. Full-model averaging loads the message's
    ``backbone`` record (BatchNorm statistics kept) before training and returns the trained state.

    Parameters
    ----------
    content : RecordDict
        The training message's content: ``head``, ``config`` (``server-round``), ``sigma_cen``
        when ``problem.gamma > 0``, ``backbone`` for full-model averaging.
    backbone : Backbone or None
        The client's private backbone (:func:`fedhead.models.as_backbone` for a plain
        ``nn.Module``), trained in place; None only with ``procedure.exact``.
    x : Tensor or None
        Inputs ``(N_m, ...)`` the backbone takes; None only with ``procedure.exact``.
    y : Tensor (N_m, C)
        Training targets, float32.
    procedure : fedhead.analysis.procedure.ProcedureConfig
        Its switches ``exact``, ``align`` and ``full_model`` (``fedhead.federation.config.load_procedure``).
    problem : fedhead.train.LocalProblem
        Epochs, penalties, ``rho``, ``gamma``, centring (:meth:`LocalProblem.from_procedure`);
        ``gamma`` and centring must be the procedure's.
    train : fedhead.train.TrainConfig
        The local recipe.
    partition_id : int
        The client's number, reported in the metrics and part of the minibatch seed.
    seed : int
        The run seed; the round's seed is :func:`fedhead.train.round_seed` ``(seed, round, partition_id)``.
    device : str or torch.device, optional
        Where to train (:func:`fedhead.train.select_device`).
    moments : (ndarray (C,), ndarray (C, C)), optional
        ``(mu_m, Sigma_m)`` of ``y`` when already computed.

    Returns
    -------
    RecordDict
        ``head`` (``weight (C, P)``, ``bias (C,)``), ``metrics`` (the
        :class:`fedhead.results.rounds.ClientMetric` names: ``num-examples``, ``partition-id``,
        ``server-round``, ``objective_gap``, ``trained_gap``, ``local_epochs``, ...), ``checks``
        (``trained_gram``) when aligned, ``backbone`` with full-model averaging. The caller may
        add its own scalar metrics to ``metrics`` (they reach the server's round records).
    """
    pid = int(partition_id)
    _check_problem(procedure, problem)
    rnd = round_of(content)
    w_t, b_t = _broadcast_head(content, pid)
    sigma_cen = sigma_cen_of(content, problem.gamma, pid)
    mu, sigma = _moments(y, moments)
    lh, lw = problem.lambda_h, problem.lambda_w
    reply = RecordDict()
    metrics: dict[str, float | int] = {
        CM.NUM_EXAMPLES.name: int(y.shape[0]),
        CM.PARTITION_ID.name: pid,
        CM.SERVER_ROUND.name: rnd,
    }
    if procedure.exact:
        t0 = time.perf_counter()
        weight, bias, gap, trained_gap = exact_head(
            mu, sigma, w_t, sigma_cen, gamma=problem.gamma, centered=problem.center_targets, lambda_h=lh, lambda_w=lw
        )
        metrics.update(
            {
                CM.OBJECTIVE_GAP.name: float(gap),
                CM.TRAINED_GAP.name: float(trained_gap),
                CM.N_STEPS.name: 0,
                CM.LOCAL_EPOCHS.name: 0,
                CM.LOCAL_SECONDS.name: time.perf_counter() - t0,
            }
        )
    else:
        if backbone is None or x is None:
            raise ClientError(f"partition {pid}: procedure {procedure.name} trains: it needs the backbone and x")
        if procedure.full_model:
            apply_shared_state(backbone, content.array_records.get(P.BACKBONE), pid)
        head = nn.Linear(w_t.shape[1], w_t.shape[0])
        with torch.no_grad():
            head.weight.copy_(torch.as_tensor(w_t, dtype=torch.float32))
            head.bias.copy_(torch.as_tensor(b_t, dtype=torch.float32))
        t0 = time.perf_counter()
        result = train_local(
            backbone,
            head,
            x,
            y,
            train,
            problem,
            broadcast_weight=w_t,
            sigma_cen=sigma_cen,
            device=select_device(device),
            seed=round_seed(seed, rnd, pid),
        )
        local_seconds = time.perf_counter() - t0
        weight, bias, lm = result.weight, result.bias, result.metrics
        metrics.update(
            {
                CM.OBJECTIVE_GAP.name: float(lm.relative_gap),
                CM.TRAINED_GAP.name: float(lm.trained_gap),
                CM.OBJECTIVE.name: float(lm.objective),
                CM.OPTIMAL_OBJECTIVE.name: float(lm.optimal_objective),
                CM.LOCAL_TRAIN_MSE.name: float(lm.train_mse),
                CM.TRAIN_SECONDS.name: float(lm.seconds),
                CM.N_STEPS.name: int(lm.n_steps),
                CM.LOCAL_EPOCHS.name: int(lm.epochs),
                CM.LOCAL_SECONDS.name: local_seconds,
            }
        )
        if procedure.align:
            trained_gram = weight @ weight.T
            aligned = align(head, backbone, w_t)
            weight, bias = aligned.weight, aligned.bias
            metrics[CM.ALIGN_DISTANCE_BEFORE.name] = float(aligned.distance_before)
            metrics[CM.ALIGN_DISTANCE_AFTER.name] = float(aligned.distance_after)
            reply[P.CHECKS] = ArrayRecord({P.TRAINED_GRAM: Array(np.asarray(trained_gram, dtype=np.float64))})
        if procedure.full_model:
            reply[P.BACKBONE] = shared_state(backbone)
    dist = head_distances(sigma, w_t, weight, sigma_cen, gamma=problem.gamma, lambda_h=lh, lambda_w=lw)
    metrics[CM.DISTANCE_TO_BROADCAST.name] = dist.to_broadcast
    metrics[CM.DISTANCE_TO_SELECTION.name] = dist.to_selection
    metrics[CM.RELATIVE_DISTANCE_TO_SELECTION.name] = dist.relative_to_selection
    reply[P.HEAD] = P.head_record(weight, bias)
    reply[P.METRICS] = MetricRecord(metrics)
    return reply


def evaluate_step(
    content: RecordDict,
    backbone: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    procedure: ProcedureConfig,
    problem: LocalProblem,
    partition_id: int,
    test: tuple[torch.Tensor, torch.Tensor] | None = None,
    device: str | torch.device | None = "auto",
) -> RecordDict:
    """The evaluate reply: the broadcast head's MSE and objective with the client's own backbone.

    Parameters
    ----------
    content : RecordDict
        The evaluate message's content (``head``; ``backbone`` with full-model averaging).
    backbone : Backbone
        The client's backbone after its last training round (moved to ``device``).
    x, y : Tensor
        Training inputs and targets ``(N_m, C)``.
    procedure, problem
        As for :func:`train_step` (``full_model``; penalties and centring: a centring client is
        evaluated on ``y - mu_m``).
    partition_id : int
    test : (Tensor, Tensor), optional
        Held-out inputs and targets; adds ``test_mse`` and ``num-test-examples``.
    device : str or torch.device, optional

    Returns
    -------
    RecordDict
        ``metrics``: ``num-examples``, ``partition-id``, ``train_mse``, ``shared_objective``
        (+ ``test_mse``, ``num-test-examples``).
    """
    pid = int(partition_id)
    w, b = _broadcast_head(content, pid)
    if procedure.full_model:
        apply_shared_state(backbone, content.array_records.get(P.BACKBONE), pid)
    dev = select_device(device)
    backbone.to(dev)
    offset = y.detach().cpu().double().mean(0).numpy() if problem.center_targets else None
    lh, lw = problem.lambda_h, problem.lambda_w
    ev = evaluate_local(backbone, (w, b), x, y, lambda_h=lh, lambda_w=lw, target_offset=offset, device=dev)
    metrics: dict[str, float | int] = {
        P.NUM_EXAMPLES: int(y.shape[0]),
        P.PARTITION_ID: pid,
        P.TRAIN_MSE: float(ev.mse),
        P.SHARED_OBJECTIVE: float(ev.objective),
    }
    if test is not None and test[1].shape[0] > 0:
        et = evaluate_local(backbone, (w, b), *test, lambda_h=lh, lambda_w=lw, target_offset=offset, device=dev)
        metrics[P.TEST_MSE] = float(et.mse)
        metrics[P.NUM_TEST_EXAMPLES] = int(test[1].shape[0])
    return RecordDict({P.METRICS: MetricRecord(metrics)})
