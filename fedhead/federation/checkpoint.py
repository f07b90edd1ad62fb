"""Server checkpoints of a federation and the ``resume=`` rule (numpy and json only).

After every complete round (round 0: the initial head) the server writes
``<procedure dir>/checkpoint.npz`` atomically
([`fedhead.results.io.write_bytes_atomic`][fedhead.results.io.write_bytes_atomic]): one
``.npz`` whose ``meta`` entry is a JSON document (format version, round, procedure, config
hash, the tracker's round records, and ``data``: the data record of the first start, see below)
and whose other entries are the float64 arrays the next round starts from:

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
[`check_data`][fedhead.federation.checkpoint.check_data] refuses one whose data changed: the
simulation driver records [`fedhead.data.data_record`][fedhead.data.data_record] (site keys,
target offsets and scales, each client's input means and variances; no rows) in every
checkpoint and compares it before anything starts. A checkpoint without it (written before
fedhead recorded it, or by a deployed ServerApp, which has no data to record) cannot be checked:
the simulation refuses to resume it (a clear line; start a new run).
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
    data: dict[str, Any] | None = None  # the data record of the first start (None: not recorded)

    @property
    def round(self) -> int:
        return self.state.round


def checkpoint_path(job_dir: str | Path) -> Path:
    return Path(job_dir) / CHECKPOINT_NAME


def write_checkpoint(
    path: str | Path, state: ServerState, *, config_hash: str, procedure: str, data: dict[str, Any] | None = None
) -> Path:
    """Write ``state`` atomically to ``path`` (see the module docstring for the format); ``data``:
    the run's data record ([`fedhead.data.data_record`][fedhead.data.data_record]), None when unknown."""
    meta = {
        "format_version": FORMAT_VERSION,
        "round": int(state.round),
        "procedure": procedure,
        "config_hash": config_hash,
        "records": state.records,
        "rng": None,
        "extra": sorted(state.extra),
        "data": data,
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
    data = meta.get("data")  # absent before fedhead recorded it
    return Checkpoint(
        state=state,
        config_hash=str(meta["config_hash"]),
        procedure=str(meta["procedure"]),
        path=path,
        data=data if isinstance(data, dict) else None,
    )


def load_for_resume(job_dir: str | Path, *, config_hash: str, procedure: str, rounds: int) -> Checkpoint | None:
    """The checkpoint a resumed job continues from, or None when the job never checkpointed.

    Raises [`ResumeError`][fedhead.federation.checkpoint.ResumeError] when it was written with another config (hash) or
    procedure, or holds more rounds than the config asks for.
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


def check_data(ckpt: Checkpoint, data: dict[str, Any]) -> None:
    """Refuse a resume whose data (``data``, the record of this start) differ from the record the
    checkpointed run made at its first start, or whose checkpoint holds none: one
    [`ResumeError`][fedhead.federation.checkpoint.ResumeError] line saying what differs (file
    names, columns, clients; never a value). Nothing is written or removed."""
    where = ckpt.path.parent
    if ckpt.data is None:
        raise ResumeError(
            f"cannot resume {where}: its checkpoint records no site keys, standardisation or input statistics "
            "(written by an earlier fedhead or by a deployed ServerApp), so the data cannot be checked against it; "
            "start a new run"
        )
    diffs = data_differences(ckpt.data, data)
    if diffs:
        raise ResumeError(
            f"cannot resume {where}: the data differ from the checkpointed run's ({'; '.join(diffs)}); "
            "start a new run for other data"
        )


def data_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two data records (empty: the same data), named by file, column or
    client, never by value."""
    out = []
    a, b = dict(map(tuple, old.get("site_keys", []))), dict(map(tuple, new.get("site_keys", [])))
    if a != b:
        changed = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
        parts = [f"{k} changed" for k in changed] + [f"{k} removed" for k in sorted(a.keys() - b.keys())]
        parts += [f"{k} added" for k in sorted(b.keys() - a.keys())]
        if not parts:  # the same files under other names
            parts = ["the files were renamed or reordered"]
        out.append(f"site keys: {', '.join(parts)}")
    names = list(new.get("target_names", []))
    if list(old.get("target_names", [])) != names:
        out.append("target columns")
    else:
        cols = _differing(old, new, ("target_offset", "target_scale"))
        if cols is not None:
            named = [repr(names[i]) if i < len(names) else str(i) for i in cols]
            out.append(f"target standardisation (offset/scale) of {', '.join(named) or 'the targets'}")
    mean_a, mean_b = old.get("input_mean", []), new.get("input_mean", [])
    if len(mean_a) != len(mean_b):
        out.append("input statistics (the clients' inputs)")
    else:
        for m in range(len(mean_a)):
            pair_a = {k: old.get(k, [])[m] for k in ("input_mean", "input_var")}
            pair_b = {k: new.get(k, [])[m] for k in ("input_mean", "input_var")}
            cols = _differing(pair_a, pair_b, ("input_mean", "input_var"))
            if cols is not None:
                out.append(f"input statistics (mean/variance) of client {m}, input column(s) {cols or 'all'}")
                break
    return out


def _differing(old: dict[str, Any], new: dict[str, Any], keys: tuple[str, ...]) -> list[int] | None:
    """Columns where the arrays ``keys`` of ``old`` and ``new`` differ (beyond rounding); [] for
    other shapes; None when they agree."""
    bad: set[int] = set()
    for k in keys:
        x, y = np.asarray(old.get(k, []), dtype=np.float64), np.asarray(new.get(k, []), dtype=np.float64)
        if x.shape != y.shape:
            return []
        close = np.isclose(x, y, rtol=1e-9, atol=1e-12, equal_nan=True)
        bad |= set(np.flatnonzero(~close).tolist())
    return sorted(bad) if bad else None


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
