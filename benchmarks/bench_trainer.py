"""Benchmark: fedhead's local trainer against a plain reference loop and against matmul FLOP/s.

Same process, same data, same model initialisation, side by side (runs are interleaved, so a
loaded machine slows both):

* the trainer (:func:`fedhead.train.train_local`: resident tensors, one permutation per epoch,
  index-gather batches, fused AdamW, precomputed cosine, penalty gradients without graph nodes);
* a reference loop: ``torch.utils.data.DataLoader`` over a ``TensorDataset`` (batch 256,
  shuffled), the textbook step (``zero_grad``, forward, loss with all penalties in autograd,
  ``backward``, ``clip_grad_norm_``, AdamW, ``CosineAnnealingLR``);
* the trainer's achieved FLOP/s (FLOPs of one step counted by ``torch.utils.flop_counter``)
  against the GEMMs of the model's dominant layer timed in the same run: for a ``Linear(K, N)``
  on a batch of ``M`` rows, the forward ``(M x K) @ (K x N)^T``, the input gradient
  ``(M x N) @ (N x K)`` and the weight gradient ``(N x M) @ (M x K)``, with the memory layouts
  ``torch.nn.Linear`` uses (ResMLP width ``w``: ``M = 256``, ``K = N = w``). The convolutional and
  free-feature cases have no matmul reference (``-``).

Headline numbers are medians over ``--repeats`` interleaved pairs (the order of trainer and
reference alternates between pairs); min and max of the pairwise ratios are printed too.

Cases: ResMLP width 1024 and width 256 on a 1,000 x 17 tabular client with 6 targets,
the free-feature backbone on 1,000 samples, ResNet-18 on 64 x 64 RGB images (small N).

Usage::

    python benchmarks/bench_trainer.py                      # all cases, CPU or CUDA ("auto")
    python benchmarks/bench_trainer.py --cases resmlp256 free --repeats 5
    python benchmarks/bench_trainer.py --device cuda --fast --out results/bench_trainer.json
    python benchmarks/bench_trainer.py --threads 1 --cases resmlp1024 --fast   # CPU: torch.compile

Goals on a 2-core CPU: ratio >= 1 everywhere, >= 1.3 for ``resmlp256`` and ``free``,
>= 65 % of matmul FLOP/s for ``resmlp1024``. On a shared machine compare the median columns.
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
from fedhead.models import FreeFeatureConfig, ModelConfig, ResMLPConfig, ResNetConfig, build_backbone, build_head
from fedhead.results.io import provenance, write_json_atomic
from fedhead.train import LocalProblem, TrainConfig, select_device, train_local

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
    gemm: tuple[int, int, int] | None  # (M, K, N) of the dominant Linear(K, N) on M rows; None: no matmul reference
    goal_ratio: float | None = None
    goal_flops: float | None = None


CASES = {
    "resmlp1024": Case("resmlp1024", ResMLPConfig(width=1024), 1000, (17,), 2, (BATCH, 1024, 1024), 1.0, 0.65),
    "resmlp256": Case("resmlp256", ResMLPConfig(width=256), 1000, (17,), 10, (BATCH, 256, 256), 1.3),
    "free": Case("free", FreeFeatureConfig(), 1000, (), 20, None, 1.3),
    "resnet18": Case("resnet18", ResNetConfig(depth=18), 512, (3, 64, 64), 1, None, 1.0),
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
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
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
            loss = (
                0.5 * ((pred - yb) ** 2).sum(dim=1).mean()
                + 0.5 * LAMBDA * (h**2).sum(dim=1).mean()
                + 0.5 * LAMBDA * (head.weight**2).sum()
            )
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 5.0)
            opt.step()
            sched.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n_steps / (time.perf_counter() - t0)


def trainer_run(case: Case, x: torch.Tensor, y: torch.Tensor, device: torch.device, fast: bool) -> float:
    bb, head = build(case, device)
    cfg = TrainConfig(batch_size=BATCH, bf16=fast, compile=fast, cuda_graphs=fast)
    problem = LocalProblem(epochs=case.epochs, lambda_h=LAMBDA, lambda_w=LAMBDA)
    return train_local(bb, head, x, y, cfg, problem, device=device).metrics.steps_per_second


def step_flops(case: Case, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> float:
    """FLOPs of one full-size training step (forward + backward), counted by torch."""
    bb, head = build(case, device)
    xb, yb = batch_to_float(x[:BATCH].to(device)), y[:BATCH].to(device)
    with FlopCounterMode(display=False) as counter:
        h = bb(xb)
        (0.5 * ((head(h) - yb) ** 2).sum() + 0.5 * LAMBDA * (h**2).sum()).backward()
    return float(counter.get_total_flops())


def matmul_flops_per_s(gemm: tuple[int, int, int], device: torch.device, min_seconds: float = 0.5) -> float:
    """FLOP/s of the three float32 GEMMs of a ``Linear(K, N)`` step on ``M`` rows, ``gemm = (M, K, N)``.

    Forward ``y = x W^T`` (``x`` ``(M, K)``, ``W`` ``(N, K)`` as stored by ``nn.Linear``), input
    gradient ``gy W`` and weight gradient ``gy^T x``: ``3 * 2 M K N`` FLOPs per round.
    """
    m, k, n = gemm
    x, w, gy = (torch.randn(*shape, device=device) for shape in ((m, k), (n, k), (m, n)))
    y, gx, gw = torch.empty(m, n, device=device), torch.empty(m, k, device=device), torch.empty(n, k, device=device)

    def one_round() -> None:
        torch.mm(x, w.t(), out=y)
        torch.mm(gy, w, out=gx)
        torch.mm(gy.t(), x, out=gw)

    for _ in range(3):
        one_round()
    reps, elapsed = 0, 0.0
    t0 = time.perf_counter()
    while elapsed < min_seconds:
        for _ in range(5):
            one_round()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        reps += 5
        elapsed = time.perf_counter() - t0
    return 3 * 2.0 * m * k * n * reps / elapsed


def run_case(case: Case, device: torch.device, repeats: int, fast: bool) -> dict:
    x, y = make_data(case)
    # warm-up (allocator, kernels, compile on CUDA) with a short run of each
    short = Case(**{**case.__dict__, "epochs": 1})
    trainer_run(short, x, y, device, fast)
    reference_loop(short, x, y, device)
    steps = case.epochs * math.ceil(case.n / BATCH)
    flops = step_flops(case, x, y, device)
    t_rates, r_rates, m_rates = [], [], []
    for i in range(repeats):  # interleaved, alternating order, so machine load hits both alike
        if i % 2 == 0:
            t_rates.append(trainer_run(case, x, y, device, fast))
            r_rates.append(reference_loop(case, x, y, device))
        else:
            r_rates.append(reference_loop(case, x, y, device))
            t_rates.append(trainer_run(case, x, y, device, fast))
        if case.gemm is not None:  # timed for as long as the trainer ran, right after the pair
            m_rates.append(matmul_flops_per_s(case.gemm, device, min_seconds=steps / t_rates[-1]))
    pair_ratios = [t / r for t, r in zip(t_rates, r_rates)]
    fractions = [flops * t / m for t, m in zip(t_rates, m_rates)]
    ref_fractions = [flops * r / m for r, m in zip(r_rates, m_rates)]
    med = statistics.median
    return {
        "case": case.name,
        "n": case.n,
        "epochs": case.epochs,
        "steps": steps,
        "trainer_steps_per_s": med(t_rates),
        "reference_steps_per_s": med(r_rates),
        "ratio_median_of_pairs": med(pair_ratios),
        "ratio_min": min(pair_ratios),
        "ratio_max": max(pair_ratios),
        "ratio_best_of_each": max(t_rates) / max(r_rates),
        "ratios_each_pair": pair_ratios,
        "trainer_steps_per_s_each": t_rates,
        "reference_steps_per_s_each": r_rates,
        "matmul_flops_each": m_rates,
        "step_gflop": flops / 1e9,
        "trainer_gflops": flops * med(t_rates) / 1e9,
        "reference_gflops": flops * med(r_rates) / 1e9,
        "gemm_mkn": case.gemm,
        "matmul_gflops": med(m_rates) / 1e9 if m_rates else None,
        "fraction_of_matmul": med(fractions) if fractions else None,
        "fractions_each_pair": fractions,
        "reference_fraction_of_matmul": med(ref_fractions) if ref_fractions else None,
        "goal_ratio": case.goal_ratio,
        "goal_fraction_of_matmul": case.goal_flops,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved trainer/reference pairs per case")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    ap.add_argument("--epoch-scale", type=float, default=1.0, help="multiply every case's epochs")
    ap.add_argument(
        "--fast",
        action="store_true",
        help="trainer with torch.compile (CUDA and CPU) + bf16 autocast and CUDA graphs (CUDA only)",
    )
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = select_device(args.device)
    machine = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"
    )
    print(
        f"# bench_trainer: torch {torch.__version__}, device {device} ({machine}), {args.repeats} interleaved "
        f"pairs per case, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    print(
        "# it/s: median steps/s of the trainer and of the DataLoader reference loop; ratio: median of the pairwise"
        " trainer/reference ratios [min-max]; GF/s: trainer FLOP/s (torch flop counter x median it/s);"
        " GEMM GF/s: fwd+dgrad+wgrad GEMMs of the dominant Linear (M x K -> N) timed after each pair;"
        " % GEMM: median of trainer FLOP/s / GEMM FLOP/s (reference loop's in brackets)"
    )
    print(
        f"{'case':<11}{'steps':>6}{'trainer it/s':>13}{'ref it/s':>10}{'ratio':>7}{'[min-max]':>13}"
        f"{'GFLOP/step':>11}{'trainer GF/s':>13}{'GEMM (M,K,N)':>18}{'GEMM GF/s':>10}{'% GEMM':>12}  goal"
    )
    rows = []
    for name in args.cases:
        case = CASES[name]
        case = Case(**{**case.__dict__, "epochs": max(1, round(case.epochs * args.epoch_scale))})
        r = run_case(case, device, args.repeats, args.fast)
        rows.append(r)
        goals = []
        if case.goal_ratio is not None:
            ok = r["ratio_median_of_pairs"] >= case.goal_ratio
            goals.append(f"ratio>={case.goal_ratio:g} {'met' if ok else 'MISSED'}")
        if case.goal_flops is not None:
            ok = r["fraction_of_matmul"] >= case.goal_flops
            goals.append(f"GEMM>={case.goal_flops:.0%} {'met' if ok else 'MISSED'}")
        if case.gemm is not None:
            gemm = f"{case.gemm}".replace(" ", "")
            frac = f"{r['fraction_of_matmul']:.0%} ({r['reference_fraction_of_matmul']:.0%})"
            mm = f"{r['matmul_gflops']:.1f}"
        else:
            gemm, frac, mm = "-", "-", "-"
        span = f"[{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]"
        print(
            f"{name:<11}{r['steps']:>6}{r['trainer_steps_per_s']:>13.2f}{r['reference_steps_per_s']:>10.2f}"
            f"{r['ratio_median_of_pairs']:>7.2f}{span:>13}{r['step_gflop']:>11.3f}{r['trainer_gflops']:>13.1f}"
            f"{gemm:>18}{mm:>10}{frac:>12}  {'; '.join(goals)}",
            flush=True,
        )
    if args.out:
        write_json_atomic(
            args.out,
            {
                "device": str(device),
                "machine": machine,
                "results": rows,
                "provenance": provenance({"data": 0, "model": 0}),
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
