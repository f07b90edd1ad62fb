"""results.json's per-round record and per-client metrics, each key declared once (numpy only).

[`RoundRecord`][fedhead.results.rounds.RoundRecord] is one round's server measurements (``rounds[t]`` of
results.json): every field carries its meaning in its metadata ([`key`][fedhead.results.rounds.key]), and
[`RoundRecord.to_dict`][fedhead.results.rounds.RoundRecord.to_dict],
[`RoundRecord.from_dict`][fedhead.results.rounds.RoundRecord.from_dict],
[`RoundRecord.scalars`][fedhead.results.rounds.RoundRecord.scalars] and the README's schema section
([`fedhead.results.schema_doc`][fedhead.results.schema_doc]) are generated from the fields. A new
per-round measurement is one field here plus its computation
([`fedhead.federation.tracking.RoundTracker`][fedhead.federation.tracking.RoundTracker]).

[`ROUND_EXTRA_KEYS`][fedhead.results.rounds.ROUND_EXTRA_KEYS] documents the per-round entries a strategy adds through
``extra`` (flattened into the round's JSON object); [`CLIENT_METRIC_KEYS`][fedhead.results.rounds.CLIENT_METRIC_KEYS]
the per-client entries of ``client_metrics`` (the clients' train-reply metrics, declared as
[`ClientMetric`][fedhead.results.rounds.ClientMetric]).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

__all__ = ["Key", "key", "RoundRecord", "ROUND_EXTRA_KEYS", "ClientMetric", "CLIENT_METRIC_KEYS", "json_value"]


@dataclass(frozen=True)
class Key:
    """One documented JSON key: its name, type (as the README shows it) and meaning.

    Parameters
    ----------
    name : str
        The JSON key (non-empty).
    type : str
        ``int``, ``float``, ``str``, ``bool``, ``object``, ``list`` or a shape such as ``(C,C)``.
    meaning : str
        What the value means, with its unit where it has one (non-empty).
    """

    name: str
    type: str
    meaning: str

    def __post_init__(self) -> None:
        if not self.name or not self.meaning:
            raise ValueError(f"a schema key needs a name and a meaning, got {self!r}")


def key(meaning: str, type: str, *, scalar: bool = False, array: bool = False) -> dict[str, Any]:
    """Field metadata of a schema field: its meaning and type (README), ``scalar`` (a float the
    TensorBoard/progress lines show) and ``array`` (stored as a nested list, read back as a
    float64 array)."""
    return {"meaning": meaning, "type": type, "scalar": scalar, "array": array}


def json_value(x: Any) -> Any:
    """Arrays as nested lists; everything else unchanged
    ([`fedhead.results.io.to_jsonable`][fedhead.results.io.to_jsonable]
    finishes the conversion on writing)."""
    return x.tolist() if isinstance(x, np.ndarray) else x


_NEEDS_STAR = " (`null` outside the fully active regime)"


@dataclass
class RoundRecord:
    """Server measurements after round ``t`` (theory.md §11): ``rounds[t]`` of results.json.

    ``gram`` is ``G_t = W_t W_t^T`` of the aggregated head after round ``t`` (round 0: the
    initial head). ``predicted_gram`` is the exact recursion's prediction for the *next* round,
    ``S(G_t)`` applied to this round's measured Gram. Quantities that need ``G_star`` or the
    recursion are ``None`` outside the fully active regime. ``extra`` holds a strategy's
    additional measurements ([`ROUND_EXTRA_KEYS`][fedhead.results.rounds.ROUND_EXTRA_KEYS]), flattened into the JSON
    object.
    """

    round: int = field(metadata=key("t", "int"))
    gram: np.ndarray = field(metadata=key("G_t = W_t W_tᵀ of the aggregated head after round t", "(C,C)", array=True))
    bias: np.ndarray = field(metadata=key("b_t", "(C)", array=True))
    e_f_star: float | None = field(
        metadata=key("e_F(G_t, G_star) = ‖G_t − G_star‖_F / ‖G_star‖_F", "float", scalar=True)
    )
    e_f_cen: float | None = field(metadata=key("e_F(G_t, G_cen)", "float", scalar=True))
    e_f_within: float | None = field(metadata=key("e_F(G_t, G_within)", "float", scalar=True))
    d_star: float | None = field(metadata=key("direction error ‖G_t/‖G_t‖ − G_star/‖G_star‖‖_F", "float", scalar=True))
    d_cen: float | None = field(metadata=key("direction error to G_cen", "float", scalar=True))
    d_within: float | None = field(metadata=key("direction error to G_within", "float", scalar=True))
    e_f_reference: float | None = field(
        metadata=key("e_F to the procedure's reference (`reference`)", "float", scalar=True)
    )
    recursion_gram: np.ndarray | None = field(
        metadata=key(
            "the exact recursion (docs/theory.md §6, with `client_grams`) started from this run's G_0, at round t"
            + _NEEDS_STAR,
            "(C,C)",
            array=True,
        )
    )
    e_f_recursion: float | None = field(metadata=key("e_F(G_t, recursion_gram)", "float", scalar=True))
    trajectory_error: float | None = field(
        metadata=key("median over rounds 1..t of e_F(G_s, recursion_s) (`null` at t = 0)", "float", scalar=True)
    )
    predicted_gram: np.ndarray | None = field(
        metadata=key("the recursion's prediction for G_{t+1} from the measured G_t", "(C,C)", array=True)
    )
    delta: float | None = field(
        default=None,
        metadata=key(
            "δ_t = sum_m p_m ‖W̃_{m,t} − Π_m(W_{t−1})‖_F (selection distance of the heads returned in round t "
            "to the closest optimal heads of the broadcast; `null` at t = 0)",
            "float",
            scalar=True,
        ),
    )
    objective_gaps: list[float] | None = field(
        default=None,
        metadata=key(
            "each client's relative objective gap (L_m − L*_m)/L*_m of its trained local model "
            "(eval mode, before averaging)",
            "(M)",
        ),
    )
    trained_gaps: list[float] | None = field(
        default=None,
        metadata=key(
            "the same for the objective each client minimised: L_m + γ C_m against its optimum "
            "L*((1 − γ) Σ_m + γ Σ_cen) (equal to `objective_gaps` without correction)",
            "(M)",
        ),
    )
    local_epochs: list[int] | None = field(
        default=None,
        metadata=key("epochs each client ran (fewer than `local_epochs=` when it stopped at `local_tol=`)", "(M)"),
    )
    max_trained_gap: float | None = field(
        default=None,
        metadata=key(
            "the largest of `trained_gaps`; above 1e-2 the run log warns that the theory's references "
            "(which assume local optima) do not describe the round yet",
            "float",
            scalar=True,
        ),
    )
    train_mse: float | None = field(
        default=None,
        metadata=key(
            "MSE of the shared head W_t with each client's own backbone, clients weighted by sample counts "
            "(`null` for `exact`)",
            "float",
            scalar=True,
        ),
    )
    test_mse: float | None = field(
        default=None,
        metadata=key("the same on the test samples (data sets with test samples only)", "float", scalar=True),
    )
    client_metrics: list[dict[str, float]] = field(
        default_factory=list,
        metadata=key("per client (partition order) the metrics of its reply, see `client_metrics[m]`", "(M)"),
    )
    extra: dict[str, float | None] = field(
        default_factory=dict,
        metadata=key("a strategy's additional measurements, flattened into the round (see below)", "object"),
    )
    dropped: list[dict[str, Any]] = field(
        default_factory=list,
        metadata=key(
            "the clients the failure policy left out of this round, with the reason (round 0: of the moment exchange)",
            "list",
        ),
    )
    gram_errors: list[float] | None = field(
        default=None,
        metadata=key(
            "per client (partition order) ‖W̃_m W̃_mᵀ − G_m‖_F / ‖G_m‖_F: its returned head's Gram against the "
            "optimal Gram of the covariance it sent (`client_grams`)",
            "(M)",
        ),
    )
    flags: list[str] = field(
        default_factory=list,
        metadata=key(
            "one line per client whose reply disagrees with what an honest one looks like: it reports "
            "trained_gap ≤ 1e-2 but its `gram_errors` entry exceeds `trust.flag_gram_error` (a flag, not a drop)",
            "list",
        ),
    )
    ignored_metrics: int = field(
        default=0,
        metadata=key(
            "metric entries of the training replies left out of `client_metrics` (undeclared or not finite)", "int"
        ),
    )
    clipped_updates: int = field(
        default=0,
        metadata=key("clients whose head update was scaled down to `trust.clip_update` before averaging", "int"),
    )

    def scalars(self) -> dict[str, float]:
        """Every defined scalar of the record (for TensorBoard and progress lines)."""
        out = {
            f.name: float(getattr(self, f.name))
            for f in fields(self)
            if f.metadata["scalar"] and getattr(self, f.name) is not None
        }
        if self.objective_gaps:
            for i, g in enumerate(self.objective_gaps):
                out[f"objective_gap/client_{i}"] = float(g)
        out.update({k: float(v) for k, v in self.extra.items() if v is not None})
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: every field (arrays as lists), ``extra`` flattened in."""
        out = {f.name: json_value(getattr(self, f.name)) for f in fields(self) if f.name != "extra"}
        out.update({k: None if v is None else float(v) for k, v in self.extra.items()})
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RoundRecord:
        """The record of a [`to_dict`][fedhead.results.rounds.RoundRecord.to_dict]: array fields back to float64, the
        keys that are not fields back into ``extra``.

        Raises
        ------
        KeyError
            A field without a default is missing (its name is the message).
        """
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "extra" or f.name not in d:
                continue
            v = d[f.name]
            kw[f.name] = np.asarray(v, dtype=np.float64) if f.metadata["array"] and v is not None else v
        names = {f.name for f in fields(cls)}
        kw["extra"] = {k: None if v is None else float(v) for k, v in d.items() if k not in names}
        try:
            return cls(**kw)
        except TypeError as exc:
            missing = [f.name for f in fields(cls) if f.name not in kw and f.name != "extra"]
            raise KeyError(", ".join(missing) or str(exc)) from exc


