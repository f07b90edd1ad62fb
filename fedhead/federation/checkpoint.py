"""Server checkpoints of a federation and the ``resume=`` rule (numpy and json only).

After every complete round (round 0: the initial head) the server writes
``<procedure dir>/checkpoint.npz`` atomically
([`fedhead.results.io.write_bytes_atomic`][fedhead.results.io.write_bytes_atomic]): one
``.npz`` whose ``meta`` entry is a JSON document (format version, round, procedure, config
hash, the tracker's round records, the exchanged moments as lists) and whose other entries are
the float64 arrays the next round starts from:

* ``head/weight`` ``(C, P)``, ``head/bias`` ``(C,)`` -- the aggregated head after the round;
* ``recursion`` ``(t + 1, C, C)`` -- the exact recursion run alongside (absent outside the regime);
* ``moments/counts``, ``moments/means``, ``moments/covs`` -- the exchanged moments (a resumed
  run repeats the exchange and refuses clients whose moments differ);
* ``server/<name>`` -- strategy state beyond the head (the averaged backbone of full-model
  averaging).

The server has no random state: the initial head and backbone come from the run seed and each
client's local training seed from [`fedhead.train.round_seed`][fedhead.train.round_seed] ``(seed, round, partition)``,
so a resumed run repeats exactly what the uninterrupted run would have done.

The private backbones stay with the clients
([`fedhead.clients.store.BackboneStore`][fedhead.clients.BackboneStore]); in a simulation their folder is
keyed by [`state_key`][fedhead.federation.checkpoint.state_key] (from the config hash, not flwr's run id,
which changes between the original and the resumed run).

[`load_for_resume`][fedhead.federation.checkpoint.load_for_resume] refuses a folder written with another config (another
[`config_hash`][fedhead.settings.job.config_hash]).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from fedhead.results.io import to_jsonable, write_bytes_atomic

FORMAT_VERSION = 1
CHECKPOINT_NAME = "checkpoint.npz"


class ResumeError(ValueError):
    """A run folder cannot be resumed with this config (the message says why and what to do)."""


def state_key(hash_: str) -> str:
    """The run key of the clients' state folder (``run_<key>``) for a config hash."""
    return hash_[:16]


@dataclass
class ServerState:
    """What the server needs to continue after round ``round`` (built by the strategy)."""

    round: int
    weight: np.ndarray
    bias: np.ndarray
    records: list[dict[str, Any]]  # fedhead.federation.tracking.RoundRecord.to_dict() of rounds 0..round
    recursion: np.ndarray | None  # (round + 1, C, C) or None outside the regime
    counts: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Checkpoint:
    """A checkpoint read back from disk."""

    state: ServerState
    config_hash: str
    procedure: str
    path: Path

    @property
    def round(self) -> int:
        return self.state.round


def checkpoint_path(job_dir: str | Path) -> Path:
    return Path(job_dir) / CHECKPOINT_NAME


