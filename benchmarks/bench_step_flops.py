"""Benchmark: the FLOP rate of the fixed-E tabular training step at scale=cpu, before and after the
written-out ResMLP step, against the matmuls of the same shapes, on 1 and on 2 threads.

The step is one client's step of the ``rho`` preset at ``scale=cpu`` (the ``epochs`` and
``full_model`` presets run the same step): Hopper (11 inputs, 3 targets), 400 training rows over 4
clients, so a full batch of 100 rows; the CPU ResMLP (width 256, 3 residual blocks) with ``P = 64``
features; the proximal term (``rho = 1e-3``), no tolerance stop, the default recipe with the
scale's learning rate. The shapes are read from ``fedhead.sweep.scales.CPU``, the model's yaml and
the Hopper task. Same process, same seeded data and model initialisation:

* before: [`fedhead.train.train_local`][fedhead.train.train_local] with ``fast_step=False``
  (autograd and ``torch.optim.AdamW``, the trainer's reference path);
* after: ``fast_step=True`` (``fedhead.train.resmlp_step``: the same results, bit for bit);
* the step's FLOPs: ``torch.utils.flop_counter`` over the reference step's forward and backward
  (the matmuls; the elementwise work is not counted);
* the GEMMs of the same shapes: every ``Linear`` of the step on the batch's rows, forward
  ``addmm``, weight gradient ``g^T x`` and input gradient ``g W`` (none for the first layer), in
  the step's order with the step's memory layouts and a weight per layer, timed back to back: the
  rate the step's own matmuls reach with nothing else to do. Also one ``100 x 256 x 256`` matmul
  repeated on the same operands (cache-hot: a higher rate).

Step times are the trainer's own clock around its epoch loop (``LocalMetrics.steps_per_second``:
the whole step, optimizer and clip included, set-up and finishing excluded). ``--repeats``
interleaved before/after pairs (the order alternates), the GEMMs timed right after each pair for
as long as the step ran; times and rates are medians, the speed-up and the shares of the GEMMs'
rate are medians of the per-pair values (so a load that drifts hits both sides of a pair alike).
Rows: one per ``--threads`` (one process, torch's intra-op threads), and ``2 x 1``: two processes
of one thread each running the same pairs at the same time, each against its own GEMMs under the
same load (the way a simulation's clients, one CPU each, use both cores).
Goal: after >= 70 % of the GEMMs' rate, on 1 thread and on both cores.

Usage::

    python benchmarks/bench_step_flops.py                    # 1 and 2 threads and 2 x 1, 200 steps, 7 pairs
    python benchmarks/bench_step_flops.py --threads 1 --steps 1000 --repeats 3 --out results/step_flops.json
    python benchmarks/bench_step_flops.py --quick            # smoke run (a few seconds)
"""

from __future__ import annotations

import os

# numpy's BLAS (the trainer's last-layer solves, outside the timed loop) on one thread, as in a
# 1-CPU Ray actor (Ray sets OMP_NUM_THREADS): its spinning threads stretch every call on a busy machine
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import copy
import dataclasses
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedhead.data.mujoco import TASKS
from fedhead.models import ResMLPConfig, build_backbone, build_head
from fedhead.results.io import provenance, write_json_atomic
from fedhead.sweep.scales import CPU
from fedhead.train import LocalProblem, TrainConfig, train_local
from fedhead.train.steps import forward_loss

ROOT = Path(__file__).resolve().parents[1]
SETTING = "hopper"
RHO = 1e-3
GOAL = 0.70


def _override(overrides: tuple[str, ...], key: str) -> str | None:
    """The value of the last ``key=value`` in ``overrides``."""
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key]
    return values[-1] if values else None