#: Per-round entries a strategy adds through [`RoundRecord.extra`][fedhead.results.rounds.RoundRecord.extra].
ROUND_EXTRA_KEYS: tuple[Key, ...] = (
    Key(
        "row_epsilon",
        "float",
        "with per-example DP in local training (`train.dp_noise > 0`): the run's epsilon after round t at "
        "`privacy.dp_delta`, one row of one site the unit: the exchange, every noised release and every round's "
        "DP-SGD steps composed by one RDP accountant (dp-accounting); 1e308 (infinite) after an exact exchange",
    ),
    Key("dp_sgd_epsilon", "float", "the same for the DP-SGD steps alone (rounds 1..t)"),
    Key(
        "alignment_gram_error",
        "float",
        "aligned procedures: the largest relative change of a client's Gram through alignment (verified ≤ 1e-6)",
    ),
    Key(
        "mismatch_objective_local",
        "float",
        "round 1 only, with `measure_mismatch=true` and a procedure without alignment (docs/theory.md §13): "
        "Σ_m p_m L_m of each client's own trained local model",
    ),
    Key(
        "mismatch_objective_trained",
        "float",
        "the same for the trained heads' average Σ p_m W̃_m (bias Σ p_m b̃_m) on each client's trained backbone",
    ),
    Key(
        "mismatch_objective_aligned",
        "float",
        "the same for the aligned average Σ p_m W̃_m Q_m on each client's aligned backbone (features Q_mᵀ h, "
        "Q_m the Procrustes rotation to the broadcast)",
    ),
    Key(
        "mismatch_removed",
        "float",
        "(trained − aligned)/(trained − local), the fraction of the excess alignment removes "
        "(`null` when the denominator is ~0)",
    ),
)


