"""results.json of a federation: its one writer and its one reader.

[`write`][fedhead.results.schema.write] and [`read`][fedhead.results.schema.read] are the only ways in and out.

Every top-level key is a field of [`Results`][fedhead.results.schema.Results] whose metadata says
what it means (nested objects: ``fedhead.results.sections``; rounds: ``fedhead.results.rounds``);
the reader's checks and the README's schema section are generated from the fields. A key that
changes meaning raises ``SCHEMA_VERSION`` by one, and ``UPGRADES[old]`` keeps older files readable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedhead.results.io import write_json_atomic
from fedhead.results.rounds import RoundRecord, key
from fedhead.results.sections import (
    ABSENT,
    DatasetInfo,
    LocalOptimality,
    LocalSteps,
    SchemaError,
    Timing,
    section_dict,
    section_kwargs,
)

__all__ = [
    "SCHEMA_VERSION",
    "KNOWN_VERSIONS",
    "UPGRADES",
    "ABSENT",
    "SchemaError",
    "Timing",
    "LocalOptimality",
    "LocalSteps",
    "DatasetInfo",
    "Results",
    "write",
    "read",
    "from_dict",
]

#: The version [`write`][fedhead.results.schema.write] writes.
SCHEMA_VERSION = 1
#: version -> the function that turns a results.json object of that version into one of the
#: next version (its ``schema_version`` included). Empty: no key has changed meaning since 1.
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}
#: Every version [`read`][fedhead.results.schema.read] accepts: the older ones with an upgrade, and the current one.
KNOWN_VERSIONS = (*sorted(UPGRADES), SCHEMA_VERSION)
#: The file name of a federation's results in its output folder.
FILE_NAME = "results.json"


@dataclass
class Results:
    """The content of one federation's results.json (see the module docstring).

    Mutable: the recorder fills it in as the run goes (diagnosis after the exchange, a round
    after every aggregation, timing at the end) and writes it with [`write`][fedhead.results.schema.write] each time.
    """

    schema_version: int = field(metadata=key("the schema version of the file", "int"))
    status: str = field(
        metadata=key("`running` (during the run), `completed`, `diagnosed` (`diagnose_only=true`) or `failed`", "str")
    )
    procedure: dict[str, Any] = field(
        metadata=key(
            "`name, rho, gamma, align, centered, full_model, exact` (rho after the top-level `rho=`, "
            "which sets procedures with a proximal term only)",
            "object",
        )
    )
    reference: str = field(
        metadata=key(
            "the Gram the procedure should reach: `star`, `cen` (full correction, gamma = 1), `corrected` "
            "(partial correction 0 < gamma < 1: the BW barycenter of the corrected client Grams, "
            "`targets.g_corrected`) or `within` (centred)",
            "str",
        )
    )
    config: dict[str, Any] = field(
        metadata=key("the resolved Hydra config of the run (every group and top-level key)", "object")
    )
    seeds: dict[str, Any] = field(
        metadata=key(
            "`seed` (model init + minibatch order), `dataset_seed`, `init` (`common`/`independent`), "
            "`backbone_seeds` (each client's initial-backbone seed, `fedhead.analysis.seeds.backbone_seed`)",
            "object",
        )
    )
    git_revision: str = field(metadata=key("commit of the source tree (`+dirty` when modified), or `unknown`", "str"))
    provenance: dict[str, Any] = field(
        metadata=key(
            "`git_revision, python, platform, numpy, argv, seeds`; under `flwr run` also `fab` (`fab_id, "
            "fab_version, fab_hash, run_id`: a deployed ServerApp runs from the installed FAB, where "
            "`git_revision` is `unknown`) and `run_config`; a simulation adds `ray_nodes` (the Ray nodes its "
            "clients trained on, `<IP>_<node id prefix>`)",
            "object",
        )
    )
    dataset: DatasetInfo = field(metadata=key("see `dataset` below", "object"))
    diagnosis: dict[str, Any] | None = field(
        metadata=key("see `diagnosis` below (computed right after the moment exchange, before training)", "object")
    )
    moments: dict[str, Any] | None = field(
        metadata=key(
            "exchanged statistics: `counts (M)`, `weights (M)` = N_m/N, `means (M,C)`, `covs (M,C,C)`, "
            "`sigma_cen (C,C)`, `sigma_within (C,C)`",
            "object",
        )
    )
    targets: dict[str, Any] | None = field(
        metadata=key(
            "`g_star, g_cen, g_within (C,C)`, `grams (M,C,C)` = phi(Sigma_m), `client_grams (M,C,C)` = the "
            "optimal Grams the procedure's clients fit (phi((1-gamma) Sigma_m + gamma Sigma_cen)), `weights (M)`, "
            "`reference`, `fully_active`, `g_corrected` (C,C) and `corrected_converged` (partial correction "
            "only, else `null`). Outside the fully active regime (only with `dataset.allow_outside_regime=true`) "
            "phi is the PSD minimiser with clipped eigenvalues, so `g_cen, g_within, grams, client_grams` are "
            "still given, but `g_star` is `null`",
            "object",
        )
    )
    rounds: list[RoundRecord] = field(
        metadata=key("one entry per round `0..T` (round 0 = the initial head), see `rounds[t]` below", "list")
    )
    timing: Timing = field(metadata=key("see `timing` below", "object"))
    resumed_after_round: int = field(
        default=ABSENT, metadata=key("only in a resumed run: the checkpointed round it continued after", "int")
    )
    error: str = field(default=ABSENT, metadata=key('only when `status == "failed"`: the exception', "str"))
    local_optimality: LocalOptimality = field(
        default=ABSENT, metadata=key("at the end of the run, see `local_optimality` below", "object")
    )
    local_steps: LocalSteps = field(
        default=ABSENT,
        metadata=key(
            "at the end of a run with a training round, see `local_steps` below (absent in files written "
            "before it was recorded)",
            "object",
        ),
    )
    figures: list[str] = field(default=ABSENT, metadata=key("PNG files written next to results.json", "list"))
    standardization: dict[str, Any] = field(
        default=ABSENT,
        metadata=key(
            "the targets' standardisation, `{targets: {mode, offset (C), scale (C)}, inputs: {mode, "
            "offset (F), scale (F)}}` (`y = offset + scale * y_std` maps a prediction back): site-local "
            "`dataset=table` runs, the federation's from the exchanged moments (input arrays empty "
            "unless `pooled`); other simulations, the loaded data set's (inputs `loader`: the loader's "
            "own, not recorded); absent where the server has neither (a deployment of a built-in data set)",
            "object",
        ),
    )

    privacy: dict[str, Any] = field(
        default=ABSENT,
        metadata=key(
            "with `privacy.mode=secure`: `mode`, `sites` (in the exchange's secure sum), `absent` (the "
            "per-site quantities this file holds as `null`: the server saw only sums) and `reason`; with "
            "differential privacy also `dp`: `noise_multiplier, clip, head_clip, max_rows, delta, releases, epsilon` "
            "(Flower's RDP accountant, client-level, after every release so far); with per-example DP in local "
            "training (`train.dp_noise > 0`, in either mode) `dp_sgd`: `noise_multiplier, clip, sample_rate, "
            "steps_per_round, delta, accountant, row_epsilon, dp_sgd_epsilon` (after the latest round)",
            "object",
        ),
    )

    # ------------------------------------------------------------------ typed views
    @property
    def name(self) -> str:
        """The procedure's name."""
        return str(self.procedure.get("name", ""))

    @property
    def gamma(self) -> float:
        """The procedure's correction strength (0 when not recorded)."""
        g = self.procedure.get("gamma")
        return float(g) if isinstance(g, (int, float)) and not isinstance(g, bool) else 0.0

    @property
    def last(self) -> RoundRecord | None:
        """The last recorded round, or None."""
        return self.rounds[-1] if self.rounds else None

    def round_at(self, t: int) -> RoundRecord | None:
        """Round ``t``, or None when it was not recorded."""
        return next((r for r in self.rounds if r.round == t), None)

    def target(self, name: str) -> np.ndarray | None:
        """A Gram of ``targets`` (``g_star``, ``g_cen``, ...) as a float64 array, or None."""
        g = (self.targets or {}).get(name)
        return None if g is None else np.asarray(g, dtype=np.float64)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The JSON object of results.json (arrays as nested lists)."""
        out = section_dict(self)
        out["rounds"] = [r.to_dict() for r in self.rounds]
        return out


def from_dict(d: Any, *, where: str = FILE_NAME) -> Results:
    """The [`Results`][fedhead.results.schema.Results] of a results.json object.

    Raises
    ------
    SchemaError
        Not an object, an unknown (e.g. newer) ``schema_version``, or a required key missing.
    """
    if not isinstance(d, Mapping):
        raise SchemaError(f"{where}: expected a JSON object, got {type(d).__name__}")
    version = d.get("schema_version")
    known = (*sorted(UPGRADES), SCHEMA_VERSION)
    if isinstance(version, bool) or version not in known:
        raise SchemaError(
            f"{where}: schema_version {version!r} is not one this fedhead reads "
            f"({', '.join(map(str, known))}); a newer fedhead wrote it?"
        )
    while version != SCHEMA_VERSION:
        d = UPGRADES[version](dict(d))
        if d.get("schema_version") != version + 1:
            raise SchemaError(f"{where}: the upgrade of schema_version {version} did not give {version + 1}")
        version += 1
    kw = section_kwargs(Results, d, where)
    try:
        kw["rounds"] = [RoundRecord.from_dict(r) for r in kw["rounds"]]
    except KeyError as exc:
        raise SchemaError(f"{where}: a round misses key(s) {exc.args[0]}") from exc
    except (TypeError, AttributeError) as exc:
        raise SchemaError(f"{where}: rounds must be a list of objects ({exc})") from exc
    kw["dataset"] = DatasetInfo.from_dict(kw["dataset"])
    kw["timing"] = Timing.from_dict(kw["timing"])
    if "local_optimality" in kw:
        kw["local_optimality"] = LocalOptimality.from_dict(kw["local_optimality"])
    if "local_steps" in kw:
        kw["local_steps"] = LocalSteps.from_dict(kw["local_steps"])
    return Results(**kw)


def write(path: str | os.PathLike, results: Results) -> Path:
    """Write ``results`` to ``path`` atomically
    ([`fedhead.results.io.write_json_atomic`][fedhead.results.io.write_json_atomic])."""
    return write_json_atomic(path, results.to_dict())


def read(path: str | os.PathLike) -> Results:
    """Read a results.json.

    Raises
    ------
    SchemaError
        See [`from_dict`][fedhead.results.schema.from_dict]; also for a file that is not JSON.
    OSError
        The file cannot be read.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaError(f"{path}: not JSON ({exc})") from exc
    return from_dict(data, where=str(path))
