"""The GPU check's summary table and the extrapolation to the ``main`` sweep grid at paper scale.

Pure arithmetic over the steps' JSON files and the GPU monitor's samples (tested on the CPU):

* seconds per client-round: each training case's ``client_round_s`` (step ``train``);
* clients per GPU: the K and mode (processes / CUDA streams) with the most steps per second
  (step ``concurrency``), and that speed-up over one client alone;
* GPU busy % and memory: the mean and the peak of the samples inside each step's time span;
* GPU-hours of ``fedhead-sweep sweep=main scale=paper`` (:func:`fedhead.sweep.presets.plan`):
  for every run ``rounds x clients x client-round seconds / speed-up``, where a client-round is
  the measured fixed cost plus ``E x steps per epoch x seconds per step`` of its kind (tabular:
  the Hopper ResMLP; image: the dSprites ResNet-18, scaled by the image's pixels over 64 x 64,
  an assumption: cost proportional to pixels). Against the paper's 1,415 GPU-hours for 764 runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

PAPER_GPU_HOURS = 1415.0
PAPER_RUNS = 764
#: pixels per image of the image data sets (fedhead/data/*.py), relative to dSprites' 64 x 64
PIXEL_FACTOR = {
    "dsprites": 1.0,
    "shapes3d": 1.0,
    "300w_lp": 1.0,
    "mpiigaze": 36 * 60 / 4096,
    "cifar_geo": 32 * 32 / 4096,
}
IMAGE = frozenset(PIXEL_FACTOR)


@dataclass(frozen=True)
class StepCost:
    """What one client-round costs for a kind of model: fixed seconds + seconds per optimiser step."""

    fixed_s: float
    s_per_step: float


def client_round_seconds(cost: StepCost, epochs: int, n: int, batch: int = 256, factor: float = 1.0) -> float:
    steps = epochs * math.ceil(n / min(batch, n))
    return cost.fixed_s + cost.s_per_step * factor * steps


def parse_overrides(overrides: Iterable[str]) -> dict[str, str]:
    out = {}
    for o in overrides:
        k, _, v = o.partition("=")
        out[k] = v
    return out


def dataset_sizes(name: str) -> tuple[int, int]:
    """(n_train, num_clients) of a data set's default (paper) config."""
    from fedhead.data.registry import make_config

    cfg = make_config(name)
    return int(cfg.n_train), int(cfg.num_clients)


def grid_gpu_hours(runs, tabular: StepCost, image: StepCost, speedup: float, sizes=dataset_sizes) -> dict:
    """GPU-hours of ``runs`` (RunSpecs) with the given costs and concurrency speed-up."""
    total_s, per_setting = 0.0, {}
    for r in runs:
        ov = parse_overrides(r.overrides)
        rounds, epochs = int(ov["rounds"]), int(ov["local_epochs"])
        n_train, m = sizes(r.dataset)
        m = int(ov.get("num_clients", m))
        n = n_train // m
        if r.dataset in IMAGE:
            cr = client_round_seconds(image, epochs, n, factor=PIXEL_FACTOR[r.dataset])
        else:
            cr = client_round_seconds(tabular, epochs, n)
        s = rounds * m * cr / speedup
        total_s += s
        per_setting[r.setting] = per_setting.get(r.setting, 0.0) + s / 3600
    hours = total_s / 3600
    return {
        "runs": len(runs),
        "gpu_hours": hours,
        "gpu_hours_per_run": hours / max(len(runs), 1),
        "paper_gpu_hours_per_run": PAPER_GPU_HOURS / PAPER_RUNS,
        "per_setting": per_setting,
    }


def window_stats(samples: list[tuple[float, float, float]], t0: float | None, t1: float | None) -> dict:
    """Mean and peak busy % and peak memory (MiB) of the samples ``(time, busy %, MiB)`` in ``[t0, t1]``."""
    if t0 is None or t1 is None:
        return {"n": 0, "busy_mean": None, "busy_max": None, "mem_max_mib": None}
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
        return {"n": 0, "busy_mean": None, "busy_max": None, "mem_max_mib": None}
    busy = [s[1] for s in inside]
    return {
        "n": len(inside),
        "busy_mean": sum(busy) / len(busy),
        "busy_max": max(busy),
        "mem_max_mib": max(s[2] for s in inside),
    }