def write_checkpoint(path: str | Path, state: ServerState, *, config_hash: str, procedure: str) -> Path:
    """Write ``state`` atomically to ``path`` (see the module docstring for the format)."""
    meta = {
        "format_version": FORMAT_VERSION,
        "round": int(state.round),
        "procedure": procedure,
        "config_hash": config_hash,
        "records": state.records,
        "rng": None,
        "extra": sorted(state.extra),
    }
    arrays: dict[str, np.ndarray] = {
        "meta": np.frombuffer(json.dumps(to_jsonable(meta), allow_nan=True).encode("utf-8"), dtype=np.uint8),
        "head/weight": np.asarray(state.weight, dtype=np.float64),
        "head/bias": np.asarray(state.bias, dtype=np.float64),
        "moments/counts": np.asarray(state.counts, dtype=np.float64),
        "moments/means": np.asarray(state.means, dtype=np.float64),
        "moments/covs": np.asarray(state.covs, dtype=np.float64),
    }
    if state.recursion is not None:
        arrays["recursion"] = np.asarray(state.recursion, dtype=np.float64)
    for k, v in state.extra.items():
        arrays[f"server/{k}"] = np.asarray(v)
    buf = io.BytesIO()
    # the keys are array names ("meta", "head/weight", "server/<k>", ...), never savez's own keyword `allow_pickle`
    np.savez(buf, **cast(dict[str, Any], arrays))
    return write_bytes_atomic(path, buf.getvalue())


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint written by [`write_checkpoint`][fedhead.federation.checkpoint.write_checkpoint] (raises
    [`ResumeError`][fedhead.federation.checkpoint.ResumeError])."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        meta = json.loads(bytes(data.pop("meta")).decode("utf-8"))
    except Exception as exc:
        raise ResumeError(f"cannot read the checkpoint {path}: {exc}") from exc
    if meta.get("format_version") != FORMAT_VERSION:
        raise ResumeError(
            f"checkpoint {path} has format version {meta.get('format_version')}, "
            f"this fedhead reads version {FORMAT_VERSION}"
        )
    state = ServerState(
        round=int(meta["round"]),
        weight=data["head/weight"],
        bias=data["head/bias"],
        records=list(meta["records"]),
        recursion=data.get("recursion"),
        counts=data["moments/counts"],
        means=data["moments/means"],
        covs=data["moments/covs"],
        extra={k[len("server/") :]: v for k, v in data.items() if k.startswith("server/")},
    )
    return Checkpoint(state=state, config_hash=str(meta["config_hash"]), procedure=str(meta["procedure"]), path=path)


def load_for_resume(job_dir: str | Path, *, config_hash: str, procedure: str, rounds: int) -> Checkpoint | None:
    """The checkpoint a resumed job continues from, or None when the job never checkpointed.

    Raises [`ResumeError`][fedhead.federation.checkpoint.ResumeError] when it was written with another config (hash) or
    procedure, or
    holds more rounds than the config asks for.
    """
    path = checkpoint_path(job_dir)
    if not path.is_file():
        return None
    ckpt = read_checkpoint(path)
    if ckpt.config_hash != config_hash:
        raise ResumeError(
            f"cannot resume {path.parent}: it was written with another config (hash {ckpt.config_hash[:12]}, "
            f"this config {config_hash[:12]}); pass the same overrides as the original run (only output.* "
            f"may differ), see {path.parent / 'results.json'} 'config'"
        )
    if ckpt.procedure != procedure:
        raise ResumeError(
            f"cannot resume {path.parent}: its checkpoint is of procedure {ckpt.procedure!r}, not {procedure!r}"
        )
    if ckpt.round > rounds:
        raise ResumeError(f"cannot resume {path.parent}: its checkpoint is at round {ckpt.round} > rounds={rounds}")
    return ckpt


def check_moments(state: ServerState, counts: np.ndarray, means: np.ndarray, covs: np.ndarray) -> None:
    """Refuse a resume whose clients report other moments than the checkpointed run's."""
    pairs = (("counts", state.counts, counts), ("means", state.means, means), ("covs", state.covs, covs))
    for name, old, new in pairs:
        old, new = np.asarray(old, dtype=np.float64), np.asarray(new, dtype=np.float64)
        if old.shape != new.shape or not np.allclose(old, new, rtol=1e-12, atol=1e-12):
            raise ResumeError(
                f"the clients' target {name} differ from the checkpointed run's: the data changed, cannot resume"
            )


def resume_checkpoints(jobs: list[Any], folder: str | Path | None = None) -> list[Checkpoint | None]:
    """The checkpoint each job of a resumed run continues from (None: the job starts afresh,
    it had not begun). Raises [`ResumeError`][fedhead.federation.checkpoint.ResumeError] when no job has one or one does
    not match."""
    ckpts = [
        load_for_resume(j.output_dir, config_hash=j.config_hash, procedure=j.name, rounds=j.settings.rounds)
        for j in jobs
    ]
    if jobs and all(c is None for c in ckpts):
        where = folder if folder is not None else Path(jobs[0].output_dir).parent
        raise ResumeError(
            f"cannot resume {where}: no {CHECKPOINT_NAME} under "
            f"{', '.join(str(Path(j.output_dir)) for j in jobs)} (is it the run folder of a fedhead-run?)"
        )
    return ckpts