class ClientMetric:
    """The per-client entries of ``rounds[t].client_metrics[m]``: each a [`Key`][fedhead.results.rounds.Key] whose
    ``name`` is the key of the client's train-reply metric (the ClientApp, ``clients/app.py``,
    sets ``metrics[ClientMetric.X.name]``; [`fedhead.federation.protocol`][fedhead.federation.protocol] re-exports the
    names). A new per-client metric is one attribute here plus its computation in the ClientApp.
    """

    NUM_EXAMPLES = Key("num-examples", "int", "N_m, the client's training samples")
    PARTITION_ID = Key("partition-id", "int", "the client's partition (its index m)")
    SERVER_ROUND = Key("server-round", "int", "the round the reply belongs to (t)")
    OBJECTIVE_GAP = Key("objective_gap", "float", "relative gap (L_m − L*_m)/L*_m of the trained local model")
    TRAINED_GAP = Key("trained_gap", "float", "the same for the objective the client minimised (L_m + γ C_m)")
    LOCAL_EPOCHS = Key(
        "local_epochs", "int", "epochs run (fewer than `local_epochs=` when `local_tol=` stopped training)"
    )
    OBJECTIVE = Key("objective", "float", "L_m of the trained local model")
    OPTIMAL_OBJECTIVE = Key("optimal_objective", "float", "L*_m, the optimum of the client's objective")
    LOCAL_TRAIN_MSE = Key("local_train_mse", "float", "MSE of the trained local model on the client's training samples")
    TRAIN_SECONDS = Key("train_seconds", "float", "seconds of the training loop")
    LOCAL_SECONDS = Key(
        "local_seconds", "float", "seconds of the whole local computation (set-up, epochs and finishing step)"
    )
    N_STEPS = Key("n_steps", "int", "optimiser steps")
    DISTANCE_TO_BROADCAST = Key("distance_to_broadcast", "float", "‖W̃ − W_t‖_F of the returned head to the broadcast")
    DISTANCE_TO_SELECTION = Key(
        "distance_to_selection", "float", "‖W̃ − Π_m(W_t)‖_F of the returned head to its closest optimal head"
    )
    RELATIVE_DISTANCE_TO_SELECTION = Key(
        "relative_distance_to_selection", "float", "`distance_to_selection` / ‖Π_m(W_t)‖_F"
    )
    ALIGN_DISTANCE_BEFORE = Key(
        "align_distance_before", "float", "aligned procedures: the head's distance to the broadcast before alignment"
    )
    ALIGN_DISTANCE_AFTER = Key("align_distance_after", "float", "aligned procedures: the same after alignment")


#: Every [`ClientMetric`][fedhead.results.rounds.ClientMetric], in declaration order (the README's table).
CLIENT_METRIC_KEYS: tuple[Key, ...] = tuple(v for v in vars(ClientMetric).values() if isinstance(v, Key))
