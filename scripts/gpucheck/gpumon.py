"""GPU busy % and memory, sampled by ``nvidia-smi`` in a background thread.

Each sample is one line ``epoch_seconds,busy %,memory MiB`` appended to a file (read by
:func:`table.parse_samples`). Without ``nvidia-smi`` (the CPU dry run) nothing is sampled and
:attr:`Monitor.note` says so.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

QUERY = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]


class Monitor:
    def __init__(self, path: Path, interval_s: float = 0.5, command: list[str] | None = None):
        self.path, self.interval_s = path, interval_s
        self.command = command or QUERY
        self.note = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Monitor:
        if shutil.which(self.command[0]) is None:
            self.note = f"{self.command[0]} not found: no GPU samples"
            return self
        self.path.write_text("")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        with open(self.path, "a") as fh:
            while not self._stop.is_set():
                t = time.time()
                try:
                    out = subprocess.run(self.command, capture_output=True, text=True, timeout=5).stdout
                    first = out.strip().splitlines()[0] if out.strip() else ""
                    if first:
                        fh.write(f"{t:.3f},{first}\n")
                        fh.flush()
                except (subprocess.TimeoutExpired, OSError) as exc:
                    self.note = f"nvidia-smi failed: {exc}"
                self._stop.wait(max(0.0, self.interval_s - (time.time() - t)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
