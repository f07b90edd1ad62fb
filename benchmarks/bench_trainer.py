"""Benchmark: fedhead's local trainer against a plain reference loop and against matmul FLOP/s.

Same process, same data, same model initialisation, side by side (runs are interleaved, so a
loaded machine slows both):

* the trainer (:func:`fedhead.train.train_local`: resident tensors, one permutation per epoch,
  index-gather batches, fused AdamW, precomputed cosine, penalty gradients without graph nodes);
* a reference loop: ``torch.utils.data.DataLoader`` over a ``TensorDataset`` (batch 256,
  shuffled), the textbook step (``zero_grad``, forward, loss with all penalties in autograd,
  ``backward``, ``clip_grad_norm_``, AdamW, ``CosineAnnealingLR``);
* the trainer's achieved FLOP/s (FLOPs of one step counted by ``torch.utils.flop_counter``)
  against a matmul of matching size (``(256 x w) @ (w x w)``) timed in the same run.

Cases (issue 3): ResMLP width 1024 and width 256 on a 1,000 x 17 tabular client with 6 targets,
the free-feature backbone on 1,000 samples, ResNet-18 on 64 x 64 RGB images (small N).

Usage::

    python benchmarks/bench_trainer.py                      # all cases, CPU or CUDA ("auto")
    python benchmarks/bench_trainer.py --cases resmlp256 free --repeats 5
    python benchmarks/bench_trainer.py --device cuda --fast --out results/bench_trainer.json

Goals on a 2-core CPU: ratio >= 1 everywhere, >= 1.3 for ``resmlp256`` and ``free``, >= 65 %
of matmul FLOP/s for ``resmlp1024``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

from fedhead.data.base import batch_to_float
from fedhead.io import provenance, write_json_atomic
from fedhead.models import FreeFeatureConfig, ModelConfig, ResMLPConfig, ResNetConfig, build_backbone, build_head
from fedhead.train import TrainConfig, select_device, train_local

LAMBDA = 0.01
BATCH = 256
N_TARGETS = 6


@dataclass
class Case:
    name: str
    model: ModelConfig
    n: int
    input_shape: tuple[int, ...]
    epochs: int
    matmul_width: int
    goal_ratio: float | None = None
    goal_flops: float | None = None


CASES = {
    "resmlp1024": Case("resmlp1024", ResMLPConfig(width=1024), 1000, (17,), 2, 1024, 1.0, 0.65),
    "resmlp256": Case("resmlp256", ResMLPConfig(width=256), 1000, (17,), 10, 256, 1.3),
    "free": Case("free", FreeFeatureConfig(), 1000, (), 20, 512, 1.3),
    "resnet18": Case("resnet18", ResNetConfig(depth=18), 256, (3, 64, 64), 1, 512, 1.0),
}


def make_data(case: Case, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(case.n, N_TARGETS, generator=g)
    if isinstance(case.model, FreeFeatureConfig):
        x = torch.arange(case.n)
    elif len(case.input_shape) == 3:
        x = torch.randint(0, 256, (case.n, *case.input_shape), dtype=torch.uint8, generator=g)
    else:
        x = torch.randn(case.n, *case.input_shape, generator=g)
    return x, y


def build(case: Case, device: torch.device) -> tuple[nn.Module, nn.Linear]:
    bb = build_backbone(case.model, case.input_shape, case.n, seed=0).to(device)
    return bb, build_head(case.model.feature_dim, N_TARGETS, seed=1).to(device)


def reference_loop(case: Case, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> float:
    """The textbook loop; returns steps per second."""
    bb, head = build(case, device)
    bb.train()
    params = list(bb.parameters()) + list(head.parameters())
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    n_steps = case.epochs * len(loader)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n_steps, eta_min=1e-5)
    t0 = time.perf_counter()
    for _ in range(case.epochs):
        for xb, yb in loader:
            xb, yb = batch_to_float(xb.to(device)), yb.to(device)
            opt.zero_grad()
            h = bb(xb)
            pred = head(h)
            loss = (0.5 * ((pred - yb) ** 2).sum(dim=1).mean() + 0.5 * LAMBDA * (h**2).sum(dim=1).mean()
                    + 0.5 * LAMBDA * (head.weight**2).sum())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 5.0)
            opt.step()
            sched.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n_steps / (time.perf_counter() - t0)


def trainer_run(case: Case, x: torch.Tensor, y: torch.Tensor, device: torch.device, fast: bool) -> float:
    bb, head = build(case, device)
    cfg = TrainConfig(epochs=case.epochs, batch_size=BATCH, lambda_h=LAMBDA, lambda_w=LAMBDA,
                      bf16=fast, compile=fast, cuda_graphs=fast)
    return train_local(bb, head, x, y, cfg, device=device).metrics.steps_per_second


def step_flops(case: Case, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> float:
    """FLOPs of one full-size training step (forward + backward), counted by torch."""
    bb, head = build(case, device)
    xb, yb = batch_to_float(x[:BATCH].to(device)), y[:BATCH].to(device)
    with FlopCounterMode(display=False) as counter:
        h = bb(xb)
        (0.5 * ((head(h) - yb) ** 2).sum() + 0.5 * LAMBDA * (h**2).sum()).backward()
    return float(counter.get_total_flops())


def matmul_flops_per_s(width: int, device: torch.device, min_seconds: float = 0.5) -> float:
    """FLOP/s of ``(256 x width) @ (width x width)`` float32 on ``device``."""
    a, b = torch.randn(BATCH, width, device=device), torch.randn(width, width, device=device)
    out = torch.empty(BATCH, width, device=device)
    for _ in range(3):
        torch.mm(a, b, out=out)
    reps, elapsed = 0, 0.0
    t0 = time.perf_counter()
    while elapsed < min_seconds:
        for _ in range(10):
            torch.mm(a, b, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        reps += 10
        elapsed = time.perf_counter() - t0
    return 2.0 * BATCH * width * width * reps / elapsed


def run_case(case: Case, device: torch.device, repeats: int, fast: bool) -> dict:
    x, y = make_data(case)
    # warm-up (allocator, kernels, compile on CUDA) with a short run of each
    short = Case(**{**case.__dict__, "epochs": 1})
    trainer_run(short, x, y, device, fast)
    reference_loop(short, x, y, device)
    steps = case.epochs * math.ceil(case.n / BATCH)
    flops = step_flops(case, x, y, device)
    t_rates, r_rates, m_rates = [], [], []
    for _ in range(repeats):  # interleaved, so machine load hits all three alike
        t_rates.append(trainer_run(case, x, y, device, fast))
        r_rates.append(reference_loop(case, x, y, device))
        # matmul timed for as long as the trainer ran, right after it
        m_rates.append(matmul_flops_per_s(case.matmul_width, device, min_seconds=steps / t_rates[-1]))
    # ratio: best of the repeats (the least disturbed run of each); also the median of the pairs
    trainer, reference = max(t_rates), max(r_rates)
    pair_ratios = [t / r for t, r in zip(t_rates, r_rates)]
    fractions = [flops * t / m for t, m in zip(t_rates, m_rates)]
    ref_fractions = [flops * r / m for r, m in zip(r_rates, m_rates)]
    return {
        "case": case.name, "n": case.n, "epochs": case.epochs, "steps": steps,
        "trainer_steps_per_s": trainer, "reference_steps_per_s": reference, "ratio": trainer / reference,
        "ratio_median_of_pairs": statistics.median(pair_ratios), "ratios_each_pair": pair_ratios,
        "trainer_steps_per_s_each": t_rates, "reference_steps_per_s_each": r_rates, "matmul_flops_each": m_rates,
        "step_gflop": flops / 1e9, "trainer_gflops": flops * trainer / 1e9, "reference_gflops": flops * reference / 1e9,
        "matmul_width": case.matmul_width, "matmul_gflops": max(m_rates) / 1e9,
        "fraction_of_matmul": statistics.median(fractions), "fractions_each_pair": fractions,
        "reference_fraction_of_matmul": statistics.median(ref_fractions),
        "goal_ratio": case.goal_ratio, "goal_fraction_of_matmul": case.goal_flops,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved trainer/reference pairs per case")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    ap.add_argument("--epoch-scale", type=float, default=1.0, help="multiply every case's epochs")
    ap.add_argument("--fast", action="store_true", help="CUDA only: bf16 autocast + torch.compile + CUDA graphs")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = select_device(args.device)
    machine = (torch.cuda.get_device_name(device) if device.type == "cuda"
               else f"CPU, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}")
    print(f"# bench_trainer: torch {torch.__version__}, device {device} ({machine})")
    print("# ratio: best of --repeats interleaved runs; med: median of the pairwise ratios; % matmul: median"
          " over runs of trainer FLOP/s / (256 x w) @ (w x w) FLOP/s timed right after it (reference loop in"
          " brackets)")
    print(f"{'case':<11}{'steps':>6}{'trainer it/s':>14}{'ref it/s':>10}{'ratio':>7}{'med':>6}{'GFLOP/step':>11}"
          f"{'trainer GF/s':>13}{'matmul GF/s':>12}{'% matmul':>14}  goal")
    rows = []
    for name in args.cases:
        case = CASES[name]
        case = Case(**{**case.__dict__, "epochs": max(1, round(case.epochs * args.epoch_scale))})
        r = run_case(case, device, args.repeats, args.fast)
        rows.append(r)
        goals = []
        if case.goal_ratio is not None:
            goals.append(f"ratio>={case.goal_ratio:g} {'met' if r['ratio'] >= case.goal_ratio else 'MISSED'}")
        if case.goal_flops is not None:
            ok = r["fraction_of_matmul"] >= case.goal_flops
            goals.append(f"matmul>={case.goal_flops:.0%} {'met' if ok else 'MISSED'}")
        frac = f"{r['fraction_of_matmul']:.0%} ({r['reference_fraction_of_matmul']:.0%})"
        print(f"{name:<11}{r['steps']:>6}{r['trainer_steps_per_s']:>14.2f}{r['reference_steps_per_s']:>10.2f}"
              f"{r['ratio']:>7.2f}{r['ratio_median_of_pairs']:>6.2f}{r['step_gflop']:>11.3f}{r['trainer_gflops']:>13.1f}"
              f"{r['matmul_gflops']:>12.1f}{frac:>14}  {'; '.join(goals)}", flush=True)
    if args.out:
        write_json_atomic(args.out, {"device": str(device), "machine": machine, "results": rows,
                                     "provenance": provenance({"data": 0, "model": 0})})
    return 0


if __name__ == "__main__":
    sys.exit(main())
