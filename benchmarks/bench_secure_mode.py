"""Benchmark: ``privacy.mode=secure`` against clear mode, 8 sites, both in one Ray simulation.

Goals (the secure mode's issue): the exchange's wall time grows by at most 2 s, a round's by at most 20 %
(secure / clear <= 1.2), on a setting with realistic local training.

One ``run_federations`` call (one Ray start, ``num_clients`` virtual SuperNodes, flwr's Message API
between the ServerApp and the ClientApps in Ray actors) serves, one after another: a warm-up job
(secure, one round of one epoch: every actor imports flwr, torch, the crypto and the model and loads
the data set before anything is timed), then for each setting the same job in clear and in secure
mode. Settings:

* ``resmlp_small``: the quickstart's (hopper, ResMLP-small, proximal, up to 2000 local epochs per
  round stopped at a local gap of 1e-4, rho = 1e-5), 400 transitions over the sites: a round's local
  training is seconds to tens of seconds, as a real job's;
* ``tiny``: the same data with free features (``model=free``) and 20 local epochs, where the
  messages and the crypto are most of a round.

Measured from the ServerApp's message phases (``ProgressGrid.send_and_receive``, timed here) and the
jobs' ends: the exchange is from the first message of a job to its first training message (the
statistics/moment query, in secure mode its four SecAgg steps and the server's unmasking, and the
diagnosis); round ``t`` from its training message to the next round's (the last: to the job's end),
i.e. training, evaluation, their SecAgg steps and every piece of server work. Bytes per site: the
protobuf size of every message to a site (it receives) and of its replies (it sends), as a SuperLink
carries them (gRPC and TLS framing not counted), averaged over the sites; the time spent measuring
them is left out of every interval.

Usage::

    python benchmarks/bench_secure_mode.py                        # 8 sites, both settings, 2 rounds
    python benchmarks/bench_secure_mode.py --settings tiny --rounds 3
    python benchmarks/bench_secure_mode.py --quick                # smoke run: 3 sites, tiny, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: each setting's Hydra overrides (the same data set config in all: the actors load it once)
SETTINGS: dict[str, tuple[str, ...]] = {
    "resmlp_small": (
        "model=resmlp_small",
        "local_epochs=2000",
        "local_tol=1e-4",
        "rho=1e-5",
        "train.lr=3e-3",
    ),
    "tiny": ("model=free", "local_epochs=20"),
}
COMMON = (
    "dataset=hopper",
    "dataset.n_train=400",
    "procedure=proximal",
    "output.tensorboard=false",
    "output.figures=false",
)
#: the warm-up job (not measured): secure, one round of one epoch of the first setting's model
WARM_UP = ("rounds=1", "local_epochs=1", "local_tol=null", "privacy.mode=secure")
GOAL_EXCHANGE_S = 2.0
GOAL_ROUND_RATIO = 1.2


@dataclass
class Phase:
    """One message phase of the ServerApp: its type, its wall clock, the bytes each site received and sent."""

    kind: str
    start: float
    end: float
    received: dict[int, int] = field(default_factory=dict)  # node -> bytes of the messages to it
    sent: dict[int, int] = field(default_factory=dict)  # node -> bytes of its replies
    measuring: float = 0.0  # seconds spent here sizing the messages (after ``end``)


class PhaseLog:
    """Times every ``ProgressGrid.send_and_receive`` of the ServerApp (the driver's thread) and sizes its messages."""

    def __init__(self) -> None:
        self.phases: list[Phase] = []
        self.job_ends: list[float] = []

    @contextlib.contextmanager
    def recording(self):
        from flwr.common.serde import message_to_proto

        from fedhead.federation.progress_grid import ProgressGrid

        original = ProgressGrid.send_and_receive
        log = self

        def send_and_receive(grid, messages, *, timeout=None):
            messages = list(messages)
            start = time.perf_counter()
            replies = original(grid, messages, timeout=timeout)
            end = time.perf_counter()
            if not messages:
                return replies
            phase = Phase(messages[0].metadata.message_type, start, end)
            for m in messages:
                node = int(m.metadata.dst_node_id)
                phase.received[node] = phase.received.get(node, 0) + message_to_proto(m).ByteSize()
            for r in replies:
                node = int(r.metadata.src_node_id)
                phase.sent[node] = phase.sent.get(node, 0) + message_to_proto(r).ByteSize()
            phase.measuring = time.perf_counter() - end
            log.phases.append(phase)
            return replies

        ProgressGrid.send_and_receive = send_and_receive  # type: ignore[method-assign]
        try:
            yield self
        finally:
            ProgressGrid.send_and_receive = original  # type: ignore[method-assign]

    def job_ended(self, index: int, _results) -> None:
        self.job_ends.append(time.perf_counter())


@dataclass
class JobTimes:
    """One job's exchange and rounds: seconds, and bytes per site (mean over the sites) received and sent."""

    exchange_s: float
    rounds_s: list[float]
    work_s: list[float]  # per round: its train and evaluate phases (the clients' local work and those messages)
    exchange_bytes: tuple[float, float]
    round_bytes: tuple[float, float]  # mean over the rounds
    phases: int  # message phases of the whole job

    @property
    def rest_s(self) -> list[float]:
        """Per round: everything but its train and evaluate phases (SecAgg steps, server work)."""
        return [r - w for r, w in zip(self.rounds_s, self.work_s, strict=True)]


def _between(phases: list[Phase], start: float, end: float) -> float:
    """Wall time from ``start`` to ``end`` less the time spent sizing messages in between."""
    return end - start - sum(p.measuring for p in phases if start <= p.end < end)


def _per_site(phases: list[Phase]) -> tuple[float, float]:
    nodes = {n for p in phases for n in p.received}
    if not nodes:
        return 0.0, 0.0
    received = sum(sum(p.received.values()) for p in phases) / len(nodes)
    sent = sum(sum(p.sent.values()) for p in phases) / len(nodes)
    return received, sent


def job_times(phases: list[Phase], end: float) -> JobTimes:
    """Split one job's phases (in order) into its exchange and rounds ([module docstring](#))."""
    trains = [i for i, p in enumerate(phases) if p.kind == "train"]
    if not trains:
        raise ValueError("the job ran no training round")
    starts = [phases[i].start for i in trains] + [end]
    rounds = [_between(phases, a, b) for a, b in zip(starts, starts[1:])]
    spans = list(zip(trains, trains[1:] + [len(phases)]))
    per_round = [_per_site(phases[i:j]) for i, j in spans]
    work = [sum(p.end - p.start for p in phases[i:j] if p.kind in ("train", "evaluate")) for i, j in spans]
    return JobTimes(
        exchange_s=_between(phases, phases[0].start, phases[trains[0]].start),
        rounds_s=rounds,
        work_s=work,
        exchange_bytes=_per_site(phases[: trains[0]]),
        round_bytes=(float(np.mean([b[0] for b in per_round])), float(np.mean([b[1] for b in per_round]))),
        phases=len(phases),
    )


def split_jobs(log: PhaseLog) -> list[list[Phase]]:
    """The phases of each job, by the jobs' ends (jobs run one after another)."""
    out, begin = [], float("-inf")
    for end in log.job_ends:
        out.append([p for p in log.phases if begin <= p.start < end])
        begin = end
    return out


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def job_order(settings: list[str], repeat: int) -> list[tuple[str, str]]:
    """``(setting, mode)`` of the measured jobs, in order: per setting ``repeat`` clear/secure pairs, the
    order alternating (clear secure, secure clear, ...) so that a drift of the machine's load cancels."""
    order = []
    for s in settings:
        for i in range(repeat):
            order += [(s, "clear"), (s, "secure")] if i % 2 == 0 else [(s, "secure"), (s, "clear")]
    return order


def make_jobs(order: list[tuple[str, str]], sites: int, rounds: int, out: Path, extra: list[str]):
    """The warm-up job, then the jobs of ``order`` (all with ``sites`` clients)."""
    from fedhead.settings.config import compose_config, load_config

    def job(name: str, *overrides: str):
        cfg = load_config(compose_config([*COMMON, f"num_clients={sites}", *overrides, *extra]))
        return cfg.jobs(out / name)[0]

    jobs = [job("warm-up", *SETTINGS[order[0][0]], *WARM_UP)]
    for k, (s, mode) in enumerate(order):
        jobs.append(job(f"{k}-{s}-{mode}", *SETTINGS[s], f"rounds={rounds}", f"privacy.mode={mode}"))
    return jobs


def combine(runs: list[JobTimes]) -> JobTimes:
    """The jobs of one setting and mode together: mean exchange and bytes, every round."""
    return JobTimes(
        exchange_s=float(np.mean([r.exchange_s for r in runs])),
        rounds_s=[x for r in runs for x in r.rounds_s],
        work_s=[x for r in runs for x in r.work_s],
        exchange_bytes=tuple(np.mean([r.exchange_bytes for r in runs], axis=0).tolist()),  # type: ignore[arg-type]
        round_bytes=tuple(np.mean([r.round_bytes for r in runs], axis=0).tolist()),  # type: ignore[arg-type]
        phases=round(float(np.mean([r.phases for r in runs]))),
    )


def _kib(b: float) -> str:
    return f"{b / 1024:.1f}"


def print_table(settings: list[str], times: dict[tuple[str, str], JobTimes]) -> list[str]:
    """Print the side-by-side table; return the goals' verdicts, one line per setting."""
    print(f"{'setting':<13} {'measure':<30} {'clear':>9} {'secure':>9} {'secure-clear':>13} {'secure/clear':>13}")
    for s in settings:
        c, x = times[(s, "clear")], times[(s, "secure")]
        rows = [
            ("exchange s", c.exchange_s, x.exchange_s, False),
            (f"round s (mean of {len(c.rounds_s)})", np.mean(c.rounds_s), np.mean(x.rounds_s), False),
            ("round: train+evaluate phases s", np.mean(c.work_s), np.mean(x.work_s), False),
            ("round: the rest s", np.mean(c.rest_s), np.mean(x.rest_s), False),
            ("exchange KiB/site received", c.exchange_bytes[0], x.exchange_bytes[0], True),
            ("exchange KiB/site sent", c.exchange_bytes[1], x.exchange_bytes[1], True),
            ("round KiB/site received", c.round_bytes[0], x.round_bytes[0], True),
            ("round KiB/site sent", c.round_bytes[1], x.round_bytes[1], True),
            ("message phases (whole job)", c.phases, x.phases, False),
        ]
        for name, a, b, kib in rows:
            shown = (_kib(a), _kib(b), (b - a) / 1024) if kib else (f"{a:.2f}", f"{b:.2f}", b - a)
            ratio = b / a if a else float("nan")
            print(f"{s:<13} {name:<30} {shown[0]:>9} {shown[1]:>9} {shown[2]:>+13.2f} {ratio:>13.2f}")
    verdicts = []
    for s in settings:
        c, x = times[(s, "clear")], times[(s, "secure")]
        extra = x.exchange_s - c.exchange_s
        ratio = float(np.mean(x.rounds_s) / np.mean(c.rounds_s))
        # the secure round with the clear round's train and evaluate phases: what secure mode adds, less the
        # local training's noise
        same_work = float((np.mean(c.rounds_s) + np.mean(x.rest_s) - np.mean(c.rest_s)) / np.mean(c.rounds_s))
        verdicts.append(
            f"{s}: exchange secure - clear {extra:+.2f} s (goal <= {GOAL_EXCHANGE_S:g} s: "
            f"{'met' if extra <= GOAL_EXCHANGE_S else 'not met'}); round secure / clear {ratio:.2f} "
            f"(goal <= {GOAL_ROUND_RATIO:g}: {'met' if ratio <= GOAL_ROUND_RATIO else 'not met'}), "
            f"{same_work:.2f} with clear's train and evaluate phases"
        )
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for every job (e.g. dataset.n_train=800)")
    parser.add_argument("--sites", type=int, default=8, help="number of sites M (at least 3; default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per measured job (default 2)")
    parser.add_argument("--repeat", type=int, default=2, help="clear/secure pairs per setting, alternating (default 2)")
    parser.add_argument(
        "--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS), help="settings to run (default all)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 sites, the tiny setting, 1 round, 1 pair")
    parser.add_argument("--json", metavar="PATH", help="also write the measurements as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.sites, args.rounds, args.repeat, args.settings = 3, 1, 1, ["tiny"]
    if args.sites < 3:
        parser.error(f"--sites must be at least 3 (secure mode refuses fewer), got {args.sites}")
    if args.rounds < 1 or args.repeat < 1:
        parser.error("--rounds and --repeat must be at least 1")

    from fedhead.driver.simulation import run_federations
    from fedhead.results import schema

    order = job_order(args.settings, args.repeat)
    out = tempfile.TemporaryDirectory(prefix="fedhead-bench-secure-")  # the jobs' folders, removed at the end
    jobs = make_jobs(order, args.sites, args.rounds, Path(out.name), args.overrides)
    cpus = jobs[0].resources.ray_num_cpus or os.cpu_count() or 1
    concurrency = max(1, min(args.sites, math.floor(cpus / jobs[0].resources.client_cpus)))
    load = os.getloadavg()[0]
    log = PhaseLog()
    t0 = time.perf_counter()
    with out, log.recording():
        results = [schema.from_dict(r) for r in run_federations(jobs, show_progress=False, on_job_end=log.job_ended)]
    wall = time.perf_counter() - t0
    print(
        f"M = {args.sites} sites, Ray simulation ({os.cpu_count()} CPUs, {concurrency} clients at once), "
        f"{args.rounds} round(s) per job, {args.repeat} clear/secure pair(s) per setting, one run of {len(jobs)} jobs "
        f"({wall:.0f} s, load average {load:.1f} -> {os.getloadavg()[0]:.1f})"
    )
    if len(log.job_ends) != len(jobs) or any(r.status != "completed" for r in results):
        print(f"error: not every job completed: {[r.status for r in results]}", file=sys.stderr)
        return 1
    per_job = split_jobs(log)
    runs: dict[tuple[str, str], list[JobTimes]] = {}
    final: dict[tuple[str, str], list] = {}
    for k, key in enumerate(order, start=1):
        runs.setdefault(key, []).append(job_times(per_job[k], log.job_ends[k]))
        final.setdefault(key, []).append(results[k])
    times = {key: combine(v) for key, v in runs.items()}
    verdicts = print_table(args.settings, times)
    checks = []
    for s in args.settings:
        clear, secure = final[(s, "clear")][0], final[(s, "secure")][0]
        checks.append(
            f"{s}: G_cen secure vs clear {_rel(secure.targets['g_cen'], clear.targets['g_cen']):.1e} relative, "
            f"final Gram {_rel(secure.rounds[-1].gram, clear.rounds[-1].gram):.1e}"
        )
    for line in verdicts + checks:
        print(line)
    if args.json:
        rows = {f"{s}/{m}": [vars(t) for t in v] for (s, m), v in runs.items()}
        Path(args.json).write_text(json.dumps({"sites": args.sites, "rounds": args.rounds, "jobs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
