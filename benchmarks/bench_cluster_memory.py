"""Benchmark: the memory of a ResNet-18 federation of 10 clients on a 2-node Ray cluster (Linux).

``fedhead-run model=resnet18 dataset=dsprites num_clients=10`` (``--n-train`` rows, 32 x 32
images, ``--rounds`` rounds of one local epoch) joins a 2-node cluster on this host
(``ray.cluster_utils.Cluster``, 1 CPU each, so the clients queue for two actors and move between
them). Every 0.5 s the resident memory (``/proc/<pid>/status`` VmRSS) of the driver and of every
Ray worker process (``ray::`` in its command line) is read; printed: the peak of each kind and of
their sum, per round of the run's length. Each client's private backbone lives on disk between
rounds (the shared state folder), so the peaks should not grow with the rounds.

Usage::

    python benchmarks/bench_cluster_memory.py
    python benchmarks/bench_cluster_memory.py --rounds 4 --n-train 800
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def workers() -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "cmdline").read_bytes().startswith(b"ray::"):
                    out.append(int(p.name))
            except OSError:
                continue
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n-train", type=int, default=400)
    args = parser.parse_args()
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    peaks = {"driver": 0.0, "worker (largest)": 0.0, "workers (sum)": 0.0, "driver + workers": 0.0}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            command = [
                str(Path(sys.executable).with_name("fedhead-run")),
                "model=resnet18",
                "dataset=dsprites",
                f"dataset.n_train={args.n_train}",
                "dataset.image_size=32",
                f"dataset.cache_dir={tmp}/cache",
                "num_clients=10",
                "procedure=proximal",
                f"rounds={args.rounds}",
                "local_epochs=1",
                "resources.evaluate_mse=false",
                f"resources.ray_address={cluster.address}",
                "output.tensorboard=false",
                "output.figures=false",
                f"output.dir={tmp}/out",
                f"hydra.run.dir={tmp}/hydra",
            ]
            start = time.perf_counter()
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            while proc.poll() is None:
                driver = rss_mib(proc.pid)
                per = [rss_mib(pid) for pid in workers()]
                for key, value in (
                    ("driver", driver),
                    ("worker (largest)", max(per, default=0.0)),
                    ("workers (sum)", sum(per)),
                    ("driver + workers", driver + sum(per)),
                ):
                    peaks[key] = max(peaks[key], value)
                time.sleep(0.5)
            wall = time.perf_counter() - start
            if proc.returncode != 0:
                sys.exit(f"the run failed:\n{(proc.stderr.read() if proc.stderr else '')[-2000:]}")
    finally:
        cluster.shutdown()
    print(f"ResNet-18, 10 clients, {args.rounds} rounds x 1 epoch, {args.n_train} rows, 2-node cluster: {wall:.0f} s")
    for key, value in peaks.items():
        print(f"  peak RSS {key:20s} {value:8.0f} MiB")


if __name__ == "__main__":
    main()
