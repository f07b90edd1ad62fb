"""Step ``concurrency``: several clients training at once on the one GPU, processes vs CUDA streams.

Workload: the paper-scale Hopper client (ResMLP width 1024, P = 512, 1,000 samples, batch 256) for
``conc_epochs`` epochs, client k on Hopper partition k mod 4. For K clients at once:

* ``processes``: K Python processes (what Ray actors with fractional GPUs, or SuperNodes on one
  GPU, are), each warmed up, then released together by a go-file; the span runs from the first
  start to the last end of the timed calls.
* ``streams``: K threads of one process, each client on its own ``torch.cuda.Stream`` (on the
  CPU dry run: plain threads).

Reported per (mode, K): the span, the steps per second of all K together and the speed-up over
one client alone; ``best`` is the (mode, K) with the most steps per second.

    python scripts/gpucheck/step_concurrency.py --out DIR --sizes paper|tiny [--modes processes,streams]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import SIZES, Case, load_client, now, read_json, train_once, write_json

HERE = Path(__file__).resolve().parent


def _case(sizes, k: int) -> tuple[Case, int]:
    return sizes.hopper, k % 4


def worker(args) -> int:
    """One client of the ``processes`` mode: warm up, wait for the go-file, time one call."""
    sizes = SIZES[args.sizes]
    case, client = _case(sizes, args.id)
    x, y, shape = load_client(case, client)
    train_once(case, x, y, shape, sizes.device, 2, seed=args.id)
    (args.out / f"ready-{args.tag}-{args.id}").touch()
    go = args.out / f"go-{args.tag}"
    deadline = time.monotonic() + 300
    while not go.exists():
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.005)
    t0 = now()
    r = train_once(case, x, y, shape, sizes.device, args.epochs, seed=args.id)
    r.update(t0=t0, t1=now())
    write_json(args.out / f"worker-{args.tag}-{args.id}.json", r)
    return 0


def run_processes(sizes, k: int, out: Path, epochs: int, limit_s: float = 240) -> dict:
    tag = f"p{k}"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "step_concurrency.py"), "--worker", "--out", str(out), "--sizes", sizes.name]
            + ["--id", str(i), "--tag", tag, "--epochs", str(epochs)],
            env=env,
        )
        for i in range(k)
    ]
    try:
        t_start = time.monotonic()
        while sum((out / f"ready-{tag}-{i}").exists() for i in range(k)) < k:
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() - t_start > limit_s:
                raise RuntimeError(f"processes K={k}: a worker failed or did not get ready")
            time.sleep(0.05)
        startup = time.monotonic() - t_start
        (out / f"go-{tag}").touch()
        for p in procs:
            p.wait(timeout=limit_s)
        rs = [read_json(out / f"worker-{tag}-{i}.json") for i in range(k)]
        if any(r is None for r in rs):
            codes = [p.returncode for p in procs]
            raise RuntimeError(f"processes K={k}: a worker wrote no result (exit codes {codes})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    span = max(r["t1"] for r in rs) - min(r["t0"] for r in rs)
    return {"span_s": span, "steps": sum(r["steps"] for r in rs), "startup_s": startup, "per_client": rs}


def run_streams(sizes, k: int, epochs: int) -> dict:
    import torch

    cuda = sizes.device == "cuda"
    clients = []
    for i in range(k):
        case, client = _case(sizes, i)
        x, y, shape = load_client(case, client)
        train_once(case, x, y, shape, sizes.device, 2, seed=i)  # warm-up, one client at a time
        clients.append((case, x, y, shape))
    results: list[dict | None] = [None] * k
    errors: list[str] = []

    def one(i: int) -> None:
        case, x, y, shape = clients[i]
        try:
            if cuda:
                with torch.cuda.stream(torch.cuda.Stream()):
                    results[i] = train_once(case, x, y, shape, sizes.device, epochs, seed=i)
            else:
                results[i] = train_once(case, x, y, shape, sizes.device, epochs, seed=i)
        except Exception as exc:  # noqa: BLE001 - reported by the step
            errors.append(f"client {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
    t0 = now()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if cuda:
        torch.cuda.synchronize()
    span = now() - t0
    if errors:
        raise RuntimeError("; ".join(errors))
    return {"span_s": span, "steps": sum(r["steps"] for r in results), "per_client": results}


def summarize(runs: dict[str, dict[int, dict]]) -> dict:
    """Steps per second and speed-up of every (mode, K); the best one."""
    base = None
    for mode in ("processes", "streams"):
        r1 = runs.get(mode, {}).get(1)
        if r1 and r1.get("span_s"):
            base = r1["steps"] / r1["span_s"] if base is None else max(base, r1["steps"] / r1["span_s"])
    table, best = [], None
    for mode, by_k in runs.items():
        for k, r in sorted(by_k.items()):
            if not r.get("span_s"):
                continue
            sps = r["steps"] / r["span_s"]
            row = {"mode": mode, "K": k, "span_s": r["span_s"], "steps_per_s": sps}
            row["speedup"] = sps / base if base else None
            table.append(row)
            if best is None or sps > best["steps_per_s"]:
                best = row
    return {"table": table, "best": best}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", choices=sorted(SIZES), default="paper")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default OUT/concurrency-work)")
    ap.add_argument("--modes", default="processes,streams")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--id", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="", help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    sizes = SIZES[args.sizes]
    work = args.work or args.out / "concurrency-work"
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"step": "concurrency", "sizes": sizes.name, "epochs": sizes.conc_epochs, "runs": {}, "errors": {}}
    path = args.out / "concurrency.json"
    t_start = now()
    for mode in args.modes.split(","):
        result["runs"][mode] = {}
        for k in sizes.conc_processes if mode == "processes" else sizes.conc_streams:
            t0 = now()
            try:
                if mode == "processes":
                    r = run_processes(sizes, k, work, sizes.conc_epochs)
                else:
                    r = run_streams(sizes, k, sizes.conc_epochs)
                r.update(t_start=t0, t_end=now())
                result["runs"][mode][k] = r
                print(
                    f"concurrency {mode} K={k}: {r['steps'] / r['span_s']:.0f} steps/s over {r['span_s']:.1f} s",
                    flush=True,
                )
            except Exception as exc:  # noqa: BLE001 - a failing mode must not lose the others
                result["errors"][f"{mode}-{k}"] = f"{type(exc).__name__}: {exc}"
                print(f"concurrency {mode} K={k}: FAILED {exc}", flush=True)
            result.update(summarize(result["runs"]), t_start=t_start, t_end=now())
            write_json(path, result)
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