@dataclass(frozen=True)
class Shapes:
    """The tabular step of a scale: ``rows`` (a full batch), ``inputs`` ``F``, ``targets`` ``C``,
    the ResMLP's ``width`` and ``depth``, ``features`` ``P``; ``lr`` the scale's learning rate."""

    rows: int
    inputs: int
    targets: int
    width: int
    depth: int
    features: int
    lr: float
    lambda_h: float
    lambda_w: float

    @classmethod
    def cpu_scale(cls) -> Shapes:
        ov = CPU.tabular + CPU.extra
        conf = ROOT / "conf"
        top = yaml.safe_load((conf / "config.yaml").read_text())
        model = yaml.safe_load((conf / "model" / f"{_override(ov, 'model')}.yaml").read_text())
        data = yaml.safe_load((conf / "dataset" / f"{SETTING}.yaml").read_text())
        n_train = int(_override(ov, "dataset.n_train") or data["n_train"])
        rows = n_train // int(data["num_clients"])
        batch = int(_override(ov, "train.batch_size") or top["train"]["batch_size"])
        if batch < rows:
            raise SystemExit(f"scale=cpu trains {rows}-row clients in batches of {batch}: not a full-batch step")
        task = TASKS[SETTING]
        return cls(
            rows=rows,
            inputs=task.obs_dim,
            targets=task.act_dim,
            width=int(_override(ov, "model.width") or model["width"]),
            depth=int(_override(ov, "model.depth") or model["depth"]),
            features=int(_override(ov, "model.feature_dim") or model["feature_dim"]),
            lr=float(_override(ov, "train.lr") or top["train"]["lr"]),
            lambda_h=float(top["lambda_h"]),
            lambda_w=float(top["lambda_w"]),
        )

    def linears(self) -> list[tuple[int, int]]:
        """``(in, out)`` of every ``Linear`` of the step in forward order, the head last."""
        w = self.width
        return [(self.inputs, w)] + [(w, w)] * (2 * self.depth) + [(w, self.features), (self.features, self.targets)]

    def describe(self) -> str:
        return (
            f"ResMLP {self.inputs} -> {self.width} ({self.depth} blocks) -> {self.features}, head "
            f"{self.features} -> {self.targets}, {self.rows} rows (full batch), rho {RHO:g}, lr {self.lr:g}"
        )


