"""The GPU check (scripts/gpu_check.sh, scripts/gpucheck/): its pieces, fast, and the whole CPU dry run (slow).

The check runs on a lent GPU machine with no package registry, once, in a few minutes of device
time: everything that can fail there for a typo, a missing file or bad arithmetic is checked
here. The dry run needs what scripts/gpu_prepare.sh makes (.whl/, .gpu-data/); without them the
slow test is skipped with that message.
"""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
GPUCHECK = REPO / "scripts" / "gpucheck"


@pytest.fixture
def gc():
    """The modules of scripts/gpucheck (imported by their plain names, as the scripts do)."""
    sys.path.insert(0, str(GPUCHECK))
    names = ("common", "table", "wheels", "run_all", "step_train", "step_concurrency", "gpumon")
    try:
        yield SimpleNamespace(**{n: importlib.import_module(n) for n in names})
    finally:
        sys.path.remove(str(GPUCHECK))
        for n in names:
            sys.modules.pop(n, None)


# ------------------------------------------------------------------ table and extrapolation
def test_client_round_seconds(gc):
    cost = gc.table.StepCost(fixed_s=2.0, s_per_step=0.001)
    # 1,000 samples at batch 256: 4 steps per epoch; E = 4000 -> 16,000 steps
    assert gc.table.client_round_seconds(cost, 4000, 1000) == pytest.approx(2.0 + 16.0)
    # a client smaller than the batch takes one full-batch step per epoch
    assert gc.table.client_round_seconds(cost, 10, 100) == pytest.approx(2.0 + 0.01)
    assert gc.table.client_round_seconds(cost, 10, 1500, factor=0.5) == pytest.approx(2.0 + 10 * 6 * 0.0005)


def test_grid_gpu_hours_by_hand(gc):
    spec = SimpleNamespace
    runs = [
        spec(dataset="hopper", setting="hopper", overrides=("dataset=hopper", "rounds=8", "local_epochs=4000")),
        spec(dataset="cifar_geo", setting="cifar_geo", overrides=("dataset=cifar_geo", "rounds=2", "local_epochs=10")),
    ]
    sizes = {"hopper": (4000, 4), "cifar_geo": (12000, 4)}.__getitem__
    tab = gc.table.StepCost(1.0, 0.002)
    img = gc.table.StepCost(3.0, 0.01)
    g = gc.table.grid_gpu_hours(runs, tab, img, speedup=2.0, sizes=sizes)
    hopper_s = 8 * 4 * (1.0 + 0.002 * 4000 * 4) / 2.0  # 1000 per client, 4 steps per epoch
    cifar_s = 2 * 4 * (3.0 + 0.01 * 0.25 * 10 * 12) / 2.0  # 3000 per client, 12 steps, 32x32 = a quarter of 64x64
    assert g["gpu_hours"] == pytest.approx((hopper_s + cifar_s) / 3600)
    assert g["runs"] == 2 and g["per_setting"]["hopper"] == pytest.approx(hopper_s / 3600)
    assert g["paper_gpu_hours_per_run"] == pytest.approx(1415 / 764)


def test_grid_of_the_main_preset(gc):
    """The real main grid at paper scale: 200 runs, every data set's sizes known, E and rounds parsed."""
    from fedhead.sweep.presets import plan

    runs = plan("main", "paper")
    one = gc.table.StepCost(0.0, 1.0 / 3600)  # one step = one GPU-second / 3600: hours = steps / 3600^2
    g = gc.table.grid_gpu_hours(runs, one, one, speedup=1.0)
    assert g["runs"] == 200
    assert set(g["per_setting"]) == {
        "beijing",
        "swimmer",
        "hopper",
        "halfcheetah",
        "walker2d",
        "mpiigaze",
        "300w_lp",
        "dsprites",
        "shapes3d",
        "cifar_geo",
    }
    # hopper: 4 procedures x 5 seeds x 8 rounds x 4 clients x 4000 epochs x 4 steps
    assert g["per_setting"]["hopper"] == pytest.approx(20 * 8 * 4 * 4000 * 4 / 3600 / 3600)


