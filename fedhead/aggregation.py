"""Pure server-side aggregation, reply validation, moment exchange and diagnosis (numpy only).

Everything the Flower strategies (``strategies/``) compute on the server is a function of this
module, so it can be tested with plain arrays. No torch, no flwr.

Conventions: float64; heads ``W`` ``(C, P)``, biases ``(C,)``; stacks over clients carry a
leading axis ``M``; Grams ``(C, C)``. Aggregation weights are ``p_m = N_m / N`` (SPEC 1).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedhead import metrics, ufm
from fedhead.metrics import direction_error, relative_error

#: Suffixes of BatchNorm buffers: client-private, never averaged (SPEC 1, full-model variant).
PRIVATE_STATE_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


class ReplyError(ValueError):
    """A client reply is malformed: the message names the node (and partition) and the field."""

    def __init__(self, node_id: int | str, what: str):
        self.node_id = node_id
        super().__init__(f"invalid reply from client node {node_id}: {what}")


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def validate_count(count: Any, *, node_id: int | str) -> int:
    """Check that a reported sample count ``N_m`` is a positive integer and return it."""
    try:
        value = float(count)
    except (TypeError, ValueError) as exc:
        raise ReplyError(node_id, f"sample count {count!r} is not a number") from exc
    if not np.isfinite(value) or value <= 0 or value != int(value):
        raise ReplyError(node_id, f"sample count must be a positive integer, got {count!r}")
    return int(value)


def validate_array(
    array: Any, shape: tuple[int, ...] | None, *, node_id: int | str, name: str
) -> np.ndarray:
    """Return ``array`` as float64 after checking its shape (if given) and finiteness."""
    arr = np.asarray(array, dtype=np.float64)
    if shape is not None and arr.shape != tuple(shape):
        raise ReplyError(node_id, f"{name} has shape {arr.shape}, expected {tuple(shape)}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ReplyError(node_id, f"{name} has {bad} non-finite entries (NaN/inf)")
    return arr


def validate_head(
    weight: Any,
    bias: Any,
    count: Any,
    *,
    node_id: int | str,
    shape: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray, int]:
    """Validate one uploaded head ``(W~_m (C,P), b~_m (C,), N_m)``; raise :class:`ReplyError`."""
    c, p = shape
    w = validate_array(weight, (c, p), node_id=node_id, name="head weight")
    b = validate_array(bias, (c,), node_id=node_id, name="head bias")
    return w, b, validate_count(count, node_id=node_id)


def validate_moments(
    count: Any, mean: Any, cov: Any, *, node_id: int | str, dim: int | None = None,
    tol: float = 1e-8,
) -> tuple[int, np.ndarray, np.ndarray]:
    """Validate one client's exchanged statistics ``(N_m, mu_m (C,), Sigma_m (C,C))``.

    ``Sigma_m`` must be symmetric and positive semi-definite up to ``tol`` (relative to its
    largest entry). Returns the values as ``(int, float64, float64)``.
    """
    n = validate_count(count, node_id=node_id)
    mu = validate_array(mean, None, node_id=node_id, name="target mean mu_m")
    if mu.ndim != 1:
        raise ReplyError(node_id, f"target mean mu_m must be a vector, got shape {mu.shape}")
    c = dim if dim is not None else mu.shape[0]
    if mu.shape != (c,):
        raise ReplyError(node_id, f"target mean mu_m has shape {mu.shape}, expected {(c,)}")
    sigma = validate_array(cov, (c, c), node_id=node_id, name="target covariance Sigma_m")
    scale = max(1.0, float(np.max(np.abs(sigma))))
    asym = float(np.max(np.abs(sigma - sigma.T)))
    if asym > tol * scale:
        raise ReplyError(node_id, f"target covariance Sigma_m is not symmetric (max |S - S^T| = {asym:.3g})")
    lam_min = float(np.linalg.eigvalsh(0.5 * (sigma + sigma.T))[0])
    if lam_min < -tol * scale:
        raise ReplyError(
            node_id, f"target covariance Sigma_m is not positive semi-definite (lambda_min = {lam_min:.3g})"
        )
    return n, mu, 0.5 * (sigma + sigma.T)


# --------------------------------------------------------------------------------------------
# averaging
# --------------------------------------------------------------------------------------------


def aggregation_weights(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    """``p_m = N_m / N`` for positive counts ``(M,)``."""
    n = np.asarray(counts, dtype=np.float64)
    if n.ndim != 1 or n.size == 0:
        raise ValueError(f"counts must be a non-empty vector, got shape {n.shape}")
    if np.any(~np.isfinite(n)) or np.any(n <= 0):
        raise ValueError(f"counts must be positive, got {n.tolist()}")
    return n / n.sum()


@dataclass(frozen=True)
class HeadAverage:
    """Result of head averaging: ``W = sum p_m W~_m`` ``(C,P)``, ``b = sum p_m b~_m`` ``(C,)``."""

    weight: np.ndarray
    bias: np.ndarray
    weights: np.ndarray  # p_m (M,)


def average_heads(
    weights: np.ndarray, biases: np.ndarray, counts: Sequence[int] | np.ndarray
) -> HeadAverage:
    """Average uploaded heads with weights ``N_m / N`` (SPEC 1).

    Parameters
    ----------
    weights : ndarray, shape (M, C, P)
        Uploaded head weights ``W~_m``.
    biases : ndarray, shape (M, C)
        Uploaded head biases ``b~_m``.
    counts : array_like, shape (M,)
        Sample counts ``N_m``.

    Returns
    -------
    HeadAverage
        ``(W_{t+1}, b_{t+1}) = sum_m p_m (W~_m, b~_m)`` and the weights ``p``.
    """
    w = np.asarray(weights, dtype=np.float64)
    b = np.asarray(biases, dtype=np.float64)
    p = aggregation_weights(counts)
    if w.ndim != 3 or b.ndim != 2 or w.shape[0] != p.size or b.shape[:2] != w.shape[:2]:
        raise ValueError(
            f"heads (M,C,P)={w.shape}, biases (M,C)={b.shape} and counts (M,)={p.shape} disagree"
        )
    return HeadAverage(np.einsum("m,mcp->cp", p, w), np.einsum("m,mc->c", p, b), p)


def is_private_state(name: str) -> bool:
    """True for BatchNorm running statistics, which never leave the client."""
    return name.endswith(PRIVATE_STATE_SUFFIXES)


def average_states(
    states: Sequence[Mapping[str, np.ndarray]],
    counts: Sequence[int] | np.ndarray,
    *,
    node_ids: Sequence[int | str] | None = None,
) -> dict[str, np.ndarray]:
    """Weighted average of full model states, excluding BatchNorm running statistics.

    Parameters
    ----------
    states : sequence of mappings name -> ndarray
        One state per client; every client must send the same names and shapes.
    counts : array_like, shape (M,)
        Sample counts ``N_m``; the weights are ``N_m / N``.
    node_ids : sequence, optional
        Client ids used in error messages.

    Returns
    -------
    dict
        ``name -> sum_m p_m state_m[name]`` (float64) for every shared (non-private) name.
    """
    p = aggregation_weights(counts)
    if len(states) != p.size:
        raise ValueError(f"{len(states)} states but {p.size} counts")
    ids = list(node_ids) if node_ids is not None else list(range(len(states)))
    names = sorted(k for k in states[0] if not is_private_state(k))
    out: dict[str, np.ndarray] = {}
    for k in names:
        out[k] = np.zeros(np.shape(states[0][k]), dtype=np.float64)
    for state, weight, node in zip(states, p, ids, strict=True):
        shared = sorted(k for k in state if not is_private_state(k))
        if shared != names:
            missing = sorted(set(names) - set(shared))
            extra = sorted(set(shared) - set(names))
            raise ReplyError(node, f"model state names differ from the first client's (missing {missing[:5]}, extra {extra[:5]})")
        for k in names:
            arr = validate_array(state[k], out[k].shape, node_id=node, name=f"model state {k!r}")
            out[k] += weight * arr
    return out


# --------------------------------------------------------------------------------------------
# moment exchange
# --------------------------------------------------------------------------------------------


def aggregate_moments(
    counts: Sequence[int],
    means: Sequence[np.ndarray],
    covs: Sequence[np.ndarray],
    *,
    node_ids: Sequence[int | str] | None = None,
) -> ufm.TargetMoments:
    """Build :class:`fedhead.ufm.TargetMoments` from the exchanged ``(N_m, mu_m, Sigma_m)``.

    Every client's statistics are validated first (:func:`validate_moments`); the weights are
    ``N_m / N`` so that ``Sigma_cen = (1/N) sum N_m (Sigma_m + mu_m mu_m^T) - mu_g mu_g^T``
    (SPEC 3).
    """
    ids = list(node_ids) if node_ids is not None else list(range(len(counts)))
    if not (len(counts) == len(means) == len(covs) == len(ids)) or len(counts) < 2:
        raise ValueError(
            f"moment exchange needs at least 2 clients with one (N, mu, Sigma) each; got "
            f"{len(counts)} counts, {len(means)} means, {len(covs)} covariances"
        )
    dim = int(np.asarray(means[0]).reshape(-1).shape[0])
    checked = [
        validate_moments(n, mu, s, node_id=i, dim=dim)
        for n, mu, s, i in zip(counts, means, covs, ids, strict=True)
    ]
    n = np.array([c[0] for c in checked], dtype=np.float64)
    mu = np.stack([c[1] for c in checked])
    sig = np.stack([c[2] for c in checked])
    return ufm.TargetMoments.from_stats(n, mu, sig)


def effective_covariances(moments: ufm.TargetMoments, gamma: float = 0.0) -> np.ndarray:
    """Covariances each client effectively fits: ``(1 - gamma) Sigma_m + gamma Sigma_cen`` (SPEC 8).

    Returns shape ``(M, C, C)``; ``gamma = 0`` gives the plain ``Sigma_m``.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"correction strength gamma must lie in [0, 1], got {gamma}")
    covs = np.asarray(moments.covs, dtype=np.float64)
    return (1.0 - gamma) * covs + gamma * np.asarray(moments.sigma_cen)[None]


