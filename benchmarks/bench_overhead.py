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

With ``--clients`` it instead measures the fixed cost per client and round at several client
counts (same total data, only ``num_clients`` changed): for each count it runs one procedure and
reports the simulation time and ``(train + evaluate phases - local training) / (M T)`` in ms.
Goal: <= 20 ms per client-round, not growing with ``M``.

    python benchmarks/bench_overhead.py                         # the default quickstart
    python benchmarks/bench_overhead.py rounds=2 local_epochs=20
    python benchmarks/bench_overhead.py --clients 4 64 256      # scaling (Hopper 4000, model=free)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

SCALING = ("model=free", "rounds=2", "local_epochs=200", "dataset.n_train=4000", "experiment=single",
           "procedure=proximal", "output.tensorboard=false", "output.figures=false",
           "dataset.allow_outside_regime=true")  # 256 clients of ~16 samples leave the regime


def _concurrency(job) -> int:
    cpus = job.resources.ray_num_cpus or os.cpu_count() or 1
    return max(1, min(job.settings.num_clients, math.floor(cpus / job.resources.client_cpus)))


def scaling(counts: list[int], overrides: list[str]) -> list[dict]:
    """Fixed cost per client-round at each client count (one simulation per count)."""
    from fedhead.config import compose_config, load_config
    from fedhead.run import run_federations

    rows = []
    for m in counts:
        cfg = load_config(compose_config([*SCALING, f"num_clients={m}", *overrides]))
        job = cfg.jobs(tempfile.mkdtemp(prefix="fedhead-bench-"))[0]
        res = run_federations([job], show_progress=False)[0]
        tm = res["timing"]
        phases = tm["phase_seconds"]
        local = tm["client_train_seconds"] / _concurrency(job)
        rounds = job.settings.rounds
        fixed = phases.get("train", 0.0) + phases.get("evaluate", 0.0) - local
        row = {"num_clients": m, "simulation_s": tm["simulation_seconds"],
               "startup_s": tm["startup_seconds"], "exchange_s": phases.get("query", 0.0),
               "local_train_s": local, "train_phase_s": phases.get("train", 0.0),
               "evaluate_phase_s": phases.get("evaluate", 0.0),
               "ms_per_client_round": 1000 * fixed / (m * rounds), "ms_per_client_round_steady": None}
        if "phases" in tm and "round_train_seconds" in tm and rounds >= 2:
            # the last round only: no per-process first-use costs (imports, first allocations)
            last = [secs for kind, secs in tm["phases"] if kind in ("train", "evaluate")][-2:]
            steady = sum(last) - tm["round_train_seconds"][-1] / _concurrency(job)
            row["ms_per_client_round_steady"] = 1000 * steady / m
        rows.append(row)
    print(f"{'clients':>8} {'sim s':>8} {'start s':>8} {'exch s':>8} {'local s':>8} {'train s':>8} "
          f"{'eval s':>8} {'ms/client-round':>16} {'last round':>11}")
    for r in rows:
        last = r["ms_per_client_round_steady"]
        print(f"{r['num_clients']:>8} {r['simulation_s']:8.2f} {r['startup_s'] or 0:8.2f} {r['exchange_s']:8.2f} "
              f"{r['local_train_s']:8.2f} {r['train_phase_s']:8.2f} {r['evaluate_phase_s']:8.2f} "
              f"{r['ms_per_client_round']:16.1f} {'-' if last is None else format(last, '11.1f')}")
    print("(fixed cost = train + evaluate phases - local training / clients at once, per client and round, over "
          "all rounds and over the last round alone; goal <= 20 ms)")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Share of a fedhead-run's wall time outside local training, or (--clients) the fixed "
                    "cost per client-round at several client counts.")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rounds=2 local_epochs=20")
    parser.add_argument("--clients", type=int, nargs="+", metavar="M",
                        help="measure the fixed cost per client-round at these client counts")
    parser.add_argument("--json", metavar="PATH", help="also write the measured rows as JSON")
    args = parser.parse_args(argv)
    if args.clients:
        rows = scaling(args.clients, args.overrides)
    else:
        rows = overhead(args.overrides)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def overhead(argv: list[str]) -> list[dict]:
    """The default run's wall-time split (see the module docstring)."""
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
        local = tm["client_train_seconds"] / _concurrency(job)
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
    return [{"procedure": r[0], "wall_s": r[1], "start_s": r[2], "exchange_s": r[3], "local_train_s": r[4],
             "train_msg_s": r[5], "evaluate_s": r[6], "server_s": r[7]} for r in rows] + [
        {"total_wall_s": tot[0], "outside_training_pct": 100 * (1 - tot[3] / tot[0]),
         "outside_training_steady_pct": 100 * (1 - tot[3] / steady)}]


if __name__ == "__main__":
    main()