def parse_samples(text: str) -> list[tuple[float, float, float]]:
    """Lines ``epoch_seconds,busy %,memory MiB`` (the monitor's file); bad lines are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        try:
            out.append((float(parts[0]), float(parts[1]), float(parts[2])))
        except ValueError:
            continue
    return out


def _fmt(v, spec: str = ".3g", none: str = "n/a") -> str:
    return none if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def costs_from_train(train: dict | None) -> tuple[StepCost | None, StepCost | None]:
    """(tabular, image) costs from step ``train``'s Hopper (no tolerance) and dSprites cases."""
    cases = (train or {}).get("cases", {})

    def cost(key: str) -> StepCost | None:
        c = cases.get(key)
        if not c:
            return None
        return StepCost(fixed_s=c["timed"]["overhead_s"], s_per_step=c["timed"]["s_per_step"])

    return cost("hopper"), cost("dsprites")


def build(train: dict | None, conc: dict | None, deploy: dict | None, samples, runs, dry_run: bool) -> tuple[str, dict]:
    """The printed table and its numbers."""
    rows: list[tuple[str, str, str, str]] = []  # what, seconds per client-round, clients per GPU, busy %
    data: dict = {"dry_run": dry_run, "cases": {}, "concurrency": None, "deploy": None, "grid": None}
    for key, c in ((train or {}).get("cases") or {}).items():
        w = window_stats(samples, c.get("t_start"), c.get("t_end"))
        label = f"train {key} (E={c['E_target']}{', tol ' + format(c['local_tol'], 'g') if c['local_tol'] else ''})"
        proj = " (projected)" if c.get("projected") else ""
        rows.append((label, _fmt(c["client_round_s"], ".1f") + proj, "1", _fmt(w["busy_mean"], ".0f")))
        data["cases"][key] = {"client_round_s": c["client_round_s"], "projected": c.get("projected"), **w}
    for key, err in ((train or {}).get("errors") or {}).items():
        rows.append((f"train {key}", "FAILED", "-", "-"))
        data["cases"][key] = {"error": err}
    best = (conc or {}).get("best")
    if best:
        runs_of = (conc.get("runs") or {}).get(best["mode"], {})
        r = runs_of.get(str(best["K"])) or runs_of.get(best["K"]) or {}
        w = window_stats(samples, r.get("t_start"), r.get("t_end"))
        per = best["span_s"] * (4000 / max(conc.get("epochs", 1), 1))
        rows.append(
            (
                f"concurrency best: {best['mode']} K={best['K']} (x{_fmt(best.get('speedup'), '.2f')} steps/s)",
                _fmt(per, ".1f") + " (Hopper E=4000, each of K)",
                str(best["K"]),
                _fmt(w["busy_mean"], ".0f"),
            )
        )
        data["concurrency"] = {**best, **w}
    elif conc is not None:
        rows.append(("concurrency", "FAILED", "-", "-"))
    if deploy is not None:
        w = window_stats(samples, deploy.get("t_start"), deploy.get("t_end"))
        ok = deploy.get("ok")
        rounds, clients = deploy.get("rounds_asked", 0), deploy.get("clients", 0)
        per = deploy["run_s"] / max(rounds * clients, 1) if ok and deploy.get("run_s") else None
        rows.append(
            (
                f"deploy {clients} SuperNodes TLS, {rounds} rounds E={deploy.get('local_epochs')}"
                + ("" if ok else " FAILED"),
                _fmt(per, ".1f") + " (run wall / client-rounds)" if per else "-",
                str(clients),
                _fmt(w["busy_mean"], ".0f"),
            )
        )
        data["deploy"] = {"ok": ok, "run_s": deploy.get("run_s"), **w}
    tab, img = costs_from_train(train)
    speedup = (best or {}).get("speedup") or 1.0
    grid_line = "GPU-hours of sweep=main scale=paper: n/a (needs the Hopper and dSprites timings)"
    if tab and img and runs:
        g = grid_gpu_hours(runs, tab, img, speedup)
        data["grid"] = {**g, "speedup": speedup}
        grid_line = (
            f"GPU-hours of sweep=main scale=paper: {g['gpu_hours']:.0f} for {g['runs']} runs "
            f"({g['gpu_hours_per_run']:.2f} per run at x{speedup:.2f} packing; "
            f"the paper: {PAPER_GPU_HOURS:.0f} for {PAPER_RUNS} runs, {g['paper_gpu_hours_per_run']:.2f} per run)"
        )
    head = ("step", "s per client-round", "clients/GPU", "GPU busy %")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)) for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(grid_line)
    if dry_run:
        lines.append("(CPU dry run with tiny sizes: these numbers check the plumbing, they predict nothing)")
    return "\n".join(lines), data