def test_window_stats_and_samples(gc):
    samples = gc.table.parse_samples("10.0,50,1000\nbad line\n11.0, 70, 3000\n12.5,90,2000\n13,x,1\n")
    assert samples == [(10.0, 50.0, 1000.0), (11.0, 70.0, 3000.0), (12.5, 90.0, 2000.0)]
    w = gc.table.window_stats(samples, 10.5, 12.5)
    assert w == {"n": 2, "busy_mean": 80.0, "busy_max": 90.0, "mem_max_mib": 3000.0}
    assert gc.table.window_stats(samples, 20, 30)["busy_mean"] is None
    assert gc.table.window_stats(samples, None, 30)["n"] == 0


def _train_json(t0: float) -> dict:
    def case(e, tol, s_step, overhead, proj):
        timed = {"overhead_s": overhead, "s_per_step": s_step, "epochs_run": e, "steps": 4 * e}
        cr = overhead + s_step * 4 * 4000
        return {"E_target": 4000, "local_tol": tol, "client_round_s": cr, "projected": proj, "timed": timed} | {
            "t_start": t0,
            "t_end": t0 + 10,
        }

    return {
        "cases": {"hopper": case(4000, None, 0.001, 2.0, False), "dsprites": case(100, None, 0.004, 3.0, True)},
        "errors": {"hopper_tol": "RuntimeError: boom"},
    }


def test_table_build(gc):
    from fedhead.sweep.presets import plan

    t0 = 1000.0
    conc = {
        "epochs": 100,
        "runs": {"processes": {"4": {"span_s": 2.0, "steps": 1600, "t_start": t0 + 20, "t_end": t0 + 30}}},
        "best": {"mode": "processes", "K": 4, "span_s": 2.0, "steps_per_s": 800.0, "speedup": 3.0},
    }
    deploy = {"ok": True, "run_s": 80.0, "rounds_asked": 2, "clients": 4, "local_epochs": 200}
    deploy |= {"t_start": t0 + 40, "t_end": t0 + 50}
    samples = [(t0 + 5, 60.0, 1000.0), (t0 + 25, 90.0, 5000.0), (t0 + 45, 30.0, 2000.0)]
    text, data = gc.table.build(_train_json(t0), conc, deploy, samples, plan("main", "paper"), dry_run=False)
    assert "train hopper (E=4000)" in text and "FAILED" in text and "(projected)" in text
    assert "processes K=4" in text and "x3.00" in text
    assert data["cases"]["hopper"]["busy_mean"] == 60.0
    assert data["concurrency"]["busy_mean"] == 90.0
    assert data["deploy"]["busy_mean"] == 30.0 and data["deploy"]["ok"]
    assert "10.0 (run wall / client-rounds)" in text  # 80 s / (2 rounds x 4 clients)
    assert data["grid"]["runs"] == 200 and data["grid"]["speedup"] == 3.0
    assert math.isfinite(data["grid"]["gpu_hours"]) and data["grid"]["gpu_hours"] > 0
    assert f"{data['grid']['gpu_hours']:.0f} for 200 runs" in text
    assert "predict nothing" not in text
    # nothing measured: a table all the same, no grid
    text, data = gc.table.build(None, None, None, [], plan("main", "paper"), dry_run=True)
    assert data["grid"] is None and "n/a" in text and "predict nothing" in text


# ------------------------------------------------------------------ driver, steps
def test_run_all_arguments(gc):
    a = gc.run_all.parse_args([])
    assert not a.cpu_dry_run and a.budget == 450 and a.steps == "train,concurrency,deploy"
    a = gc.run_all.parse_args(["--cpu-dry-run", "--steps", "train,deploy", "--out", "x"])
    assert a.cpu_dry_run and a.budget == 330 and a.out == Path("x")
    with pytest.raises(SystemExit):
        gc.run_all.parse_args(["--steps", "train,typo"])
    with pytest.raises(SystemExit):
        gc.run_all.parse_args(["--budget", "5"])
    assert gc.run_all.out_dir(Path("a"), {"OUT": "b"}) == Path("a")
    assert gc.run_all.out_dir(None, {"OUT": "b"}) == Path("b")
    assert gc.run_all.out_dir(None, {}).parent == REPO / "results"
    assert gc.run_all.step_timeout(200, deadline=100.0, now=0.0) == 100 - gc.run_all.RESERVE_S
    assert gc.run_all.step_timeout(50, deadline=100.0, now=0.0) == 50
    assert gc.run_all.step_timeout(50, deadline=100.0, now=95.0) == 0.0
    # every step script exists and parses its arguments
    for script, _, _ in gc.run_all.STEPS.values():
        res = subprocess.run([sys.executable, str(GPUCHECK / script), "--help"], capture_output=True, text=True)
        assert res.returncode == 0 and "--out" in res.stdout, res.stderr