# --------------------------------------------------------------------------------------------
# diagnosis (issue 5: before training)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Diagnosis:
    """What the theory predicts for a federation, from the exchanged statistics alone.

    Attributes
    ----------
    margins : ndarray (M,)
        ``lambda_min(Sigma_m) - lambda_H lambda_W``; positive means fully active (SPEC 3).
    threshold : float
        ``lambda_H lambda_W``.
    fully_active : bool
    rel_gap : float
        ``||G_cen - G_star||_F / ||G_cen||_F``.
    gap_trace : float
        ``Tr(G_cen - G_star) = Tr M_mu + Tr M_Sigma + Tr M_A`` (SPEC 7).
    share_mu, share_sigma, share_a : float
        ``Tr M_x / Tr(G_cen - G_star)`` (0 when the gap vanishes).
    trace_mu, trace_sigma, trace_a : float
    bw_variance : float
        ``sum_m p_m d_BW^2(G_star, G_m) = Tr M_A``.
    recommendation : str
        One line drawn from the numbers above.
    """

    margins: np.ndarray
    threshold: float
    fully_active: bool
    rel_gap: float
    gap_trace: float
    trace_mu: float
    trace_sigma: float
    trace_a: float
    share_mu: float
    share_sigma: float
    share_a: float
    bw_variance: float
    recommendation: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (undefined, i.e. NaN, quantities become ``None``)."""

        def num(x: float) -> float | None:
            return float(x) if np.isfinite(x) else None

        return {
            "margins": self.margins.tolist(),
            "threshold": self.threshold,
            "fully_active": self.fully_active,
            "rel_gap": num(self.rel_gap),
            "gap_trace": num(self.gap_trace),
            "trace_m_mu": num(self.trace_mu),
            "trace_m_sigma": num(self.trace_sigma),
            "trace_m_a": num(self.trace_a),
            "share_m_mu": num(self.share_mu),
            "share_m_sigma": num(self.share_sigma),
            "share_m_a": num(self.share_a),
            "bw_variance": num(self.bw_variance),
            "recommendation": self.recommendation,
        }

    def format(self) -> str:
        """A few human-readable lines (console, log, TensorBoard text)."""
        margins = ", ".join(f"{m:.4g}" for m in self.margins)
        return "\n".join(
            [
                f"fully active margins lambda_min(Sigma_m) - lH*lW (threshold {self.threshold:.3g}): [{margins}]",
                f"relative gap ||G_cen - G_star||_F / ||G_cen||_F = {self.rel_gap:.4g}",
                f"Tr(G_cen - G_star) = {self.gap_trace:.4g}: mean term M_mu {100 * self.share_mu:.1f}%, "
                f"covariance term M_Sigma {100 * self.share_sigma:.1f}%, "
                f"alignment term M_A {100 * self.share_a:.1f}%",
                f"BW variance sum p_m d_BW^2(G_star, G_m) = {self.bw_variance:.4g}",
                f"recommendation: {self.recommendation}",
            ]
        )


def fully_active_margins(moments: ufm.TargetMoments, lambda_h: float, lambda_w: float) -> np.ndarray:
    """``lambda_min(Sigma_m) - lambda_H lambda_W`` per client, shape ``(M,)`` (SPEC 3)."""
    covs = np.asarray(moments.covs, dtype=np.float64)
    mins = np.linalg.eigvalsh(0.5 * (covs + np.swapaxes(covs, -1, -2)))[..., 0]
    return mins - lambda_h * lambda_w


def recommend(
    fully_active: bool, margins: np.ndarray, rel_gap: float, shares: tuple[float, float, float],
    *, small_gap: float = 1e-2,
) -> str:
    """One-line advice from the margins, the relative gap and the three trace shares."""
    if not fully_active:
        worst = int(np.argmin(margins))
        return (
            f"client {worst} is outside the fully active regime (margin {margins[worst]:.3g}): "
            "the closed forms do not hold; lower lambda_h * lambda_w or rescale its targets"
        )
    if rel_gap < small_gap:
        return (
            f"the federation is nearly homogeneous (relative gap {rel_gap:.2g}): proximal head "
            "averaging already ends close to centralised training"
        )
    s_mu, s_sig, s_a = shares
    top = int(np.argmax(shares))
    if top == 0:
        return (
            f"the mean term dominates ({100 * s_mu:.0f}% of the gap), so the moment correction or "
            "client-wise centring will close most of the gap"
        )
    if top == 1:
        return (
            f"the covariance term dominates ({100 * s_sig:.0f}% of the gap): use the moment "
            "correction (corrected_proximal); client-wise centring alone will not close it"
        )
    return (
        f"the alignment term dominates ({100 * s_a:.0f}% of the gap, client optima differ by "
        "rotation): only the moment correction (corrected_proximal) reaches G_cen"
    )


def diagnose(moments: ufm.TargetMoments, lambda_h: float, lambda_w: float) -> tuple[Diagnosis, Any]:
    """Diagnose a federation before training (issue 5) from its moments alone.

    Returns the :class:`Diagnosis` and the :class:`fedhead.ufm.GapDecomposition` it came from
    (``g_star, g_cen, g_within, grams, m_mu, m_sigma, m_a, ...``; SPEC 7). Outside the fully
    active regime the closed forms do not hold: the margins and the recommendation are still
    reported (with a warning), the gap quantities are NaN and the decomposition is None.
    """
    margins = fully_active_margins(moments, lambda_h, lambda_w)
    fully_active = bool(np.all(margins > 0))
    nan = float("nan")
    if not fully_active:
        warnings.warn(
            f"clients {np.flatnonzero(margins <= 0).tolist()} violate the fully active condition "
            f"lambda_min(Sigma_m) > lambda_H lambda_W = {lambda_h * lambda_w:.3g} "
            f"(margins {margins.tolist()})",
            stacklevel=2,
        )
        diag = Diagnosis(
            margins=margins, threshold=float(lambda_h * lambda_w), fully_active=False,
            rel_gap=nan, gap_trace=nan, trace_mu=nan, trace_sigma=nan, trace_a=nan,
            share_mu=nan, share_sigma=nan, share_a=nan, bw_variance=nan,
            recommendation=recommend(False, margins, nan, (nan, nan, nan)),
        )
        return diag, None
    gap = ufm.gap_decomposition(moments, lambda_h, lambda_w)
    rel_gap = float(gap.rel_gap)
    t_mu, t_sig, t_a = (float(t) for t in gap.traces)
    total = t_mu + t_sig + t_a
    shares = tuple(float(s) for s in gap.trace_shares)
    diag = Diagnosis(
        margins=margins,
        threshold=float(lambda_h * lambda_w),
        fully_active=True,
        rel_gap=rel_gap,
        gap_trace=total,
        trace_mu=t_mu,
        trace_sigma=t_sig,
        trace_a=t_a,
        share_mu=shares[0],
        share_sigma=shares[1],
        share_a=shares[2],
        bw_variance=float(gap.bw_variance),
        recommendation=recommend(True, margins, rel_gap, shares),
    )
    return diag, gap


# --------------------------------------------------------------------------------------------
# reference targets and per-round server measurements (SPEC 11)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """Reference Grams of a run, from training-target moments, weights and penalties only.

    ``client_grams`` ``(M,C,C)`` are the optimal Grams the procedure's clients fit
    (``phi(Sigma_m)``, or ``phi((1-gamma) Sigma_m + gamma Sigma_cen)`` when corrected); the
    exact recursion and the selection distance use them. ``reference`` names the endpoint the
    procedure should reach (``"star"``, ``"cen"`` or ``"within"``).

    Outside the fully active regime (``fully_active=False``, only with the explicit
    ``dataset.allow_outside_regime=true`` override) ``phi`` is the PSD minimiser with clipped
    eigenvalues, so ``g_cen``, ``g_within``, ``grams`` and ``client_grams`` are still the
    optimal Grams of their objectives, but the barycenter theory of SPEC 5-7 does not hold:
    ``g_star`` is ``None`` and so is everything derived from it or from the recursion.
    """

    g_star: np.ndarray | None
    g_cen: np.ndarray
    g_within: np.ndarray
    grams: np.ndarray  # phi(Sigma_m), (M, C, C)
    client_grams: np.ndarray  # what the procedure's clients fit, (M, C, C)
    weights: np.ndarray  # p_m (M,)
    reference: str
    fully_active: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "g_star": None if self.g_star is None else self.g_star.tolist(),
            "g_cen": self.g_cen.tolist(),
            "g_within": self.g_within.tolist(),
            "grams": self.grams.tolist(),
            "client_grams": self.client_grams.tolist(),
            "weights": self.weights.tolist(),
            "reference": self.reference,
            "fully_active": self.fully_active,
        }

    @property
    def reference_gram(self) -> np.ndarray | None:
        """The Gram named by :attr:`reference` (``None`` when it is undefined)."""
        return {"star": self.g_star, "cen": self.g_cen, "within": self.g_within}[self.reference]


def _reference_name(gamma: float, centered: bool) -> str:
    if centered:
        return "within"
    return "cen" if gamma > 0 else "star"


def reference_targets(
    moments: ufm.TargetMoments, gap: Any, lambda_h: float, lambda_w: float, *,
    gamma: float = 0.0, centered: bool = False,
) -> Targets:
    """Collect the reference Grams for a procedure (correction strength ``gamma``, centring).

    ``gap`` is the :class:`fedhead.ufm.GapDecomposition` of the federation (fully active
    regime); pass ``gap=None`` outside the regime to get the partial targets described in
    :class:`Targets` (``g_star=None``; ``g_cen``, ``g_within`` and the client Grams as the PSD
    minimisers ``phi`` with clipped eigenvalues).
    """
    client_grams = ufm.optimal_gram(effective_covariances(moments, gamma), lambda_h, lambda_w)
    if gap is None:
        g_star = None
        g_cen = ufm.optimal_gram(moments.sigma_cen, lambda_h, lambda_w)
        g_within = ufm.optimal_gram(moments.sigma_within, lambda_h, lambda_w)
        grams = ufm.optimal_gram(moments.covs, lambda_h, lambda_w)
    else:
        g_star, g_cen, g_within, grams = gap.g_star, gap.g_cen, gap.g_within, gap.grams
    return Targets(
        g_star=None if g_star is None else np.asarray(g_star, dtype=np.float64),
        g_cen=np.asarray(g_cen, dtype=np.float64),
        g_within=np.asarray(g_within, dtype=np.float64),
        grams=np.asarray(grams, dtype=np.float64),
        client_grams=np.asarray(client_grams, dtype=np.float64),
        weights=np.asarray(moments.weights, dtype=np.float64),
        reference=_reference_name(gamma, centered),
        fully_active=gap is not None,
    )


def selected_heads(broadcast: np.ndarray, client_grams: np.ndarray) -> np.ndarray:
    """``Pi_m(W_t)`` for every client, shape ``(M, C, P)`` (SPEC 5)."""
    w = np.asarray(broadcast, dtype=np.float64)
    return np.stack([ufm.closest_head(w, g) for g in np.asarray(client_grams)])


def selection_distance(heads: np.ndarray, broadcast: np.ndarray, client_grams: np.ndarray,
                       weights: np.ndarray) -> float:
    """``delta_t = sum_m p_m ||W~_{m,t} - Pi_m(W_t)||_F`` (SPEC 11); heads ``(M,C,P)``."""
    return metrics.selection_distance(heads, selected_heads(broadcast, client_grams), weights)


#: Relative local objective gap above which the theory's references (which assume every client
#: at its local optimum) are not yet meaningful for a round.
LOCAL_GAP_THRESHOLD = 1e-2


@dataclass(frozen=True)
class LocalFit:
    """How close each client's local training came to its optimum in one round (SPEC 11 local fit).

    Attributes
    ----------
    objective_gaps : list of float
        ``(L_m - L*_m) / L*_m`` per client (partition order), the original objective.
    trained_gaps : list of float
        The same for the objective each client minimised (``L_m + gamma C_m``; equal to
        ``objective_gaps`` without correction). For corrected clients this is the one that says
        whether local training converged: ``L_m`` is not minimised there.
    local_epochs : list of int
        Epochs each client ran (fewer than ``E`` when it stopped at ``local_tol``).
    """

    objective_gaps: list[float]
    trained_gaps: list[float]
    local_epochs: list[int]

    @property
    def max_trained_gap(self) -> float:
        return max(self.trained_gaps)

    def converged(self, threshold: float = LOCAL_GAP_THRESHOLD) -> bool:
        """True when every client's trained-objective gap is at most ``threshold``."""
        return self.max_trained_gap <= threshold


