"""Client-side store of private backbones (they never travel in a message): one state per
``(run key, partition)`` on local disk, written atomically, named by the round that wrote it
(``partition_<pid>.r<round>.pt``), with the process's cache in front
([`fedhead.clients.cache`][fedhead.clients.cache]).

Saving round ``t`` removes the states before round ``t - 1``: a run killed before round ``t``'s
checkpoint resumes from round ``t - 1``
([`fedhead.federation.checkpoint`][fedhead.federation.checkpoint]).
"""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any

from fedhead.clients.cache import CLIENT_CACHE, StoredState
from fedhead.results.io import write_bytes_atomic

log = logging.getLogger(__name__)

_NAME = re.compile(r"^partition_(\d+)\.r(\d+)\.pt$")


class StoreError(RuntimeError):
    """A stored client state is missing, unreadable or inconsistent."""


class BackboneStore:
    """Private per-partition state of one run, on disk with an in-process cache.

    The round in each file name tells a process, without reading the file, whether its cached
    copy is still the newest (several Ray workers may serve one partition in turn).

    Parameters
    ----------
    root : path
        State folder (one per run; created on first save).
    sync : bool
        ``fsync`` every saved state (durable across a power loss). The simulation turns it off
        for its temporary state folder (the rename keeps each file atomic either way).
    """

    def __init__(self, root: str | Path, *, sync: bool = True):
        self.root = Path(root)
        self.sync = bool(sync)

    def path(self, partition: int, round_: int) -> Path:
        """The file of ``partition``'s state after ``round_``."""
        return self.root / f"partition_{int(partition)}.r{int(round_)}.pt"

    def _newest_if(self, partition: int, round_: int | None) -> list[tuple[int, Path]] | None:
        """``[(round_, path)]`` when the state of ``round_`` is stored and no later one (two
        ``stat`` calls, no folder listing); None when that cannot be told this way."""
        if round_ is None or round_ < 0:
            return None
        path = self.path(partition, round_)
        if path.is_file() and not self.path(partition, round_ + 1).exists():
            return [(int(round_), path)]
        return None

    def _files(self, partition: int) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = _NAME.match(p.name)
            if m and int(m.group(1)) == partition:
                out.append((int(m.group(2)), p))
        return sorted(out)

    def load(self, partition: int, *, expected_round: int | None = None) -> StoredState | None:
        """``(round, state)`` of the newest stored state, or None. The state is a copy-safe dict
        of CPU tensors (the caller loads it into a module).

        ``expected_round`` (the round the caller expects to be the newest; default: the cached
        one) lets the lookup check two file names instead of listing the folder, so its cost
        does not grow with the number of partitions; anything unexpected falls back to a listing.
        """
        key = (str(self.root.resolve()), partition)
        cached = CLIENT_CACHE.stored_state(key)
        guess = expected_round if expected_round is not None else (cached[0] if cached is not None else None)
        files = self._newest_if(partition, guess)
        if files is None and expected_round is not None and self.path(partition, expected_round).is_file():
            files = [(int(expected_round), self.path(partition, expected_round))]  # a resumed round
        if files is None:
            files = self._files(partition)
        if not files:
            return None
        rnd, path = files[-1]
        if cached is not None and cached[0] == rnd:
            return cached
        import torch  # only where a state is read or written: most messages touch no model

        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise StoreError(f"cannot read the private state of partition {partition} from {path}: {exc}") from exc
        if not isinstance(payload, dict) or payload.get("round") != rnd or "state" not in payload:
            raise StoreError(f"private state file {path} is inconsistent (expected round {rnd})")
        entry = (rnd, payload["state"])
        CLIENT_CACHE.keep_stored_state(key, entry)
        return entry

    def save(self, partition: int, round_: int, state: dict[str, Any]) -> Path:
        """Store ``state`` (tensors moved to CPU) as the state of ``partition`` after ``round_``."""
        import torch

        cpu_state = {k: (v.detach().to("cpu").clone() if torch.is_tensor(v) else v) for k, v in state.items()}
        buf = io.BytesIO()
        torch.save({"round": int(round_), "state": cpu_state}, buf)
        path = write_bytes_atomic(self.path(partition, round_), buf.getvalue(), sync=self.sync)
        stale = self.path(partition, round_ - 2)
        if stale.exists() or self.path(partition, round_ - 1).exists():
            stale.unlink(missing_ok=True)  # the usual case: only the file of round t - 2 to remove
        else:
            for rnd, old in self._files(partition):
                if rnd < round_ - 1:
                    old.unlink(missing_ok=True)
        CLIENT_CACHE.keep_stored_state((str(self.root.resolve()), partition), (int(round_), cpu_state))
        return path

    def cached(self, partition: int) -> StoredState | None:
        """The in-process ``(round, state)`` of ``partition`` (what
        [`load`][fedhead.clients.BackboneStore.load] would return if nothing newer was stored
        since), or None."""
        return CLIENT_CACHE.stored_state((str(self.root.resolve()), partition))