def test_run_step_timeout_and_failure(gc, tmp_path):
    log = open(tmp_path / "log", "w")  # noqa: SIM115
    r = gc.run_all.run_step("x", [sys.executable, "-c", "print('hello')"], 30, log)
    assert r["status"] == "ok"
    r = gc.run_all.run_step("x", [sys.executable, "-c", "import sys; sys.exit(3)"], 30, log)
    assert r["status"] == "failed (exit 3)"
    t0 = time.monotonic()
    r = gc.run_all.run_step("x", [sys.executable, "-c", "import time; print('a', flush=True); time.sleep(60)"], 2, log)
    assert r["status"].startswith("timeout") and time.monotonic() - t0 < 20
    assert gc.run_all.run_step("x", ["true"], 0, log)["status"].startswith("skipped")
    log.close()
    assert (tmp_path / "log").read_text().count("hello") == 1


def test_sizes_and_plans(gc):
    paper = gc.common.PAPER
    assert (paper.hopper.width, paper.hopper.feature_dim, paper.hopper.epochs, paper.hopper.batch_size) == (
        1024,
        512,
        4000,
        256,
    )
    assert paper.hopper.local_tol is None and paper.hopper_tol.local_tol == 1e-4
    assert (paper.dsprites.model, paper.dsprites.width, paper.device) == ("resnet18", 64, "cuda")
    assert (paper.deploy_clients, paper.deploy_rounds, paper.deploy_width) == (4, 2, 1024)
    assert gc.step_train.plan_epochs(4000, 0.01, 45) == 4000
    assert gc.step_train.plan_epochs(4000, 0.1, 45) == 450
    assert gc.step_train.plan_epochs(4000, 100.0, 45) == 1
    assert gc.step_train.steps_per_epoch(1000, 256) == 4 and gc.step_train.steps_per_epoch(100, 256) == 1


def test_concurrency_summary(gc):
    runs = {
        "processes": {1: {"span_s": 1.0, "steps": 100}, 4: {"span_s": 2.0, "steps": 400}},
        "streams": {1: {"span_s": 2.0, "steps": 100}, 4: {"span_s": 5.0, "steps": 400}, 8: {}},
    }
    s = gc.step_concurrency.summarize(runs)
    assert s["best"]["mode"] == "processes" and s["best"]["K"] == 4 and s["best"]["speedup"] == pytest.approx(2.0)
    assert len(s["table"]) == 4  # the failed streams K=8 is left out


def test_monitor_with_a_fake_nvidia_smi(gc, tmp_path):
    mon = gc.gpumon.Monitor(tmp_path / "gpu.csv", interval_s=0.05, command=["echo", "42, 1234"]).start()
    time.sleep(0.5)
    mon.stop()
    samples = gc.table.parse_samples((tmp_path / "gpu.csv").read_text())
    assert samples and all(s[1:] == (42.0, 1234.0) for s in samples)
    missing = gc.gpumon.Monitor(tmp_path / "none.csv", command=["no-such-nvidia-smi"]).start()
    assert "not found" in missing.note and not (tmp_path / "none.csv").exists()


