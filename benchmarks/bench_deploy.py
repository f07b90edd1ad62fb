"""Benchmark: one job as a loopback deployment (fedhead's site programs, then flwr's) and as a simulation, clear
and secure, 3 and 8 sites.

The own-data setting (docs/own-data.md): every site a CSV file of its own (inputs f1, f2; targets t1, t2),
``dataset=table``, free features, proximal training of one round. For each site count, the deployment is
one SuperLink with TLS and SuperNode authentication and one SuperNode per file on 127.0.0.1 (ClientApps in
subprocess isolation; tests/deploy_helpers.py, the command lines of tests/deploy_commands.py), serving
``flwr run .`` of the clear job, then of the secure one (``privacy.mode=secure``; each site's signing key
and the roster of ``fedhead-keys``). ``deployment`` runs fedhead's site programs (``fedhead-supernode``: a
0.5 s idle pull, pull retries within 0.05 to 0.5 s; ``fedhead-superexec``: ClientApp processes forked from a
warm parent, each FAB installed once), ``flwr-programs``
flwr's ``flower-supernode`` and ``flower-superexec`` on the same files. The simulation is the same jobs
through ``run_federations`` (flwr's Ray simulation, one Ray start per site count: an unmeasured warm-up job,
then the clear and the secure job).

Every phase is the ServerApp's own timing record (results.json ``timing.phases``: each message phase,
from its push to its last reply), whatever steps the protocol runs; they are grouped as:

* the first query phase (the statistics exchange's query);
* the later query phases before training (in secure mode its SecAgg steps and the regime check), median;
* the exchange: every phase before the first training phase;
* round 1: the first training phase and every phase after it up to the next training phase (secure mode:
  its SecAgg steps); a round (mean): every phase from the first training phase on, over the rounds;
* the whole run: ``flwr run`` (the ServerApp's start included), or the job's share of ``run_federations``
  (from the previous job's end: Ray's start and the actors' imports are the warm-up's), wall clock.

Printed side by side with the ratios of one run: secure / clear, fedhead's programs / flwr's, and deployment
/ simulation. The goals ("a deployed round that costs what its training costs"): a query phase of 3 sites on
loopback <= 5 s, a SecAgg step <= 4 s, a secure round <= 1.5 x the clear round.

    python benchmarks/bench_deploy.py                               # 3 and 8 sites, everything
    python benchmarks/bench_deploy.py --sites 3 --where deployment  # one deployment, clear and secure
    python benchmarks/bench_deploy.py --sites 3 --where deployment flwr-programs --rounds 3  # fedhead's vs flwr's
    python benchmarks/bench_deploy.py --keep logs/                  # keep the processes' logs
    python benchmarks/bench_deploy.py --sites 3 --where deployment --profile  # where a message's time goes

``--profile`` runs the deployment with flwr's DEBUG logs (``FLWR_LOG_LEVEL=DEBUG``: timestamps) and splits
every message at every site by its SuperNode's log lines (``PIECES``): the SuperNode's pull wait (from the
ServerApp's push of the phase, the SuperLink's log), the ``flwr-clientapp`` process's start and flwr's imports,
the task input, the FAB's installation, fedhead (the import of ``fedhead.client_app``, the job, the handler)
and the reply's push, the SuperNode's wait for the reply, the send. DEBUG logging itself costs CPU.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "benchmarks")]  # the deployment helpers, the site files

#: the job of every run (the own-data tutorial's columns; computation well under a second per site)
JOB = (
    "dataset=table",
    "dataset.targets=[t1,t2]",
    "model=free",
    "procedure=proximal",
    "local_epochs=50",
    "resources.evaluate_mse=false",
    "output.tensorboard=false",
    "output.figures=false",
)
MODES = ("clear", "secure")
#: fedhead's site programs (fedhead-supernode, fedhead-superexec), flwr's own, and flwr's Ray simulation
WHERE = ("deployment", "flwr-programs", "simulation")
RUN_LIMIT_S = 1200
GOAL_QUERY_S, GOAL_STEP_S, GOAL_ROUND_RATIO = 5.0, 4.0, 1.5


@dataclass
class Run:
    """One job's phases ``[(message type, seconds)]`` in order, its wall clock and its last Gram."""

    phases: list[tuple[str, float]]
    wall: float
    gram: np.ndarray