def local_fit(metrics: Sequence[Mapping[str, Any]], node_ids: Sequence[int | str]) -> LocalFit:
    """Read and validate the local-fit metrics of the training replies (one per client, in order).

    Each reply must carry finite ``objective_gap`` and ``trained_gap`` (>= -1e-6: a model
    cannot beat the optimum by more than rounding) and a ``local_epochs`` count >= 0.
    """
    gaps, trained, epochs = [], [], []
    for m, node in zip(metrics, node_ids, strict=True):
        for key in ("objective_gap", "trained_gap", "local_epochs"):
            if key not in m:
                raise ReplyError(node, f"training reply lacks the metric '{key}'")
        for key, out in (("objective_gap", gaps), ("trained_gap", trained)):
            v = float(validate_array(m[key], (), node_id=node, name=key))
            if v < -1e-6:
                raise ReplyError(node, f"{key} = {v:.3g} is below zero: the model beats its closed-form optimum")
            out.append(v)
        e = m["local_epochs"]
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)) or e < 0:
            raise ReplyError(node, f"local_epochs must be an integer >= 0, got {e!r}")
        epochs.append(int(e))
    return LocalFit(objective_gaps=gaps, trained_gaps=trained, local_epochs=epochs)


@dataclass
class RoundRecord:
    """Server measurements after round ``t`` (issue 5, SPEC 11); JSON-ready via :meth:`to_dict`.

    ``gram`` is ``G_t = W_t W_t^T`` of the aggregated head after round ``t`` (round 0: the
    initial head). ``predicted_gram`` is the exact recursion's prediction for the *next* round,
    ``S(G_t)`` applied to this round's measured Gram. ``trajectory_error`` is the median over
    rounds 1..t of ``e_F(G_s, recursion from the run's own G_0)``. Quantities that need
    ``G_star`` or the recursion are ``None`` outside the fully active regime (see
    :class:`Targets`).
    """

    round: int
    gram: np.ndarray
    bias: np.ndarray
    e_f_star: float | None
    e_f_cen: float | None
    e_f_within: float | None
    d_star: float | None
    d_cen: float | None
    d_within: float | None
    e_f_reference: float | None
    recursion_gram: np.ndarray | None
    e_f_recursion: float | None
    trajectory_error: float | None
    predicted_gram: np.ndarray | None
    delta: float | None = None
    objective_gaps: list[float] | None = None
    trained_gaps: list[float] | None = None
    local_epochs: list[int] | None = None
    train_mse: float | None = None
    test_mse: float | None = None
    client_metrics: list[dict[str, float]] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)

    _SCALARS = ("e_f_star", "e_f_cen", "e_f_within", "d_star", "d_cen", "d_within", "e_f_reference",
                "e_f_recursion", "trajectory_error", "delta", "train_mse", "test_mse")

    def scalars(self) -> dict[str, float]:
        """Every defined scalar of the record (for TensorBoard and progress lines)."""
        out = {k: float(getattr(self, k)) for k in self._SCALARS if getattr(self, k) is not None}
        if self.objective_gaps:
            for i, g in enumerate(self.objective_gaps):
                out[f"objective_gap/client_{i}"] = float(g)
        if self.trained_gaps:
            out["max_trained_gap"] = float(max(self.trained_gaps))
        out.update({k: float(v) for k, v in self.extra.items()})
        return out

    def to_dict(self) -> dict[str, Any]:
        def mat(x: np.ndarray | None) -> list | None:
            return None if x is None else x.tolist()

        return {
            "round": self.round,
            "gram": self.gram.tolist(),
            "bias": self.bias.tolist(),
            "e_f_star": self.e_f_star,
            "e_f_cen": self.e_f_cen,
            "e_f_within": self.e_f_within,
            "d_star": self.d_star,
            "d_cen": self.d_cen,
            "d_within": self.d_within,
            "e_f_reference": self.e_f_reference,
            "recursion_gram": mat(self.recursion_gram),
            "e_f_recursion": self.e_f_recursion,
            "trajectory_error": self.trajectory_error,
            "delta": self.delta,
            "objective_gaps": self.objective_gaps,
            "trained_gaps": self.trained_gaps,
            "local_epochs": self.local_epochs,
            "local_optimum_reached": (None if not self.trained_gaps
                                      else bool(max(self.trained_gaps) <= LOCAL_GAP_THRESHOLD)),
            "train_mse": self.train_mse,
            "test_mse": self.test_mse,
            "predicted_gram": mat(self.predicted_gram),
            "client_metrics": self.client_metrics,
            **{k: float(v) for k, v in self.extra.items()},
        }


