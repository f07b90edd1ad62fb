"""Share of a default ``fedhead-run``'s wall time spent outside local training (goal: under 5 %).

Splits every federation's wall time into start, moment exchange, local training, train messages,
evaluation and server work; ``--clients`` measures the fixed cost per client-round instead. What
is counted where, and the measurements so far: benchmarks/README.md.

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

from fedhead.results import schema
from fedhead.results.rounds import ClientMetric
from fedhead.results.schema import Results

SCALING = (
    "model=free",
    "rounds=2",
    "local_epochs=200",
    "dataset.n_train=4000",
    "experiment=single",
    "procedure=proximal",
    "output.tensorboard=false",
    "output.figures=false",
    "dataset.allow_outside_regime=true",
)  # 256 clients of ~16 samples leave the regime


def _concurrency(job) -> int:
    cpus = job.resources.ray_num_cpus or os.cpu_count() or 1
    return max(1, min(job.settings.num_clients, math.floor(cpus / job.resources.client_cpus)))


def fifo_makespan(seconds: list[float], slots: int) -> float:
    """Wall time of running jobs of ``seconds`` in this order on ``slots`` workers, each free
    worker taking the next job (flwr's simulation queues a phase's messages in node order, which
    is partition order, and its ``slots`` actors take them first come first served)."""
    free = [0.0] * max(1, slots)
    for s in seconds:
        i = min(range(len(free)), key=free.__getitem__)
        free[i] += s
    return max(free)


def local_training(res: Results, slots: int) -> tuple[float, float]:
    """``(makespan, mean)`` of a run's local training, summed over the training phases: the FIFO
    makespan of the clients' local computations (``local_seconds``: the whole ``train_local``,
    set-up, epochs and the finishing step; what each phase would take if messaging and every
    other per-message cost were free), and the old ``sum / slots`` of the epoch loops alone
    (``train_seconds``; it counts the finishing step and the idle actor waiting for a straggler
    as overhead)."""
    makespan = mean = 0.0
    train, local = ClientMetric.TRAIN_SECONDS.name, ClientMetric.LOCAL_SECONDS.name
    for rnd in res.rounds:
        cms = rnd.client_metrics
        secs = [float(cm.get(local, cm.get(train, 0.0))) for cm in cms]
        if secs:
            makespan += fifo_makespan(secs, slots)
            mean += sum(float(cm.get(train, 0.0)) for cm in cms) / slots
    return makespan, mean


def scaling(counts: list[int], overrides: list[str]) -> list[dict]:
    """Fixed cost per client-round at each client count (one simulation per count)."""
    from fedhead.driver.simulation import run_federations
    from fedhead.settings.config import compose_config, load_config

    rows = []
    for m in counts:
        cfg = load_config(compose_config([*SCALING, f"num_clients={m}", *overrides]))
        job = cfg.jobs(tempfile.mkdtemp(prefix="fedhead-bench-"))[0]
        tm = schema.from_dict(run_federations([job], show_progress=False)[0]).timing
        phases = tm.phase_seconds
        conc = _concurrency(job)
        # local computation: the whole train_local (set-up, epochs, finishing step) when the
        # clients report it, else the epoch loops alone (older results)
        with_local = bool(tm.client_local_seconds)
        local = (tm.client_local_seconds if with_local else tm.client_train_seconds) / conc
        rounds = job.settings.rounds
        both = phases.get("train", 0.0) + phases.get("evaluate", 0.0)
        row = {
            "num_clients": m,
            "simulation_s": tm.simulation_seconds,
            "startup_s": tm.startup_seconds,
            "exchange_s": phases.get("query", 0.0),
            "local_train_s": local,
            "train_phase_s": phases.get("train", 0.0),
            "evaluate_phase_s": phases.get("evaluate", 0.0),
            "ms_per_client_round": 1000 * (both - local) / (m * rounds),
            "ms_per_client_round_steady": None,
            "ms_per_client_round_epochs_only": 1000 * (both - tm.client_train_seconds / conc) / (m * rounds),
        }
        per_round = tm.round_local_seconds if with_local else tm.round_train_seconds
        if tm.phases and per_round and rounds >= 2:
            # the last round only: no per-process first-use costs (imports, first allocations)
            last = [secs for kind, secs in tm.phases if kind in ("train", "evaluate")][-2:]
            steady = sum(last) - per_round[-1] / conc
            row["ms_per_client_round_steady"] = 1000 * steady / m
        rows.append(row)
    print(
        f"{'clients':>8} {'sim s':>8} {'start s':>8} {'exch s':>8} {'local s':>8} {'train s':>8} "
        f"{'eval s':>8} {'ms/client-round':>16} {'last round':>11} {'epochs only':>12}"
    )
    for r in rows:
        last = r["ms_per_client_round_steady"]
        print(
            f"{r['num_clients']:>8} {r['simulation_s']:8.2f} {r['startup_s'] or 0:8.2f} {r['exchange_s']:8.2f} "
            f"{r['local_train_s']:8.2f} {r['train_phase_s']:8.2f} {r['evaluate_phase_s']:8.2f} "
            f"{r['ms_per_client_round']:16.1f} {'-' if last is None else format(last, '11.1f')} "
            f"{r['ms_per_client_round_epochs_only']:12.1f}"
        )
    print(
        "(fixed cost = train + evaluate phases - local computation (train_local: set-up, epochs, finishing step) / "
        "clients at once, per client and round, over all rounds and over the last round alone; goal <= 20 ms. "
        "'epochs only': the old accounting, which subtracts only the epoch loops and so counts the finishing "
        "step as overhead)"
    )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Share of a fedhead-run's wall time outside local training, or (--clients) the fixed "
        "cost per client-round at several client counts."
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rounds=2 local_epochs=20")
    parser.add_argument(
        "--clients",
        type=int,
        nargs="+",
        metavar="M",
        help="measure the fixed cost per client-round at these client counts",
    )
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
    from fedhead.driver.simulation import run_federations
    from fedhead.settings.config import compose_config, load_config

    cfg = load_config(compose_config(argv))
    out = tempfile.mkdtemp(prefix="fedhead-bench-")
    jobs = cfg.jobs(out)
    t0 = time.perf_counter()
    results = [schema.from_dict(r) for r in run_federations(jobs, show_progress=False)]
    wall_all = time.perf_counter() - t0
    rows, old_local = _procedure_rows(jobs, results)
    tot = _print_procedure_table(rows)
    ray_init = (results[0].timing.ray_init_seconds if results else None) or float("nan")
    steady = _print_shares(tot, wall_all, ray_init, old_local, out)
    return [
        {
            "procedure": r[0],
            "wall_s": r[1],
            "start_s": r[2],
            "exchange_s": r[3],
            "local_train_s": r[4],
            "train_msg_s": r[5],
            "evaluate_s": r[6],
            "server_s": r[7],
        }
        for r in rows
    ] + [
        {
            "total_wall_s": tot[0],
            "call_wall_s": wall_all,
            "outside_training_pct": 100 * (1 - tot[3] / wall_all),
            "outside_training_procedure_clocks_pct": 100 * (1 - tot[3] / tot[0]),
            "outside_training_steady_pct": 100 * (1 - tot[3] / steady),
            "outside_training_old_accounting_pct": 100 * (1 - old_local / tot[0]),
        }
    ]


def _procedure_rows(jobs: list, results: list[Results]) -> tuple[list[tuple], float]:
    """Per procedure ``(name, wall, start, exchange, local training, train messages, evaluate, server)``
    seconds, and the local training of the old accounting summed over procedures."""
    rows = []
    old_local = 0.0
    for job, res in zip(jobs, results):
        tm = res.timing
        phases = tm.phase_seconds
        local, mean_local = local_training(res, _concurrency(job))
        old_local += mean_local
        # figures drawn in the background and waited for after the simulation count as server time
        wall = tm.total_seconds + (tm.figures_wait_seconds or 0.0)
        start = tm.startup_seconds or 0.0
        if job is jobs[0]:  # data preparation + Ray start before the simulation clock
            start += tm.total_seconds - tm.simulation_seconds
        query = phases.get("query", 0.0)
        train_other = phases.get("train", 0.0) - local
        evaluate = phases.get("evaluate", 0.0)
        server = max(0.0, wall - start - query - phases.get("train", 0.0) - evaluate)
        rows.append((job.name, wall, start, query, local, train_other, evaluate, server))
    return rows, old_local


def _print_procedure_table(rows: list[tuple]) -> list[float]:
    """Print one line per procedure and the totals; return the totals of the seven columns."""
    head = (
        "procedure",
        "wall s",
        "start s",
        "exchange s",
        "local train s",
        "train msg s",
        "evaluate s",
        "server s",
        "outside training",
    )
    print("  ".join(f"{h:>14}" for h in head))
    tot = [0.0] * 7
    for name, *vals in rows:
        tot = [a + b for a, b in zip(tot, vals)]
        print(f"{name:>14}  " + "  ".join(f"{v:14.2f}" for v in vals) + f"  {100 * (1 - vals[3] / vals[0]):13.1f}%")
    print(f"{'total':>14}  " + "  ".join(f"{v:14.2f}" for v in tot) + f"  {100 * (1 - tot[3] / tot[0]):13.1f}%")
    return tot


def _print_shares(tot: list[float], wall_all: float, ray_init: float, old_local: float, out: str) -> float:
    """Print the shares of wall time outside local training; return the steady-state seconds."""
    steady = tot[0] - tot[1] - tot[2]
    outside = wall_all - tot[0]
    print(
        f"\nwall time of the whole call: {wall_all:.1f} s, of which outside the procedures' clocks (importing "
        f"flwr.simulation, the engine's end: actors, Ray shutdown) {outside:.1f} s; Ray start "
        f"{ray_init:.1f} s (after the data preparation, inside the first "
        f"procedure's start)"
    )
    print(
        f"share of the whole call's wall time outside local training: {100 * (1 - tot[3] / wall_all):.1f}% (goal < 5%)"
    )
    print(f"  of the procedures' clocks alone: {100 * (1 - tot[3] / tot[0]):.1f}%")
    print(
        f"  without the one-time costs (data, Ray start, worker start and imports in the moment exchange, engine "
        f"import and end): {100 * (1 - tot[3] / steady):.1f}% of {steady:.1f} s"
    )
    print(
        f"  old accounting (local training = sum of the loops / clients at once, so an idle actor waiting "
        f"for a straggler counted as overhead; procedures' clocks): {100 * (1 - old_local / tot[0]):.1f}%"
    )
    print(
        f"(local training = per training phase, the first-come-first-served makespan of the clients' training "
        f"loops on the clients running at once; outputs in {out})"
    )
    return steady


if __name__ == "__main__":
    main()