def make_problem(s: Shapes, seed: int = 0) -> tuple[nn.Module, nn.Linear, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(s.rows, s.inputs, generator=g), torch.randn(s.rows, s.targets, generator=g)
    bb = build_backbone(ResMLPConfig(width=s.width, depth=s.depth, feature_dim=s.features), (s.inputs,), s.rows, seed)
    return bb, build_head(s.features, s.targets, seed=seed + 1), x, y


def step_flops(s: Shapes) -> int:
    """FLOPs of one step's forward and backward (the reference path), counted by torch."""
    bb, head, x, y = make_problem(s)
    with FlopCounterMode(display=False) as counter:
        loss, _ = forward_loss(bb, head.weight, head.bias.detach(), x, y, s.lambda_h, False, None, True)
        loss.backward()
    return int(counter.get_total_flops())


def gemm_list(s: Shapes) -> list[tuple[int, int, int]]:
    """``(M, K, N)`` of every GEMM of the step: per ``Linear(K, N)`` on ``M`` rows the forward, the
    weight gradient and (not for the first layer, whose input needs none) the input gradient."""
    out = []
    for i, (k, n) in enumerate(s.linears()):
        out += [(s.rows, k, n)] * (2 if i == 0 else 3)
    return out


class Gemms:
    """The step's GEMMs with the step's layouts (``nn.Linear``'s ``W (N, K)``; ``addmm(b, x, W^T)``,
    ``g^T x``, ``g W``), a weight per layer, run back to back."""

    def __init__(self, s: Shapes):
        m = s.rows
        self.layers = [
            tuple(torch.randn(*shape) for shape in ((m, k), (n, k), (n,), (m, n), (m, n), (m, k), (n, k)))
            for k, n in s.linears()
        ]
        self.flops = 2.0 * sum(m_ * k * n for m_, k, n in gemm_list(s))

    def run(self) -> None:
        for x, w, b, y, _, _, _ in self.layers:
            torch.addmm(b, x, w.t(), out=y)
        for i in reversed(range(len(self.layers))):
            x, w, _, _, gy, gx, gw = self.layers[i]
            torch.mm(gy.t(), x, out=gw)
            if i > 0:
                torch.mm(gy, w, out=gx)


def flop_rate(fn, flops: float, min_seconds: float) -> float:
    """FLOP/s of ``fn`` (``flops`` per call), timed for at least ``min_seconds`` after a warm-up."""
    for _ in range(3):
        fn()
    reps, elapsed, t0 = 0, 0.0, time.perf_counter()
    while elapsed < min_seconds:
        for _ in range(5):
            fn()
        reps += 5
        elapsed = time.perf_counter() - t0
    return flops * reps / elapsed


def one_matmul(m: int, k: int, n: int):
    x, w, y = torch.randn(m, k), torch.randn(n, k), torch.empty(m, n)
    return lambda: torch.mm(x, w.t(), out=y), 2.0 * m * k * n


def train_seconds_per_step(s: Shapes, model, steps: int, fast: bool) -> float:
    bb, head, x, y = copy.deepcopy(model)
    w_t = head.weight.detach().double().numpy().copy()  # the broadcast head the client starts from
    cfg = TrainConfig(lr=s.lr, finish_rotation=False, fast_step=fast)
    problem = LocalProblem(epochs=steps, lambda_h=s.lambda_h, lambda_w=s.lambda_w, rho=RHO)
    res = train_local(bb, head, x, y, cfg, problem, broadcast_weight=w_t, device="cpu", seed=0)
    assert res.metrics.n_steps == steps
    return 1.0 / res.metrics.steps_per_second


@dataclass
class Pairs:
    """The raw timings of a row: per pair the before and after seconds per step, the GEMMs' and the
    single GEMM's FLOP/s timed after it; ``single_gemm`` the ``(M, K, N)`` of that GEMM."""

    before: list[float]
    after: list[float]
    gemm_rates: list[float]
    single_rates: list[float]
    single_gemm: list[int]


def time_pairs(s: Shapes, threads: int, steps: int, repeats: int, barrier=None) -> Pairs:
    """``repeats`` interleaved before/after pairs on ``threads`` torch threads, the GEMMs timed after
    each pair; with ``barrier`` (a process of ``run_processes``) each pair starts with the other
    processes'."""
    torch.set_num_threads(threads)
    model = make_problem(s)
    gemms = Gemms(s)
    dom = max(s.linears(), key=lambda kn: kn[0] * kn[1])
    single, single_flops = one_matmul(s.rows, *dom)
    for fast in (False, True):  # warm-up: allocator, MKL buffers, first torch.optim use
        train_seconds_per_step(s, model, 5, fast)
    pairs = Pairs([], [], [], [], [s.rows, *dom])
    for i in range(repeats):
        if barrier is not None:
            barrier.wait(timeout=600)
        order = (False, True) if i % 2 == 0 else (True, False)
        for fast in order:
            (pairs.after if fast else pairs.before).append(train_seconds_per_step(s, model, steps, fast))
        pairs.gemm_rates.append(flop_rate(gemms.run, gemms.flops, min_seconds=steps * pairs.after[-1]))
        pairs.single_rates.append(flop_rate(single, single_flops, min_seconds=0.2))
    return pairs


def summarize(pairs: Pairs, flops: int, **head) -> dict:
    """One row of the table (and of the JSON) from the pairs: ``head`` first, then medians of the
    times and rates, and the speed-up and the shares of the GEMMs' rate as medians of per-pair values."""
    med = statistics.median
    before, after, gemm_rates = pairs.before, pairs.after, pairs.gemm_rates
    b, a, g = med(before), med(after), med(gemm_rates)
    speedups = [x / y for x, y in zip(before, after, strict=True)]
    before_of = [flops / x / r for x, r in zip(before, gemm_rates, strict=True)]
    after_of = [flops / x / r for x, r in zip(after, gemm_rates, strict=True)]
    return {
        **head,
        "step_flops": flops,
        "before_ms": b * 1e3,
        "after_ms": a * 1e3,
        "speedup": med(speedups),
        "speedup_each_pair": speedups,
        "before_gflops": flops / b / 1e9,
        "after_gflops": flops / a / 1e9,
        "gemms_gflops": g / 1e9,
        "single_gemm": pairs.single_gemm,
        "single_gemm_gflops": med(pairs.single_rates) / 1e9,
        "before_of_gemms": med(before_of),
        "after_of_gemms": med(after_of),
        "after_of_gemms_each_pair": after_of,
        "before_ms_each": [x * 1e3 for x in before],
        "after_ms_each": [x * 1e3 for x in after],
        "gemms_gflops_each": [x / 1e9 for x in gemm_rates],
    }


def run_threads(s: Shapes, threads: int, steps: int, repeats: int, flops: int) -> dict:
    """One row on ``threads`` torch threads in this process."""
    pairs = time_pairs(s, threads, steps, repeats)
    return summarize(pairs, flops, threads=threads, steps=steps, repeats=repeats)


def _process_pairs(s: Shapes, steps: int, repeats: int, barrier, results) -> None:
    results.put(time_pairs(s, 1, steps, repeats, barrier))


def run_processes(s: Shapes, processes: int, steps: int, repeats: int, flops: int) -> dict:
    """``processes`` processes of one thread each, running the same pairs at the same time (a
    simulation's clients on the cores, one CPU each): each process's times and GEMM rate under the
    others' load; the row pools every process's pairs."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_process_pairs, args=(s, steps, repeats, barrier, results)) for _ in range(processes)]
    for p in procs:
        p.start()
    each = [results.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    pooled = Pairs(
        *([v for r in each for v in getattr(r, f)] for f in ("before", "after", "gemm_rates", "single_rates")),
        each[0].single_gemm,
    )
    return summarize(pooled, flops, threads=1, processes=processes, steps=steps, repeats=repeats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch CPU threads, one row each")
    ap.add_argument(
        "--processes",
        type=int,
        default=2,
        help="and a row of this many one-thread processes at once (how a simulation's clients use the cores; 0: none)",
    )
    ap.add_argument("--steps", type=int, default=200, help="training steps per timed call")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved before/after pairs per thread count")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 thread, 20 steps, 1 pair")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.threads, args.steps, args.repeats, args.processes = [1], 20, 1, 0
    s = Shapes.cpu_scale()
    flops = step_flops(s)
    gemm_flops = Gemms(s).flops
    print(
        f"# bench_step_flops: torch {torch.__version__}, CPU, {os.cpu_count()} cores, load average "
        f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}; {args.repeats} interleaved pairs of {args.steps} steps"
    )
    print(f"# step (scale=cpu, rho preset): {s.describe()}")
    print(
        f"# {flops / 1e6:.1f} MFLOP per step (torch.utils.flop_counter); its {len(gemm_list(s))} GEMMs: "
        f"{gemm_flops / 1e6:.1f} MFLOP"
    )
    print(
        "# before: autograd + torch.optim (fast_step=False); after: the written-out step (fast_step=True); "
        "GEMMs: the step's matmuls alone, back to back; % GEMMs: step FLOP/s over theirs"
    )
    print(
        f"{'threads':>7}{'before ms':>11}{'after ms':>10}{'speed-up':>10}{'before GF/s':>13}{'after GF/s':>12}"
        f"{'GEMMs GF/s':>12}{'one GEMM GF/s':>15}{'before % GEMMs':>16}{'after % GEMMs':>15}  goal"
    )
    rows = []
    plan = [(t, 0) for t in args.threads] + ([(1, args.processes)] if args.processes > 1 else [])
    for threads, processes in plan:
        if processes:
            r = run_processes(s, processes, args.steps, args.repeats, flops)
            label = f"{processes} x 1"
        else:
            r = run_threads(s, threads, args.steps, args.repeats, flops)
            label = str(threads)
        rows.append(r)
        ok = r["after_of_gemms"] >= GOAL
        print(
            f"{label:>7}{r['before_ms']:>11.3f}{r['after_ms']:>10.3f}{r['speedup']:>10.2f}"
            f"{r['before_gflops']:>13.1f}{r['after_gflops']:>12.1f}{r['gemms_gflops']:>12.1f}"
            f"{r['single_gemm_gflops']:>15.1f}{r['before_of_gemms']:>16.0%}{r['after_of_gemms']:>15.0%}"
            f"  >= {GOAL:.0%} {'met' if ok else 'MISSED'}",
            flush=True,
        )
    if args.processes > 1:
        print(
            f"# '{args.processes} x 1': {args.processes} processes of one thread stepping at once, each against "
            "its own GEMMs under the same load (a simulation's clients on the cores); rates per process"
        )
    dom = rows[0]["single_gemm"] if rows else None
    print(f"# one GEMM: {dom} repeated on the same operands (cache-hot)")
    if args.out:
        write_json_atomic(
            args.out,
            {
                "shapes": dataclasses.asdict(s),
                "step_flops": flops,
                "gemm_flops": gemm_flops,
                "results": rows,
                "provenance": provenance({"data": 0, "model": 0}),
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