def measures(run: Run) -> dict[str, float]:
    """The phase groups of the module docstring (NaN where a group is empty)."""
    kinds = [k for k, _ in run.phases]
    if "train" not in kinds:
        raise ValueError(f"the job ran no training phase: {kinds}")
    trains = [i for i, k in enumerate(kinds) if k == "train"] + [len(kinds)]
    before, after = run.phases[: trains[0]], run.phases[trains[0] : trains[1]]
    later = [s for k, s in before[1:] if k == "query"]
    return {
        "phases": float(len(run.phases)),
        "first query phase": before[0][1] if before and before[0][0] == "query" else float("nan"),
        "later query phases (median)": statistics.median(later) if later else float("nan"),
        "exchange": sum(s for _, s in before),
        "round 1": sum(s for _, s in after),
        "round (mean)": sum(s for _, s in run.phases[trains[0] :]) / (len(trains) - 1),
        "whole run": run.wall,
    }


def job_overrides(mode: str, rounds: int) -> list[str]:
    return [*JOB, f"rounds={rounds}", f"privacy.mode={mode}"]


def read_run(out: Path, wall: float) -> Run:
    """The run of results.json under ``out`` (its one procedure), refused unless completed."""
    from fedhead.results import schema

    res = schema.read(next(out.glob("*/results.json")))
    if res.status != "completed":
        raise RuntimeError(f"{out}: the run ended {res.status}")
    return Run([(str(k), float(s)) for k, s in res.timing.phases], wall, np.asarray(res.rounds[-1].gram))


def deployed(
    files: list[Path], work: Path, modes: list[str], rounds: int, env: dict | None = None, flwr_programs: bool = False
) -> dict[str, Run]:
    """Each mode's job through ``flwr run .`` on one loopback federation of the site files (its SuperNodes
    flwr's own programs with ``flwr_programs``)."""
    from deploy_helpers import Processes, flwr, start_site_federation

    keys = files[0].parent / "keys"  # bench_message_cost.write_sites's signing keys and roster
    roster = keys / "roster.json"
    identities = [(str(keys / f"site-{i}.key"), str(roster)) for i in range(len(files))]
    (work / "logs").mkdir(parents=True)
    procs = Processes(work / "logs")
    out: dict[str, Run] = {}
    try:
        env = start_site_federation(work, files, identities, procs, env, flwr_programs=flwr_programs)
        for mode in modes:
            overrides = " ".join(
                [*job_overrides(mode, rounds), "dataset.files=[]", f"dataset.num_clients={len(files)}"]
            )
            config = f"overrides='{overrides}' output-dir='{work / mode}' roster='{roster}'"
            t0 = time.perf_counter()
            res = flwr(["run", ".", "loopback", "--stream", "--run-config", config], env, limit=RUN_LIMIT_S)
            wall = time.perf_counter() - t0
            (work / "logs" / f"flwr-run-{mode}.log").write_text(res.stdout + res.stderr)
            if res.returncode != 0:
                raise RuntimeError(
                    f"flwr run ({mode}) exited {res.returncode}: {res.stdout[-2000:]}{res.stderr[-2000:]}"
                )
            out[mode] = read_run(work / mode, wall)
    finally:
        procs.stop()
    return out


def simulated(files: list[Path], work: Path, modes: list[str], rounds: int) -> dict[str, Run]:
    """Each mode's job in one Ray simulation of ``len(files)`` virtual SuperNodes, after a warm-up job."""
    from fedhead.driver.simulation import run_federations
    from fedhead.settings.config import compose_config, load_config

    listed = f"dataset.files=[{','.join(str(f) for f in files)}]"

    def job(name: str, *overrides: str):
        return load_config(compose_config([*overrides, listed, f"dataset.num_clients={len(files)}"])).jobs(work / name)[
            0
        ]

    jobs = [job("warm-up", *job_overrides(modes[0], 1), "local_epochs=1")]
    jobs += [job(mode, *job_overrides(mode, rounds)) for mode in modes]
    ends: list[float] = []
    t0 = time.perf_counter()
    run_federations(jobs, show_progress=False, on_job_end=lambda _i, _r: ends.append(time.perf_counter()))
    starts = [t0, *ends[:-1]]
    return {mode: read_run(work / mode, ends[k + 1] - starts[k + 1]) for k, mode in enumerate(modes)}


