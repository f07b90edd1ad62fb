"""Share of a default ``fedhead-run``'s wall time spent outside local training.

Runs the default experiment (or the one named by Hydra-style overrides given on the command
line) and splits every federation's wall time into: simulation start (Ray cluster, worker
processes, data loading up to the moment exchange), the one-time moment exchange, local
training (the clients' training loops, divided by the number of clients Ray runs at once),
the rest of the train message phase (messaging, model (de)serialisation, backbone store),
the evaluation phase (shared-head MSE on every client) and the server's own work (aggregation,
metrics, TensorBoard, results.json). Goal: under 5 % outside local training.

The one-time start is dominated by ``ray.init`` (GCS, raylet and the API server, ~7 s on 2 busy
cores) and by every Ray actor importing torch (+ torchvision through ``fedhead.models``) for the
first message; ``fedhead.run.start_ray`` starts Ray without the ``runtime_env`` flwr would use
(saves ~2.5 s per actor start) while the driver prepares the data.

    python benchmarks/bench_overhead.py                         # the default quickstart
    python benchmarks/bench_overhead.py rounds=2 local_epochs=20
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time


def main(argv: list[str]) -> None:
    from fedhead.config import compose_config, load_config
    from fedhead.run import run_federations

    cfg = load_config(compose_config(argv))
    out = tempfile.mkdtemp(prefix="fedhead-bench-")
    jobs = cfg.jobs(out)
    t0 = time.perf_counter()
    results = run_federations(jobs, show_progress=False)
    wall_all = time.perf_counter() - t0
    rows = []
    for job, res in zip(jobs, results):
        tm = res["timing"]
        phases = tm["phase_seconds"]
        cpus = job.resources.ray_num_cpus or os.cpu_count() or 1
        concurrent = max(1, min(job.settings.num_clients, math.floor(cpus / job.resources.client_cpus)))
        local = tm["client_train_seconds"] / concurrent
        wall = tm["total_seconds"]
        start = tm["startup_seconds"] or 0.0
        if job is jobs[0]:  # data preparation + Ray start before the simulation clock
            start += wall - tm["simulation_seconds"]
        query = phases.get("query", 0.0)
        train_other = max(0.0, phases.get("train", 0.0) - local)
        evaluate = phases.get("evaluate", 0.0)
        server = max(0.0, wall - start - query - phases.get("train", 0.0) - evaluate)
        rows.append((job.name, wall, start, query, local, train_other, evaluate, server))
    head = ("procedure", "wall s", "start s", "exchange s", "local train s", "train msg s",
            "evaluate s", "server s", "outside training")
    print("  ".join(f"{h:>14}" for h in head))
    tot = [0.0] * 7
    for name, *vals in rows:
        tot = [a + b for a, b in zip(tot, vals)]
        print(f"{name:>14}  " + "  ".join(f"{v:14.2f}" for v in vals) + f"  {100 * (1 - vals[3] / vals[0]):13.1f}%")
    print(f"{'total':>14}  " + "  ".join(f"{v:14.2f}" for v in tot) + f"  {100 * (1 - tot[3] / tot[0]):13.1f}%")
    steady = tot[0] - tot[1] - tot[2]
    first = results[0]["timing"] if results else {}
    print(f"\nwall time of the whole call: {wall_all:.1f} s (Ray start {first.get('ray_init_seconds', float('nan')):.1f} s, "
          f"overlapped with the data preparation; outside the procedures' clocks (importing "
          f"flwr.simulation/Ray, actor and Ray shutdown): {wall_all - tot[0]:.1f} s)")
    print(f"share of wall time outside local training: {100 * (1 - tot[3] / tot[0]):.1f}% (goal < 5%)")
    print(f"  without the one-time start (Ray, workers, data) and moment exchange: "
          f"{100 * (1 - tot[3] / steady):.1f}% of {steady:.1f} s")
    print(f"(local training = sum of the clients' training loops / clients running at once; outputs in {out})")


if __name__ == "__main__":
    main(sys.argv[1:])
