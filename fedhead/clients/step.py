"""The client side of fedhead as a library: one function per message a fedhead strategy sends
([`moment_reply`][fedhead.clients.step.moment_reply], [`train_step`][fedhead.clients.step.train_step],
[`evaluate_step`][fedhead.clients.step.evaluate_step]). Each takes the message's content and the
client's own model and data and returns the reply's content; a user's ClientApp wraps it in
``Message(content, reply_to=msg)`` (docs/library.md), fedhead's own handlers call the same functions.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, MetricRecordValues, RecordDict
from torch import nn

from fedhead.clients.messages import ClientError, TrainingMessage, apply_shared_state, broadcast_head, shared_state
from fedhead.clients.moments import Moments, moment_reply, target_moments_of
from fedhead.federation import protocol
from fedhead.results.rounds import ClientMetric
from fedhead.settings.procedure import ProcedureConfig
from fedhead.train import (
    LocalMetrics,
    LocalProblem,
    TrainConfig,
    evaluate_local,
    exact_head,
    head_distances,
    round_seed,
    select_device,
    train_local,
)
from fedhead.train.align import align

__all__ = ["evaluate_step", "moment_reply", "train_step"]


def _check_problem(procedure: ProcedureConfig, problem: LocalProblem) -> None:
    """The problem must carry the procedure's correction and centring (the server acts on them)."""
    if problem.gamma != procedure.gamma or problem.center_targets != procedure.centered:
        raise ClientError(
            f"LocalProblem(gamma={problem.gamma}, center_targets={problem.center_targets}) is not procedure "
            f"{procedure.name} (gamma={procedure.gamma}, centered={procedure.centered}); build it with "
            "LocalProblem.from_procedure"
        )


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
    released_sigma: np.ndarray | None = None,
) -> RecordDict:
    """One round of local work on a training message's ``content``; returns the reply content.

    With ``procedure.exact`` the head is ``Pi_m(W_t)`` in closed form ([`exact_head`][fedhead.train.exact_head],
    no backbone); otherwise [`train_local`][fedhead.train.train_local] trains ``backbone`` and a head
    started at the broadcast ``(W_t, b_t)`` for ``problem`` with the recipe ``train``, then
    [`align`][fedhead.train.align.align] rotates the head to ``W_t`` when ``procedure.align``. Full-model
    averaging first loads the message's ``backbone`` record (BatchNorm statistics kept).

    Parameters
    ----------
    content : RecordDict
        The training message's content: ``head``, ``config`` (``server-round``), ``sigma_cen``
        when ``problem.gamma > 0``, ``backbone`` for full-model averaging.
    backbone : Backbone or None
        The client's private backbone ([`as_backbone`][fedhead.models.as_backbone] for a plain
        ``nn.Module``), trained in place; None only with ``procedure.exact``.
    x, y : Tensor or None, Tensor (N_m, C)
        Inputs the backbone takes (None only with ``procedure.exact``) and float32 targets.
    procedure, problem, train
        The procedure's switches (``exact``, ``align``, ``full_model``), the local problem
        ([`LocalProblem.from_procedure`][fedhead.train.LocalProblem.from_procedure]: its ``gamma``
        and centring must be the procedure's) and the local recipe.
    partition_id, seed : int
        The client's number and the run seed (the round's: [`round_seed`][fedhead.train.round_seed]).
    device : str or torch.device, optional
        Where to train ([`select_device`][fedhead.train.select_device]).
    moments, released_sigma : (ndarray (C,), ndarray (C, C)), ndarray (C, C), optional
        ``(mu_m, Sigma_m)`` of ``y`` when already computed; [`train_local`][fedhead.train.train_local]'s
        ``released_sigma_m`` (the site's own DP release).

    Returns
    -------
    RecordDict
        ``head`` (``weight (C, P)``, ``bias (C,)``), ``metrics`` (the
        [`ClientMetric`][fedhead.results.rounds.ClientMetric] names), ``checks`` (``trained_gram``)
        when aligned, ``backbone`` with full-model averaging. The caller may add scalar metrics.
    """
    pid = int(partition_id)
    _check_problem(procedure, problem)
    sent = TrainingMessage.read(content, problem.gamma, pid)
    mu, sigma = target_moments_of(y, moments)
    metrics: dict[str, MetricRecordValues] = {
        ClientMetric.NUM_EXAMPLES.name: int(y.shape[0]),
        ClientMetric.PARTITION_ID.name: pid,
        ClientMetric.SERVER_ROUND.name: sent.round,
    }
    reply = RecordDict()
    if procedure.exact:
        weight, bias, step_metrics = _exact_update(mu, sigma, sent, problem)
    else:
        if backbone is None or x is None:
            raise ClientError(f"partition {pid}: procedure {procedure.name} trains: it needs the backbone and x")
        if procedure.full_model:
            apply_shared_state(backbone, content.array_records.get(protocol.BACKBONE), pid)
        minibatch_seed = round_seed(seed, sent.round, pid)
        weight, bias, step_metrics, records = _trained_update(
            backbone, x, y, sent, procedure, problem, train, minibatch_seed, device, released_sigma
        )
        for name, record in records.items():
            reply[name] = record
    metrics.update(step_metrics)
    metrics.update(_distance_metrics(sigma, sent, weight, problem))
    reply[protocol.HEAD] = protocol.head_record(weight, bias)
    reply[protocol.METRICS] = MetricRecord(metrics)
    return reply