#: The SuperNode's log lines (flwr 1.42, ``FLWR_LOG_LEVEL=DEBUG``) that end each piece of one message, in order.
PIECES = (
    ("SuperNode's pull wait", "Receiving: "),
    ("process start", "DEBUG logs enabled"),
    ("flwr's imports", "Start `flwr-clientapp` process"),
    ("task input", "[flwr-clientapp] Start FAB installation."),
    ("FAB install", "[flwr-clientapp] Start `ClientApp` Loading."),
    ("fedhead import, job, handler, reply", "Finished task"),
    ("SuperNode sees the reply", "Sending: "),
    ("send to the SuperLink", "Sent successfully"),
)
STAMP = re.compile(r"^(?:\x1b\[[0-9;]*m)*[A-Z]+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def stamped(path: Path) -> list[tuple[float, str]]:
    """``(time, line)`` of every timestamped line of a flwr log (DEBUG level)."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if m := STAMP.match(line):
            out.append((time.mktime(time.strptime(m[1][:19], "%Y-%m-%d %H:%M:%S")) + int(m[1][20:]) / 1e3, line))
    return out


def message_pieces(logs: Path) -> dict[str, list[dict[str, float]]]:
    """Per message type, one dict per message at a site: each piece's seconds (``PIECES``: from the previous
    piece's line to its own, the first such line from the message's ``Receiving`` to the next; a line before
    it counts from there, a missing one leaves its piece out). The pull wait counts from the ServerApp's push of
    the phase (the SuperLink's ``Runtime.PushMessages``)."""
    pushes = [t for t, line in stamped(logs / "superlink.log") if line.endswith("Runtime.PushMessages")]
    out: dict[str, list[dict[str, float]]] = {}
    for node in sorted(logs.glob("supernode*.log")):
        lines = stamped(node)
        starts = [i for i, (_, line) in enumerate(lines) if "Receiving: " in line] + [len(lines)]
        for a, b in zip(starts, starts[1:]):
            t0, head = lines[a]
            seen = {PIECES[0][0]: t0}
            for t, line in lines[a + 1 : b]:
                for name, mark in PIECES[1:]:
                    if mark in line and name not in seen:
                        seen[name] = max(t, t0)
            record = {PIECES[0][0]: t0 - max((p for p in pushes if p <= t0), default=t0)}
            last = t0
            for name, _ in PIECES[1:]:
                if name in seen:
                    record[name], last = seen[name] - last, seen[name]
            out.setdefault(head.split("Receiving: ")[1].split()[0], []).append(record)
    return out


def profile(logs: Path) -> list[str]:
    """Median and maximum of each piece over the messages of each type (seconds)."""
    lines = []
    for kind, records in message_pieces(logs).items():
        lines.append(f"{kind} messages ({len(records)} at the sites)        median      max")
        for name, _ in PIECES:
            values = [r[name] for r in records if name in r]
            if values:
                lines.append(f"  {name:<40}{statistics.median(values):8.2f}{max(values):9.2f}")
        whole = [sum(r.values()) for r in records]
        lines.append(f"  {'push to the reply at the SuperLink':<40}{statistics.median(whole):8.2f}{max(whole):9.2f}")
    return lines


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if np.isfinite(a) and np.isfinite(b) and b > 0 else "-"


def table(sites: int, runs: dict[tuple[str, str], Run]) -> list[str]:
    """The side-by-side lines of one site count: each run's measures, then the ratios."""
    cols = [key for key in ((w, m) for w in WHERE for m in MODES) if key in runs]
    got = {key: measures(runs[key]) for key in cols}
    pairs = [(f"{w[:3]} sec/clr", (w, "secure"), (w, "clear")) for w in WHERE]
    pairs += [(f"dep/flw {m[:3]}", ("deployment", m), ("flwr-programs", m)) for m in MODES]
    pairs += [(f"dep/sim {m[:3]}", ("deployment", m), ("simulation", m)) for m in MODES]
    pairs = [p for p in pairs if p[1] in got and p[2] in got]
    head = f"{'M = ' + str(sites) + ' sites (s)':<30}" + "".join(f"{w[:3] + ' ' + m:>12}" for w, m in cols)
    lines = [head + "".join(f"{label:>13}" for label, _, _ in pairs)]
    for name in next(iter(got.values())):
        cells = "".join(f"{got[key][name]:12.1f}" for key in cols)
        lines.append(f"{name:<30}{cells}" + "".join(f"{ratio(got[a][name], got[b][name]):>13}" for _, a, b in pairs))
    for mode in MODES:  # the same job's result wherever it ran
        for other in WHERE[1:]:
            if ("deployment", mode) in runs and (other, mode) in runs:
                a, b = runs["deployment", mode].gram, runs[other, mode].gram
                lines.append(
                    f"{mode} Gram, deployment vs {other}: {np.linalg.norm(a - b) / np.linalg.norm(b):.1e} relative"
                )
    return lines


def goals(runs: dict[int, dict[tuple[str, str], Run]]) -> list[str]:
    """The issue's goals against each deployment's measures (fedhead's site programs, flwr's)."""
    out = []
    for where in WHERE[:2]:
        three = runs.get(3, {})
        if (where, "clear") in three:
            q = measures(three[where, "clear"])["first query phase"]
            out.append(f"query phase, 3 sites, {where}: {q:.1f} s (goal <= {GOAL_QUERY_S:g} s)")
        for sites, by in runs.items():
            if (where, "secure") in by:
                step = measures(by[where, "secure"])["later query phases (median)"]
                out.append(
                    f"SecAgg step (median later query phase), {sites} sites, {where}: {step:.1f} s "
                    f"(goal <= {GOAL_STEP_S:g} s)"
                )
            if (where, "secure") in by and (where, "clear") in by:
                for name in ("round 1", "round (mean)"):
                    r = measures(by[where, "secure"])[name] / measures(by[where, "clear"])[name]
                    out.append(f"secure / clear {name}, {sites} sites, {where}: {r:.2f} (goal <= {GOAL_ROUND_RATIO:g})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sites", type=int, nargs="+", default=[3, 8], help="site counts (default 3 8; at least 3)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--where", nargs="+", choices=WHERE, default=list(WHERE))
    ap.add_argument("--rounds", type=int, default=1, help="training rounds per job (default 1)")
    ap.add_argument("--rows", type=int, default=100, help="rows per site file (default 100)")
    ap.add_argument("--keep", type=Path, default=None, help="copy the work folder (logs, results) here")
    ap.add_argument("--profile", action="store_true", help="flwr's DEBUG logs; print where each message's time went")
    args = ap.parse_args(argv)
    if min(args.sites) < 3:
        ap.error("--sites: secure mode needs at least 3 sites")
    if args.rounds < 1 or args.rows < 10:
        ap.error("--rounds must be at least 1 and --rows at least 10")
    from bench_message_cost import write_sites

    runs: dict[int, dict[tuple[str, str], Run]] = {}
    profiles: dict[tuple[int, str], list[str]] = {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fedhead-bench-deploy-") as tmp:
        for sites in args.sites:
            work = Path(tmp) / f"sites{sites}"
            (work / "data").mkdir(parents=True)
            write_sites(work / "data", sites, args.rows)
            files = sorted((work / "data").glob("site*.csv"), key=lambda p: int(p.stem[4:]))
            by = runs.setdefault(sites, {})
            for where in args.where:
                env = {"FLWR_LOG_LEVEL": "DEBUG"} if args.profile else None
                if where == "simulation":
                    got = simulated(files, work / where, args.modes, args.rounds)
                else:
                    got = deployed(files, work / where, args.modes, args.rounds, env, where == "flwr-programs")
                by.update({(where, m): r for m, r in got.items()})
                if args.profile and where != "simulation":
                    profiles[(sites, where)] = profile(work / where / "logs")
        if args.keep is not None:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
    print(
        f"{os.cpu_count()} CPUs, load average {load:.1f} -> {os.getloadavg()[0]:.1f}; {args.rounds} round(s), "
        f"{args.rows} rows per site; phases from results.json timing.phases"
    )
    for sites, by in runs.items():
        print("\n".join(table(sites, by)))
    print("\n".join(goals(runs)))
    for (sites, where), lines in profiles.items():
        print(f"where a deployed message's time went, {where}, M = {sites} sites (both modes; seconds):")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
