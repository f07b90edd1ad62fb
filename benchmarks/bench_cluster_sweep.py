"""Benchmark: one sweep on a 2-node Ray cluster against the same sweep on one node with the same CPUs.

The sweep is ``fedhead-sweep sweep=main scale=smoke`` on Hopper with two seeds (8 runs of the
free-feature model; ``--rounds``/``--epochs`` size them). The cluster is two raylets on this host
(``ray.cluster_utils.Cluster``, ``--cpus`` each), joined through ``RAY_ADDRESS``; the single node is
``resources.ray_num_cpus`` of twice that. Both sweeps run from a fresh process, one after the
other, and print their wall time (the manifest's runs, and the whole command) and the ratio
cluster / one node; the cluster's manifest names the nodes each run's clients trained on.

Usage::

    python benchmarks/bench_cluster_sweep.py
    python benchmarks/bench_cluster_sweep.py --cpus 2 --rounds 2 --epochs 100 --parallel 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def sweep(
    out: Path, cache: Path, rounds: int, epochs: int, env: dict[str, str], extra: list[str], parallel: int = 1
) -> tuple[float, dict]:
    """Run the sweep in a fresh process (``parallel`` runs at once); its wall time and manifest."""
    command = [
        str(Path(sys.executable).with_name("fedhead-sweep")),
        "sweep=main",
        "scale=smoke",
        "settings=[hopper]",
        "seeds=[0,1]",
        f"out={out}",
        f"run_overrides=['dataset.cache_dir={cache}','model=free','model.feature_dim=8',"
        f"'local_epochs={epochs}','rounds={rounds}'{''.join(f',{e!r}' for e in extra)}]",
        f"hydra.run.dir={out.parent / (out.name + '-hydra')}",
        f"parallel_runs={parallel}",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=out.parent)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"the sweep in {out} failed:\n{done.stderr[-2000:]}")
    return wall, json.loads((out / "manifest.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=int, default=1, help="CPUs of each of the cluster's two nodes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--parallel", type=int, default=1, help="parallel_runs of both sweeps")
    args = parser.parse_args()
    from ray.cluster_utils import Cluster

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cache = root / "cache"
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        # warm the data cache first, so that neither timed sweep pays for generating Hopper
        sweep(root / "warm", cache, 1, 1, env, [f"resources.ray_num_cpus={2 * args.cpus}"])
        one_wall, one = sweep(
            root / "one", cache, args.rounds, args.epochs, env, [f"resources.ray_num_cpus={2 * args.cpus}"]
        )
        cluster = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": args.cpus})
        cluster.add_node(num_cpus=args.cpus)
        try:
            two_wall, two = sweep(
                root / "two", cache, args.rounds, args.epochs, {**env, "RAY_ADDRESS": cluster.address}, []
            )
        finally:
            cluster.shutdown()
    runs_one = sum(r["wall_seconds"] or 0.0 for r in one["runs"])
    runs_two = sum(r["wall_seconds"] or 0.0 for r in two["runs"])
    nodes = sorted(set().union(*(r.get("nodes") or [] for r in two["runs"])))
    print(
        f"sweep main (smoke) on Hopper, seeds 0 and 1: {len(two['runs'])} runs, {args.rounds} rounds x "
        f"{args.epochs} epochs, parallel_runs={args.parallel}"
    )
    print(f"{'':28s}{'one node':>12s}{'2-node cluster':>16s}{'ratio':>8s}")
    print(f"{'whole command (s)':28s}{one_wall:12.1f}{two_wall:16.1f}{two_wall / one_wall:8.2f}")
    print(f"{'runs, manifest sum (s)':28s}{runs_one:12.1f}{runs_two:16.1f}{runs_two / runs_one:8.2f}")
    print(f"CPUs: {2 * args.cpus} on one node; {args.cpus} on each of 2 nodes")
    print(f"the cluster's clients trained on {len(nodes)} node(s): {', '.join(nodes)}")


if __name__ == "__main__":
    main()