def _exact_update(
    mu: np.ndarray, sigma: np.ndarray, sent: TrainingMessage, problem: LocalProblem
) -> tuple[np.ndarray, np.ndarray, dict[str, MetricRecordValues]]:
    """The ``exact`` rule: ``Pi_m(W_t)`` in closed form, and its metrics."""
    t0 = time.perf_counter()
    weight, bias, gap, trained_gap = exact_head(
        mu,
        sigma,
        sent.weight,
        sent.sigma_cen,
        gamma=problem.gamma,
        centered=problem.center_targets,
        lambda_h=problem.lambda_h,
        lambda_w=problem.lambda_w,
    )
    metrics: dict[str, MetricRecordValues] = {
        ClientMetric.OBJECTIVE_GAP.name: float(gap),
        ClientMetric.TRAINED_GAP.name: float(trained_gap),
        ClientMetric.N_STEPS.name: 0,
        ClientMetric.LOCAL_EPOCHS.name: 0,
        ClientMetric.LOCAL_SECONDS.name: time.perf_counter() - t0,
    }
    return weight, bias, metrics


def _trained_update(
    backbone: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    sent: TrainingMessage,
    procedure: ProcedureConfig,
    problem: LocalProblem,
    train: TrainConfig,
    seed: int,
    device: str | torch.device | None,
    released_sigma: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, MetricRecordValues], dict[str, ArrayRecord]]:
    """Local training from the broadcast head, then alignment (``procedure.align``): the head, its
    metrics and the reply's extra records (``checks`` when aligned, ``backbone`` for full-model)."""
    head = nn.Linear(sent.weight.shape[1], sent.weight.shape[0])
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(sent.weight, dtype=torch.float32))
        head.bias.copy_(torch.as_tensor(sent.bias, dtype=torch.float32))
    t0 = time.perf_counter()
    result = train_local(
        backbone,
        head,
        x,
        y,
        train,
        problem,
        broadcast_weight=sent.weight,
        sigma_cen=sent.sigma_cen,
        released_sigma_m=released_sigma,
        device=select_device(device),
        seed=seed,
    )
    metrics = _training_metrics(result.metrics, local_seconds=time.perf_counter() - t0)
    weight, bias = result.weight, result.bias
    records: dict[str, ArrayRecord] = {}
    if procedure.align:
        trained_gram = weight @ weight.T
        aligned = align(head, backbone, sent.weight)
        weight, bias = aligned.weight, aligned.bias
        metrics[ClientMetric.ALIGN_DISTANCE_BEFORE.name] = float(aligned.distance_before)
        metrics[ClientMetric.ALIGN_DISTANCE_AFTER.name] = float(aligned.distance_after)
        gram = Array(np.asarray(trained_gram, dtype=np.float64))
        records[protocol.CHECKS] = ArrayRecord({protocol.TRAINED_GRAM: gram})
    if procedure.full_model:
        records[protocol.BACKBONE] = shared_state(backbone)
    return weight, bias, metrics, records


def _training_metrics(lm: LocalMetrics, *, local_seconds: float) -> dict[str, MetricRecordValues]:
    """The train reply's metrics of one local training (``local_seconds``: its wall time)."""
    return {
        ClientMetric.OBJECTIVE_GAP.name: float(lm.relative_gap),
        ClientMetric.TRAINED_GAP.name: float(lm.trained_gap),
        ClientMetric.OBJECTIVE.name: float(lm.objective),
        ClientMetric.OPTIMAL_OBJECTIVE.name: float(lm.optimal_objective),
        ClientMetric.LOCAL_TRAIN_MSE.name: float(lm.train_mse),
        ClientMetric.TRAIN_SECONDS.name: float(lm.seconds),
        ClientMetric.N_STEPS.name: int(lm.n_steps),
        ClientMetric.LOCAL_EPOCHS.name: int(lm.epochs),
        ClientMetric.LOCAL_SECONDS.name: local_seconds,
    }


def _distance_metrics(
    sigma: np.ndarray, sent: TrainingMessage, weight: np.ndarray, problem: LocalProblem
) -> dict[str, float]:
    """How far the returned head moved from the broadcast and from the client's selection."""
    dist = head_distances(
        sigma,
        sent.weight,
        weight,
        sent.sigma_cen,
        gamma=problem.gamma,
        lambda_h=problem.lambda_h,
        lambda_w=problem.lambda_w,
    )
    return {
        ClientMetric.DISTANCE_TO_BROADCAST.name: dist.to_broadcast,
        ClientMetric.DISTANCE_TO_SELECTION.name: dist.to_selection,
        ClientMetric.RELATIVE_DISTANCE_TO_SELECTION.name: dist.relative_to_selection,
    }


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
        As for [`train_step`][fedhead.clients.train_step] (``full_model``; penalties and centring: a
        centring client is evaluated on ``y - mu_m``).
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
    w, b = broadcast_head(content, pid)
    if procedure.full_model:
        apply_shared_state(backbone, content.array_records.get(protocol.BACKBONE), pid)
    dev = select_device(device)
    backbone.to(dev)
    offset = y.detach().cpu().double().mean(0).numpy() if problem.center_targets else None
    lh, lw = problem.lambda_h, problem.lambda_w
    ev = evaluate_local(backbone, (w, b), x, y, lambda_h=lh, lambda_w=lw, target_offset=offset, device=dev)
    metrics: dict[str, MetricRecordValues] = {
        protocol.NUM_EXAMPLES: int(y.shape[0]),
        protocol.PARTITION_ID: pid,
        protocol.TRAIN_MSE: float(ev.mse),
        protocol.SHARED_OBJECTIVE: float(ev.objective),
    }
    if test is not None and test[1].shape[0] > 0:
        et = evaluate_local(backbone, (w, b), *test, lambda_h=lh, lambda_w=lw, target_offset=offset, device=dev)
        metrics[protocol.TEST_MSE] = float(et.mse)
        metrics[protocol.NUM_TEST_EXAMPLES] = int(test[1].shape[0])
    return RecordDict({protocol.METRICS: MetricRecord(metrics)})
