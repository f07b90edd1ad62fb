"""Step ``train``: paper-scale local training through fedhead's own trainer (train_local).

Cases (docs/theory.md §10): Hopper with the ResMLP of width 1024, P = 512, the 1,000 samples of
client 0, batch 256, E = 4000 (once without a tolerance, once with ``local_tol`` = 1e-4 and E as
the cap); dSprites with ResNet-18, the 1,500 samples of client 0, one round of E = 4000.

A short warm-up call per case (CUDA context, cuDNN autotuning, allocator) is timed separately;
then the timed call runs E epochs, or as many as fit ``train_budget_s`` (from the warm-up's speed).
What a cut call would have taken at the full E is projected from its seconds per step plus its
fixed cost (set-up and finishing), and marked ``projected``.

    python scripts/gpucheck/step_train.py --out DIR --sizes paper|tiny
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from common import SIZES, Case, load_client, now, train_once, write_json


def steps_per_epoch(n: int, batch: int) -> int:
    return math.ceil(n / min(batch, n))


def plan_epochs(target: int, s_per_epoch: float, budget_s: float) -> int:
    """Epochs of the timed call: ``target``, or fewer so that the loop fits ``budget_s``."""
    if s_per_epoch <= 0 or not math.isfinite(s_per_epoch):
        return target
    return max(1, min(target, int(budget_s / s_per_epoch)))


def time_case(case: Case, device: str, budget_s: float, warm_epochs: int = 3) -> dict:
    t_load = time.perf_counter()
    x, y, shape = load_client(case)
    out: dict = {"case": case.name, "dataset": case.dataset, "model": case.model, "width": case.width}
    out.update({"P": case.feature_dim, "batch": case.batch_size, "E_target": case.epochs, "local_tol": case.local_tol})
    out["load_s"] = time.perf_counter() - t_load
    out["n"] = int(y.shape[0])
    out["steps_per_epoch"] = steps_per_epoch(out["n"], case.batch_size)
    warm = train_once(case, x, y, shape, device, min(warm_epochs, case.epochs))
    out["warmup"] = warm
    per_epoch = warm["loop_s"] / max(warm["epochs_run"], 1)
    epochs = plan_epochs(case.epochs, per_epoch, budget_s)
    t0 = now()
    timed = train_once(case, x, y, shape, device, epochs)
    out["timed"] = timed
    out["t_start"], out["t_end"] = t0, now()
    full_steps = case.epochs * out["steps_per_epoch"]
    if case.local_tol is not None and timed["converged"]:
        # stopped by the tolerance before the cap: this is what a client-round costs
        out["client_round_s"], out["projected"] = timed["wall_s"], False
    else:
        cut = timed["epochs_run"] < case.epochs
        out["client_round_s"] = timed["overhead_s"] + timed["s_per_step"] * full_steps if cut else timed["wall_s"]
        out["projected"] = cut
    out["s_per_step"] = timed["s_per_step"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", choices=sorted(SIZES), default="paper")
    ap.add_argument("--cases", default="hopper,hopper_tol,dsprites", help="comma-separated subset")
    args = ap.parse_args(argv)
    sizes = SIZES[args.sizes]
    import torch

    result: dict = {"step": "train", "sizes": sizes.name, "device": sizes.device, "cases": {}, "errors": {}}
    if sizes.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    result["torch"] = torch.__version__
    path = args.out / "train.json"
    for key in args.cases.split(","):
        case: Case = getattr(sizes, key)
        try:
            result["cases"][key] = time_case(case, sizes.device, sizes.train_budget_s)
        except Exception as exc:  # noqa: BLE001 - one failing case must not lose the others
            result["errors"][key] = f"{type(exc).__name__}: {exc}"
        write_json(path, result)
        c = result["cases"].get(key)
        if c:
            t = c["timed"]
            print(
                f"train {key}: {t['epochs_run']}/{case.epochs} epochs, {t['steps']} steps, {t['s_per_step'] * 1e3:.2f} "
                f"ms/step, client-round {c['client_round_s']:.1f} s{' (projected)' if c['projected'] else ''}, "
                f"gap {t['trained_gap']}",
                flush=True,
            )
        else:
            print(f"train {key}: FAILED {result['errors'][key]}", flush=True)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
