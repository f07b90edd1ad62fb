"""The GPU check's driver: environment, the steps (each a process with its own timeout), the table.

    python scripts/gpucheck/run_all.py [--cpu-dry-run] [--out DIR] [--steps train,concurrency,deploy]

Results go to ``--out``, else ``$OUT`` (the device tool's folder), else ``results/gpu-check-<time>``;
at most 8 files there (what the device tool brings back): ``env.json``, ``train.json``,
``concurrency.json``, ``deploy.json``, ``gpu.csv``, ``steps.json``, ``table.txt`` and
``check.log``. Scratch (workers, the deployment's logs and outputs) goes to ``--work``. Every
step is written as soon as it ends; a step that fails or passes its timeout is reported in
``steps.json`` and the table, and the next step runs. The whole check keeps to ``--budget``
seconds (each step's timeout is cut to what is left).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import REPO, SIZES, read_json, write_json  # noqa: E402
from gpumon import Monitor  # noqa: E402

#: (step, script, timeout in seconds on the GPU, on the CPU dry run)
STEPS = {
    "train": ("step_train.py", 200, 150),
    "concurrency": ("step_concurrency.py", 140, 150),
    "deploy": ("step_deploy.py", 230, 240),
}
RESERVE_S = 15  # kept back at the end for the table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="fedhead GPU check (see scripts/gpu_check.sh)")
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny sizes on the CPU: checks the plumbing")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default $OUT or results/gpu-check-*)")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default a new temporary folder)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {list(STEPS)}")
    ap.add_argument("--budget", type=float, default=None, help="seconds for all steps (default 450 GPU, 330 dry run)")
    args = ap.parse_args(argv)
    unknown = [s for s in args.steps.split(",") if s not in STEPS]
    if unknown:
        ap.error(f"unknown steps {unknown}; choose from {list(STEPS)}")
    if args.budget is None:
        args.budget = 330.0 if args.cpu_dry_run else 450.0
    if args.budget <= RESERVE_S:
        ap.error(f"--budget must exceed {RESERVE_S} s")
    return args


def out_dir(arg: Path | None, env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if arg is not None:
        return arg
    if env.get("OUT"):
        return Path(env["OUT"])
    return REPO / "results" / time.strftime("gpu-check-%Y%m%d-%H%M%S")


def step_timeout(own: float, deadline: float, now: float) -> float:
    """A step's timeout: its own, cut to what is left of the budget (never below 0)."""
    return max(0.0, min(own, deadline - now - RESERVE_S))


def environment(sizes_name: str) -> dict:
    env: dict = {"python": sys.version.split()[0], "platform": platform.platform(), "sizes": sizes_name}
    env["pythonpath"] = os.environ.get("PYTHONPATH", "")
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            env["cuda"] = torch.version.cuda
            env["gpu"] = torch.cuda.get_device_name(0)
            env["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:  # noqa: BLE001 - the environment report must not fail
        env["torch_error"] = repr(exc)
    from importlib import metadata

    versions = {}
    for name in ("flwr", "hydra-core", "omegaconf", "grpcio", "protobuf", "numpy", "scipy", "ray", "gymnasium"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    env["packages"] = versions
    try:
        env["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        env["nvidia_smi"] = None
    return env


def run_step(name: str, cmd: list[str], timeout: float, log) -> dict:
    """Run one step's process (own session) with ``timeout``; its output goes to ``log`` and stdout."""
    t0 = time.time()
    if timeout <= 0:
        return {"step": name, "status": "skipped (no time left)", "seconds": 0.0}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
    status = None
    try:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                status = f"timeout after {timeout:.0f} s"
                break
            if sel.select(timeout=min(left, 1.0)):
                line = proc.stdout.readline()
                if not line:
                    break
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)
                log.flush()
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue
        rest = proc.stdout.read() if proc.stdout else ""
        if rest:
            sys.stdout.write(rest)
            log.write(rest)
    rc = proc.wait()
    if status is None:
        status = "ok" if rc == 0 else f"failed (exit {rc})"
    return {"step": name, "status": status, "returncode": rc, "seconds": time.time() - t0}


def write_table(out: Path, dry_run: bool) -> str:
    from table import build, parse_samples

    from fedhead.sweep.presets import plan

    gpu = out / "gpu.csv"
    samples = parse_samples(gpu.read_text()) if gpu.is_file() else []
    text, data = build(
        read_json(out / "train.json"),
        read_json(out / "concurrency.json"),
        read_json(out / "deploy.json"),
        samples,
        plan("main", "paper"),
        dry_run,
    )
    (out / "table.txt").write_text(text + "\n\n" + json.dumps(data, indent=2, default=str) + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SIZES["tiny" if args.cpu_dry_run else "paper"]
    out = out_dir(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpucheck-work-"))
    work.mkdir(parents=True, exist_ok=True)
    t_begin = time.time()
    deadline = time.monotonic() + args.budget
    env = environment(sizes.name)
    write_json(out / "env.json", env)
    print(f"gpu check: sizes {sizes.name} on {sizes.device}; results in {out}; scratch in {work}", flush=True)
    print(f"gpu check: python {env['python']}, torch {env.get('torch')}, flwr {env['packages']['flwr']}", flush=True)
    mon = Monitor(out / "gpu.csv").start()
    if mon.note:
        print(f"gpu check: {mon.note}", flush=True)
    steps: list[dict] = []
    with open(out / "check.log", "a") as log:
        for name in args.steps.split(","):
            script, gpu_s, cpu_s = STEPS[name]
            cmd = [sys.executable, str(HERE / script), "--out", str(out), "--sizes", sizes.name]
            if name in ("concurrency", "deploy"):
                cmd += ["--work", str(work / name)]
            timeout = step_timeout(cpu_s if args.cpu_dry_run else gpu_s, deadline, time.monotonic())
            print(f"gpu check: step {name} (timeout {timeout:.0f} s)", flush=True)
            steps.append(run_step(name, cmd, timeout, log))
            print(f"gpu check: step {name}: {steps[-1]['status']} in {steps[-1]['seconds']:.0f} s", flush=True)
            write_json(out / "steps.json", {"steps": steps, "monitor": mon.note, "budget_s": args.budget})
            write_table(out, args.cpu_dry_run)
    mon.stop()
    if args.work is None:  # our own temporary scratch (logs of a failed step are in its JSON)
        shutil.rmtree(work, ignore_errors=True)
    text = write_table(out, args.cpu_dry_run)
    total = time.time() - t_begin
    write_json(out / "steps.json", {"steps": steps, "monitor": mon.note, "budget_s": args.budget, "total_s": total})
    print("\n" + text, flush=True)
    print(f"\ngpu check: {len(steps)} steps in {total:.0f} s; results in {out}", flush=True)
    return 0 if all(s["status"] == "ok" for s in steps) else 1


if __name__ == "__main__":
    raise SystemExit(main())
