"""Checkpoint and resume (``resume=``), in process with a real ClientApp (no Ray).

A run "crashes" after the clients trained round 3 but before the server recorded it (the
checkpoint holds round 2, the clients' store rounds 2 and 3); the resumed run, with another flwr
run id and fresh in-process caches (a new process), must end bit-identical to an uninterrupted
run of the same config. The same property through ``fedhead-run`` killed with SIGKILL is the slow
test in test_app_simulation.py.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest
from app_helpers import InProcessGrid, simulated_sites

from fedhead.clients import BackboneStore, make_client_app
from fedhead.clients.cache import CLIENT_CACHE
from fedhead.clients.state import simulation_state_dir
from fedhead.driver.checks import check_data_once
from fedhead.driver.errors import EXIT_USAGE, exit_code
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.driver.simulation import prepare_resume
from fedhead.federation.checkpoint import ResumeError, checkpoint_path, data_differences, read_checkpoint
from fedhead.settings.config import compose_config, load_config
from fedhead.settings.job import config_hash

BASE = [
    "model=free",
    "dataset.n_train=240",
    "num_clients=3",
    "rounds=4",
    "local_epochs=5",
    "output.tensorboard=false",
    "output.figures=false",
]


def _jobs(tmp_path: Path, out: str, *overrides: str):
    cfg = load_config(compose_config([*BASE, f"dataset.cache_dir={tmp_path / 'cache'}", *overrides]))
    return cfg.jobs(tmp_path / out)


class _Crash(RuntimeError):
    pass


class RecordingGrid(InProcessGrid):
    """Records ``(message type, server round)`` of every message when it is sent (the strategy
    reuses one config record across rounds)."""

    def push_messages(self, messages):
        messages = list(messages)
        self.log = getattr(self, "log", [])
        self.log += [
            (m.metadata.message_type, m.content.config_records["config"].get("server-round")) for m in messages
        ]
        return super().push_messages(messages)


class CrashingGrid(InProcessGrid):
    """Kills the server (raises) when it sends the evaluate messages of round ``crash_round``:
    the clients have trained and stored that round, the server has not recorded it."""

    def __init__(self, *args, crash_round: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.crash_round = crash_round

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            cfg = m.content.config_records.get("config")
            if m.metadata.message_type == "evaluate" and int(cfg["server-round"]) == self.crash_round:
                raise _Crash(f"killed in round {self.crash_round}")
        return super().push_messages(messages)


def _run(job, grid, resume=None):
    rec = RunRecorder(job, show_progress=False)
    serve(
        grid,
        job,
        rec,
        show_progress=False,
        roster=simulated_sites(job.settings.num_clients).roster,
        resume=resume,
        data_record=check_data_once(job),
    )  # as the driver
    return rec.finish("completed").to_dict()  # the JSON object results.json holds


def _fresh_process_caches():
    CLIENT_CACHE.clear()


def _strip(rounds):  # wall times differ between runs
    return [
        {
            **r,
            "client_metrics": [
                {k: v for k, v in m.items() if k not in ("train_seconds", "local_seconds")} for m in r["client_metrics"]
            ],
        }
        for r in rounds
    ]


@pytest.mark.parametrize("mode", ["clear", "secure"])
def test_crashed_and_resumed_run_matches_an_uninterrupted_run(tmp_path, task_identity, mode):
    """Also in ``privacy.mode=secure``: the resumed secure exchange gives the same pooled moments, bit for bit
    (exact integer sums), and the rounds continue from the checkpointed head."""
    procedure = "proximal"
    (full,) = _jobs(tmp_path, "full", f"procedure={procedure}", f"privacy.mode={mode}")
    reference = _run(full, InProcessGrid(make_client_app(full, simulated_sites(3)), 3, run_id=11))

    (job,) = _jobs(tmp_path, "crashed", f"procedure={procedure}", f"privacy.mode={mode}")
    assert job.config_hash == full.config_hash  # the output folder is not part of the hash
    _fresh_process_caches()
    with pytest.raises(_Crash):
        _run(job, CrashingGrid(make_client_app(job, simulated_sites(3)), 3, run_id=21, crash_round=3))
    ckpt = read_checkpoint(checkpoint_path(job.output_dir))
    assert ckpt.round == 2 and [r["round"] for r in ckpt.state.records] == [0, 1, 2]
    store = BackboneStore(simulation_state_dir(job, 21))
    assert sorted(p.name for p in store.root.glob("partition_0.*")) == ["partition_0.r2.pt", "partition_0.r3.pt"]

    (resumed,) = _jobs(
        tmp_path, "elsewhere", f"procedure={procedure}", f"privacy.mode={mode}", f"resume={tmp_path / 'crashed'}"
    )
    assert resumed.output_dir == job.output_dir and resumed.resume
    (found,) = prepare_resume([resumed])
    assert found.round == 2
    _fresh_process_caches()  # a new process, and a new flwr run id
    grid = RecordingGrid(make_client_app(resumed, simulated_sites(3)), 3, run_id=99)
    res = _run(resumed, grid, resume=found)

    assert [k for k in grid.log if k[0] != "query"] == (  # no finished round repeated
        [("train", 3)] * 3 + [("evaluate", 3)] * 3 + [("train", 4)] * 3 + [("evaluate", 4)] * 3
    )
    assert res["resumed_after_round"] == 2
    assert [r["round"] for r in res["rounds"]] == [0, 1, 2, 3, 4]
    assert _strip(res["rounds"]) == _strip(reference["rounds"])  # bit-identical (JSON floats round-trip)
    if mode == "clear":  # the checkpointed rounds' client metrics count: every client ran 4 rounds of local_epochs=5
        assert res["local_steps"] == reference["local_steps"] and res["local_steps"]["rounds"] == [4, 4, 4]
        assert res["local_steps"]["fixed_epochs"] == [20, 20, 20]
    else:
        assert res["privacy"]["mode"] == "secure" and res["moments"]["covs"] is None
    on_disk = json.loads((job.output_dir / "results.json").read_text())
    assert on_disk["status"] == "completed" and [r["round"] for r in on_disk["rounds"]] == [0, 1, 2, 3, 4]
    assert read_checkpoint(checkpoint_path(job.output_dir)).round == 4


def test_resume_refuses_another_config_or_missing_client_state(tmp_path, task_identity):
    (job,) = _jobs(tmp_path, "run", "procedure=proximal", "rounds=2")
    _run(job, InProcessGrid(make_client_app(job, simulated_sites(3)), 3, run_id=5))
    (other,) = _jobs(tmp_path, "x", "procedure=proximal", "rounds=2", "local_epochs=21", f"resume={tmp_path / 'run'}")
    with pytest.raises(ResumeError, match="another config"):
        prepare_resume([other])
    (same,) = _jobs(
        tmp_path, "x", "procedure=proximal", "rounds=2", "output.figures=true", f"resume={tmp_path / 'run'}"
    )
    assert prepare_resume([same])[0].round == 2  # output.* may differ
    for p in simulation_state_dir(job, 5).glob("partition_1.*"):
        p.unlink()
    assert prepare_resume([same])[0].round == 2  # complete: nothing left to train, no state needed
    (longer,) = _jobs(tmp_path, "x", "procedure=proximal", "rounds=2", f"resume={tmp_path / 'run'}")
    ckpt = read_checkpoint(checkpoint_path(job.output_dir))
    from fedhead.federation.checkpoint import write_checkpoint

    ckpt.state.round, ckpt.state.records = 1, ckpt.state.records[:2]  # as if killed after round 1
    write_checkpoint(ckpt.path, ckpt.state, config_hash=ckpt.config_hash, procedure="proximal", data=ckpt.data)
    with pytest.raises(ResumeError, match=r"partitions \[1\]"):
        prepare_resume([longer])
    (empty,) = _jobs(tmp_path, "x", "procedure=proximal", "rounds=2", f"resume={tmp_path / 'nothing'}")
    with pytest.raises(ResumeError, match="no checkpoint.npz"):
        prepare_resume([empty])


def _write_site(path: Path, n: int, seed: int, scale_f2: float = 1.0) -> Path:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    y = x @ np.array([[1.0, 0.5], [-0.3, 2.0], [0.2, 0.1]]) + 0.3 * rng.normal(size=(n, 2)) + seed
    x[:, 1] *= scale_f2
    rows = [",".join(repr(float(v)) for v in (*x[i], *y[i])) for i in range(n)]
    path.write_text("\n".join(["f1,f2,f3,t1,t2", *rows]) + "\n")
    return path


def _table_jobs(tmp_path: Path, out: str, files, *overrides: str):
    listed = ",".join(f'"{f}"' for f in files)
    return _jobs(
        tmp_path,
        out,
        "dataset=table",
        f"dataset.files=[{listed}]",
        "dataset.targets=[t1,t2]",
        "dataset.n_train=null",
        "procedure=proximal",
        "rounds=2",
        *overrides,
    )


def _listing(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_resume_refuses_edited_site_files_and_keeps_the_run(tmp_path, task_identity):
    """The config hash names the files, not their contents: a feature column edited in place (same
    names, same config) is refused on resume with one line naming the file, and nothing of the
    checkpointed run is touched. The unedited files resume."""
    files = [_write_site(tmp_path / f"site_{i}.csv", 40 + 5 * i, i) for i in range(3)]
    (job,) = _table_jobs(tmp_path, "run", files, "num_clients=3")
    _run(job, InProcessGrid(make_client_app(job, simulated_sites(3)), 3, run_id=5))
    ckpt = read_checkpoint(checkpoint_path(job.output_dir))
    assert [k for k, _ in ckpt.data["site_keys"]] == ["site_0.csv", "site_1.csv", "site_2.csv"]
    (same,) = _table_jobs(tmp_path, "x", files, "num_clients=3", f"resume={tmp_path / 'run'}")
    assert prepare_resume([same])[0].round == 2  # the same bytes: resumable

    before = _listing(tmp_path / "run")
    _write_site(files[1], 45, 1, scale_f2=3.0)  # feature f2 of site_1 edited; the targets are untouched
    (edited,) = _table_jobs(tmp_path, "x", files, "num_clients=3", f"resume={tmp_path / 'run'}")
    assert edited.config_hash == job.config_hash  # what the old check compared
    with pytest.raises(ResumeError) as info:
        prepare_resume([edited])
    msg = str(info.value)
    assert "\n" not in msg and exit_code(info.value) == EXIT_USAGE
    assert "the data differ from the checkpointed run's (site keys: site_1.csv changed; " in msg, msg
    assert "input statistics (mean/variance) of client " in msg and "target standardisation" not in msg, msg
    assert _listing(tmp_path / "run") == before  # nothing of the previous run removed or rewritten


def test_resume_refuses_a_checkpoint_without_a_data_record(tmp_path, task_identity):
    """A checkpoint written before the data record existed (or by a deployed ServerApp) cannot be
    checked: the simulation refuses it with one line, and leaves it as it was."""
    files = [_write_site(tmp_path / f"site_{i}.csv", 40, i) for i in range(3)]
    (job,) = _table_jobs(tmp_path, "run", files, "num_clients=3")
    _run(job, InProcessGrid(make_client_app(job, simulated_sites(3)), 3, run_id=5))
    from fedhead.federation.checkpoint import write_checkpoint

    ckpt = read_checkpoint(checkpoint_path(job.output_dir))
    write_checkpoint(ckpt.path, ckpt.state, config_hash=ckpt.config_hash, procedure=ckpt.procedure)  # data=None
    before = _listing(tmp_path / "run")
    (again,) = _table_jobs(tmp_path, "x", files, "num_clients=3", f"resume={tmp_path / 'run'}")
    with pytest.raises(ResumeError, match="its checkpoint records no site keys, standardisation or input statistics"):
        prepare_resume([again])
    assert _listing(tmp_path / "run") == before


def test_data_differences_name_what_differs_never_a_value():
    base = {
        "site_keys": [["a.csv", "k1"], ["b.csv", "k2"]],
        "target_names": ["t1", "t2"],
        "target_offset": [1.5, 123456.789],
        "target_scale": [2.0, 3.0],
        "input_mean": [[0.1, 0.2], [0.3, 0.4]],
        "input_var": [[1.0, 1.0], [1.0, 1.0]],
    }
    assert data_differences(base, json.loads(json.dumps(base))) == []
    scaled = {**base, "target_scale": [2.0, 3.5]}
    assert data_differences(base, scaled) == ["target standardisation (offset/scale) of 't2'"]
    moved = {**base, "input_var": [[1.0, 1.0], [1.0, 7.25]]}
    assert data_differences(base, moved) == ["input statistics (mean/variance) of client 1, input column(s) [1]"]
    renamed = {**base, "site_keys": [["c.csv", "k1"], ["b.csv", "k2"]]}
    assert data_differences(base, renamed) == ["site keys: a.csv removed, c.csv added"]
    text = "; ".join(data_differences(base, {**scaled, **moved, "target_offset": [9.0, 123456.789]}))
    assert "123456" not in text and "7.25" not in text and "9.0" not in text and "3.5" not in text


def test_config_hash_ignores_only_resume_and_output():
    base = {"rounds": 4, "seed": 0, "output": {"dir": "a"}, "resume": None}
    assert config_hash(base) == config_hash({**base, "output": {"dir": "b"}, "resume": "/x"})
    assert config_hash(base) != config_hash({**base, "seed": 1})


def test_config_hash_counts_a_config_class_by_name_not_module():
    """A config class moved to another module keeps finished runs resumable; another class does not."""
    base = {"train": {"_target_": "fedhead.train.config.TrainConfig", "lr": 1e-3}, "seed": 0}
    moved = {**base, "train": {**base["train"], "_target_": "fedhead.elsewhere.TrainConfig"}}
    other = {**base, "train": {**base["train"], "_target_": "mine.OtherConfig"}}
    assert config_hash(moved) == config_hash(base) != config_hash(other)


def test_round_records_round_trip_through_a_checkpoint(tmp_path):
    from fedhead.federation.checkpoint import ServerState, write_checkpoint
    from fedhead.federation.tracking import RoundRecord

    rec = RoundRecord(
        round=0,
        gram=np.eye(2) / 3,
        bias=np.array([0.1, 1 / 7]),
        e_f_star=1 / 3,
        e_f_cen=None,
        e_f_within=0.2,
        d_star=0.1,
        d_cen=None,
        d_within=None,
        e_f_reference=1 / 3,
        recursion_gram=np.eye(2) / 3,
        e_f_recursion=0.0,
        trajectory_error=None,
        predicted_gram=np.eye(2) / 9,
        extra={"alignment_gram_error": 1e-9},
    )
    state = ServerState(
        round=0,
        weight=np.ones((2, 3)) / 3,
        bias=np.zeros(2),
        records=[rec.to_dict()],
        recursion=np.eye(2)[None] / 3,
        counts=np.array([3.0, 4.0]),
        means=np.zeros((2, 2)),
        covs=np.stack([np.eye(2)] * 2),
        extra={"backbone/w": np.arange(3, dtype=np.float32)},
    )
    path = write_checkpoint(tmp_path / "checkpoint.npz", state, config_hash="abc", procedure="proximal")
    back = read_checkpoint(path)
    again = RoundRecord.from_dict(back.state.records[0])
    assert again.to_dict() == rec.to_dict() and again.extra == rec.extra
    np.testing.assert_array_equal(back.state.weight, state.weight)
    assert back.state.extra["backbone/w"].dtype == np.float32


# ------------------------------------------------------------------ fedhead-run killed with SIGKILL
REPO = Path(__file__).resolve().parents[2]


def _cli(tmp_path: Path, run_dir: Path, *extra: str) -> list[str]:
    import sys

    return [
        sys.executable,
        "-m",
        "fedhead.cli.run",
        "procedure=proximal",
        *BASE[:4],
        "local_epochs=50",
        "output.tensorboard=false",
        "output.figures=false",
        "resources.client_cpus=1",
        f"dataset.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]


def _env():
    import os

    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_fedhead_run_killed_and_resumed_matches_an_uninterrupted_run(tmp_path):
    """SIGKILL of ``fedhead-run`` once round >= 2 is checkpointed, then ``resume=``: the same rounds
    as an uninterrupted run (Grams bit-identical on CPU), none repeated; another config is refused."""
    import os
    import signal
    import subprocess
    import time

    full = subprocess.run(
        _cli(tmp_path, tmp_path / "full"), cwd=tmp_path, capture_output=True, text=True, timeout=900, env=_env()
    )
    assert full.returncode == 0, full.stderr[-4000:]
    reference = json.loads((tmp_path / "full" / "proximal" / "results.json").read_text())

    killed = tmp_path / "killed"
    ckpt_file = killed / "proximal" / "checkpoint.npz"
    proc = subprocess.Popen(
        _cli(tmp_path, killed),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        at = None
        while time.monotonic() < deadline and proc.poll() is None:
            if ckpt_file.is_file() and read_checkpoint(ckpt_file).round >= 2:
                os.kill(proc.pid, signal.SIGKILL)
                at = read_checkpoint(ckpt_file).round
                break
            time.sleep(0.02)
        proc.wait(timeout=60)
    finally:
        # the Ray processes the killed driver left behind (its own process group)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert at is not None and 2 <= at < 4, f"not killed mid-way (checkpoint round {at}, rc {proc.returncode})"
    assert any((killed / "proximal" / "client_state").iterdir())  # kept for the resume

    other = subprocess.run(
        _cli(tmp_path, tmp_path / "other", "seed=1", f"resume={killed}"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert other.returncode != 0 and "fedhead-run: error: cannot resume" in other.stderr
    assert "Traceback" not in other.stderr, other.stderr[-2000:]

    resumed = subprocess.run(
        _cli(tmp_path, tmp_path / "resumed", f"resume={killed}"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    res = json.loads((killed / "proximal" / "results.json").read_text())
    assert res["status"] == "completed" and res["resumed_after_round"] == at
    assert [r["round"] for r in res["rounds"]] == [0, 1, 2, 3, 4]
    for a, b in zip(res["rounds"], reference["rounds"], strict=True):
        np.testing.assert_allclose(a["gram"], b["gram"], rtol=0, atol=1e-10)
        assert a["gram"] == b["gram"] and a["train_mse"] == b["train_mse"]  # bit-identical on CPU
    assert not (killed / "proximal" / "client_state").exists()  # removed after the completed run


# ------------------------------------------------------------------ flwr run . (deployments)
def _deployment(tmp_path: Path, out: str, *, resume: bool = False, extra: str = "") -> dict:
    return {
        "overrides": f"procedure=proximal {' '.join(BASE)} dataset.cache_dir={tmp_path / 'cache'} {extra}".strip(),
        "procedure-index": 0,
        "output-dir": str(tmp_path / out),
        "resume": resume,
    }


def _node_local(grid: InProcessGrid, tmp_path: Path) -> InProcessGrid:
    """Each SuperNode keeps its private backbones in its own ``state-dir`` (as deployed)."""
    for n, ctx in grid.contexts.items():
        ctx.node_config["state-dir"] = str(tmp_path / f"node{n}")
    return grid


def test_a_deployed_serverapp_resumes_from_its_checkpoint(tmp_path, task_identity):
    """``flwr run . --run-config 'resume=true ...'``: the ServerApp of fedhead.server_app continues
    after the checkpointed round of its output-dir, the ClientApps from their node-local stores
    (another flwr run id), bit-identical to an uninterrupted deployment; another config or a
    folder without a checkpoint is refused before anything is written."""
    from fedhead import client_app, server_app

    def serve_app(grid):
        server_app.app(grid, next(iter(grid.contexts.values())))

    ref_grid = _node_local(
        InProcessGrid(client_app.app, 3, run_id=11, run_config=_deployment(tmp_path, "ref")), tmp_path / "ref_nodes"
    )
    serve_app(ref_grid)
    reference = json.loads((tmp_path / "ref" / "proximal" / "results.json").read_text())

    _fresh_process_caches()
    crashing = _node_local(
        CrashingGrid(client_app.app, 3, run_id=21, run_config=_deployment(tmp_path, "dep"), crash_round=3),
        tmp_path / "nodes",
    )
    with pytest.raises(_Crash):
        serve_app(crashing)
    job_dir = tmp_path / "dep" / "proximal"
    assert json.loads((job_dir / "results.json").read_text())["status"] == "failed"
    assert read_checkpoint(checkpoint_path(job_dir)).round == 2

    # refused: another config, or nothing to resume; results.json is left as it was
    for cfg, match in (
        (_deployment(tmp_path, "dep", resume=True, extra="local_epochs=21"), "another config"),
        (_deployment(tmp_path, "empty", resume=True), "no checkpoint.npz"),
    ):
        grid = _node_local(InProcessGrid(client_app.app, 3, run_id=98, run_config=cfg), tmp_path / "nodes")
        with pytest.raises(ResumeError, match=match):
            serve_app(grid)
        assert not grid.sent  # before any message
    assert json.loads((job_dir / "results.json").read_text())["status"] == "failed"

    _fresh_process_caches()  # new processes and a new run id; the SuperNodes keep their state-dir
    grid = _node_local(
        RecordingGrid(client_app.app, 3, run_id=99, run_config=_deployment(tmp_path, "dep", resume=True)),
        tmp_path / "nodes",
    )
    serve_app(grid)
    assert [k for k in grid.log if k[0] != "query"] == (
        [("train", 3)] * 3 + [("evaluate", 3)] * 3 + [("train", 4)] * 3 + [("evaluate", 4)] * 3
    )
    res = json.loads((job_dir / "results.json").read_text())
    assert res["status"] == "completed" and res["resumed_after_round"] == 2
    assert [r["round"] for r in res["rounds"]] == [0, 1, 2, 3, 4]
    assert _strip(res["rounds"]) == _strip(reference["rounds"])
    assert res["provenance"]["run_config"]["resume"] is True