class RoundTracker:
    """Accumulates the per-round server measurements of one run (pure numpy state).

    Call :meth:`start` with the initial head, then :meth:`record` after every aggregation.
    The exact recursion (SPEC 6) is run alongside from the run's own ``G_0`` (fully active
    regime only; outside it the recursion, ``G_star`` and the selection distance are ``None``).
    """

    def __init__(self, targets: Targets):
        self.targets = targets
        self.records: list[RoundRecord] = []
        self._recursion: list[np.ndarray] = []

    @property
    def theory(self) -> bool:
        """True when the SPEC 5-7 quantities (G_star, recursion, selection) are defined."""
        return self.targets.fully_active and self.targets.g_star is not None

    def _measure(self, t: int, weight: np.ndarray, bias: np.ndarray, **kw: Any) -> RoundRecord:
        tg = self.targets
        g = np.asarray(weight, dtype=np.float64) @ np.asarray(weight, dtype=np.float64).T
        g = 0.5 * (g + g.T)
        ref = tg.reference_gram

        def err(fn, ref_g):  # undefined (None) for a missing or zero reference Gram
            return None if ref_g is None or not np.any(ref_g) else fn(g, ref_g)

        rec_g = pred = traj = e_rec = None
        if self.theory:
            rec_g = self._recursion[t]
            e_rec = relative_error(g, rec_g)
            pred = ufm.gram_step(g, tg.client_grams, tg.weights)
            if t >= 1:
                errs = [relative_error(r.gram, self._recursion[r.round]) for r in self.records[1:]]
                errs.append(e_rec)
                traj = float(np.median(errs))
        return RoundRecord(
            round=t, gram=g, bias=np.asarray(bias, dtype=np.float64),
            e_f_star=err(relative_error, tg.g_star), e_f_cen=err(relative_error, tg.g_cen),
            e_f_within=err(relative_error, tg.g_within),
            d_star=err(direction_error, tg.g_star), d_cen=err(direction_error, tg.g_cen),
            d_within=err(direction_error, tg.g_within), e_f_reference=err(relative_error, ref),
            recursion_gram=rec_g, e_f_recursion=e_rec, trajectory_error=traj,
            predicted_gram=pred, **kw,
        )

    def start(self, weight: np.ndarray, bias: np.ndarray) -> RoundRecord:
        """Record round 0 (the initial broadcast head)."""
        g0 = np.asarray(weight, dtype=np.float64) @ np.asarray(weight, dtype=np.float64).T
        self._recursion = [0.5 * (g0 + g0.T)]
        self.records = []
        rec = self._measure(0, weight, bias)
        self.records.append(rec)
        return rec

    def record(
        self, t: int, weight: np.ndarray, bias: np.ndarray, *, broadcast: np.ndarray,
        client_heads: np.ndarray, fit: LocalFit | None = None,
        client_metrics: Sequence[Mapping[str, float]] | None = None,
        extra: Mapping[str, float] | None = None,
    ) -> RoundRecord:
        """Measure round ``t`` (>= 1): aggregated head, the broadcast it came from, client heads."""
        if not self.records:
            raise RuntimeError("RoundTracker.start must be called with the initial head first")
        if t != self.records[-1].round + 1:
            raise ValueError(f"round {t} recorded after round {self.records[-1].round}")
        tg = self.targets
        delta = None
        if self.theory:
            while len(self._recursion) <= t:
                self._recursion.append(ufm.gram_step(self._recursion[-1], tg.client_grams, tg.weights))
            delta = selection_distance(client_heads, broadcast, tg.client_grams, tg.weights)
        rec = self._measure(
            t, weight, bias, delta=delta,
            objective_gaps=None if fit is None else list(fit.objective_gaps),
            trained_gaps=None if fit is None else list(fit.trained_gaps),
            local_epochs=None if fit is None else list(fit.local_epochs),
            client_metrics=[dict(m) for m in (client_metrics or [])],
            extra=dict(extra or {}),
        )
        self.records.append(rec)
        return rec

    def set_mse(self, t: int, train_mse: float | None, test_mse: float | None) -> RoundRecord:
        """Attach the evaluated MSEs (shared head + each client's own backbone) to round ``t``."""
        rec = self.records[t]
        if rec.round != t:
            raise RuntimeError(f"record index {t} holds round {rec.round}")
        rec.train_mse = None if train_mse is None else float(train_mse)
        rec.test_mse = None if test_mse is None else float(test_mse)
        return rec


def weighted_mean(values: Sequence[float], counts: Sequence[int]) -> float:
    """``sum_m N_m v_m / sum_m N_m`` (clients weighted by evaluated sample counts, SPEC 11)."""
    v = np.asarray(values, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    if v.shape != n.shape or v.size == 0 or np.any(n <= 0):
        raise ValueError(f"values {v.shape} and positive counts {n.shape} must match")
    return float(np.dot(v, n) / n.sum())