# ------------------------------------------------------------------ wheels
def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_wheel_checks(gc, tmp_path):
    w = gc.wheels
    _wheel(tmp_path, "flwr", "1.42.0", ["grpcio>=1.70", "numpy<3", "ray==2.55.1; extra == 'simulation'", "tomli"])
    _wheel(tmp_path, "grpcio", "1.85.3", [])
    device = {"numpy"}
    assert w.check(tmp_path, device) == [
        "flwr-1.42.0-py3-none-any.whl needs tomli, neither carried nor on the device image"
    ]
    _wheel(tmp_path, "tomli", "2.5.0", ['typing-extensions; python_version < "3.11"'])  # marker false on 3.12
    assert w.check(tmp_path, device) == []
    _wheel(tmp_path, "tomli", "2.4.0", [])
    assert any("2 versions" in p for p in w.check(tmp_path, device))
    (tmp_path / "tomli-2.4.0-py3-none-any.whl").unlink()
    _wheel(tmp_path, "old", "1.0", ["grpcio>=2"])
    assert any("needs grpcio>=2" in p for p in w.check(tmp_path, device))
    # select: device packages stay behind unless carried anyway; numpy and uv always stay
    dest = tmp_path / "dest"
    dest.mkdir()
    _wheel(tmp_path, "numpy", "2.5.5", [])
    _wheel(tmp_path, "rich", "14.3.4", [])
    picked = {p.name.split("-")[0] for p in w.select(tmp_path, dest, {"numpy", "rich", "grpcio"})}
    assert picked == {"flwr", "grpcio", "tomli", "old"}
    assert w.normalize("Typing_Extensions") == "typing-extensions"


def test_device_package_list_and_carry_rules(gc):
    device = gc.wheels.device_packages()
    assert {"torch", "numpy", "grpcio", "protobuf", "pyyaml", "typing-extensions"} <= device
    assert not device & {"flwr", "hydra-core", "omegaconf", "antlr4-python3-runtime", "ray"}
    assert device >= gc.wheels.CARRY_ANYWAY  # carried although there: version-checked or pinned


def test_prepared_wheels_if_present(gc):
    """The wheels gpu_prepare.sh made: complete for the device (skipped when not prepared here)."""
    whl = REPO / ".whl"
    if not (whl / ".complete").is_file():
        pytest.skip("scripts/gpu_prepare.sh has not been run in this checkout")
    assert gc.wheels.check(whl) == []
    names = {gc.wheels.wheel_name(p)[0] for p in whl.glob("*.whl")}
    assert {"flwr", "hydra-core", "omegaconf", "antlr4-python3-runtime", "grpcio", "protobuf"} <= names
    assert not names & {"numpy", "uv", "torch", "ray"}


def test_ignored_and_documented():
    ignored = subprocess.run(
        ["git", "check-ignore", ".whl/x.whl", ".gpu-data/cache/x.npz"], cwd=REPO, capture_output=True, text=True
    )
    assert ignored.stdout.split() == [".whl/x.whl", ".gpu-data/cache/x.npz"]
    page = (REPO / "docs" / "gpu-check.md").read_text()
    assert 'run(command="bash scripts/gpu_check.sh", carry=[".whl", ".gpu-data"], timeout_s=600)' in page


# ------------------------------------------------------------------ the whole dry run
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cpu_dry_run(tmp_path):
    """``scripts/gpu_check.sh --cpu-dry-run``: every step, from the travelling layout, on the CPU."""
    if not (REPO / ".whl" / ".complete").is_file() or not (REPO / ".gpu-data" / "certs" / "ca.crt").is_file():
        pytest.skip("run scripts/gpu_prepare.sh first (it needs a package registry)")
    out = tmp_path / "out"
    t0 = time.monotonic()
    res = subprocess.run(
        # a generous budget: on 2 cores shared with other work each Python start of the deployment takes 10-30 s
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--cpu-dry-run", "--out", str(out), "--budget", "600"],
        capture_output=True,
        text=True,
        timeout=840,
    )
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    steps = json.loads((out / "steps.json").read_text())["steps"]
    assert [s["step"] for s in steps] == ["train", "concurrency", "deploy"]
    assert all(s["status"] == "ok" for s in steps), steps
    train = json.loads((out / "train.json").read_text())
    assert set(train["cases"]) == {"hopper", "hopper_tol", "dsprites"} and not train["errors"]
    deploy = json.loads((out / "deploy.json").read_text())
    assert deploy["ok"] and deploy["results"]["status"] == "completed" and deploy["results"]["all_finite"]
    table = (out / "table.txt").read_text()
    assert "GPU-hours of sweep=main scale=paper" in table and "predict nothing" in table
    assert len([p for p in out.iterdir() if p.is_file()]) <= 8  # what the device tool brings back
    assert "DRY RUN" in res.stdout and "pip accepts" in res.stdout
    print(f"dry run: {took:.0f} s")
