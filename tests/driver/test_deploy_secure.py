"""``privacy.mode=secure`` in a real deployment on loopback (flwr 1.42, marked ``slow``).

The own-data tutorial's setting (docs/own-data.md, (b)): three per-site CSV files
(``examples/own-data/make_sites.py``), one SuperLink with TLS and SuperNode authentication, one
SuperNode per site naming only its file (``data-path``) and its ``state-dir``, ClientApps in
subprocess isolation, ``flwr run .`` with ``privacy.mode=secure`` among the run config's
``overrides``. Each site has its signing key from ``fedhead-keys new-site`` and the roster from
``fedhead-keys roster`` in its node config (``signing-key``, ``roster``); the server the roster in the
run config (``roster``). The exchange's secure sum crosses the SuperLink as five ``query``/phase messages
per site; each round's as three (its training message, the survivor list, the reveal: its keys and key
shares came with the previous sum's messages), and the site's SecAgg state lives in the node's
``context.state`` between them (each message starts another ``flwr-clientapp`` process). The clear
reference is the same job run in process (``InProcessGrid``, real ClientApps, each reading its own
file; the tutorial's deployment and simulation agree bit for bit in clear mode).

Twelve message phases (the statistics query, its four SecAgg steps and the sites' own regime check;
each of two rounds' training and its two steps; no evaluation), each starting one ``flwr-clientapp``
process per site.

    pytest -m slow tests/driver/test_deploy_secure.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from app_helpers import InProcessGrid, pooled_g_cen
from deploy_helpers import REPO, Processes, flwr, run_status, start_site_federation

from fedhead.cli.keys import assemble, new_site
from fedhead.clients import make_client_app
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.results import schema
from fedhead.settings.config import compose_config, load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SITES = ("a", "b", "c")
ROWS = 100
RUN_LIMIT_S = 600
#: the tutorial's job, one round, trained to the local optimum (local_tol: the Grams' tolerance)
LOCAL_TOL = 1e-5
JOB = (
    "dataset=table dataset.targets=[t1,t2] model=free procedure=proximal rounds=2 local_epochs=2000 "
    f"local_tol={LOCAL_TOL} resources.evaluate_mse=false output.tensorboard=false output.figures=false"
)


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


def _targets(path: Path) -> np.ndarray:
    header = path.read_text().splitlines()[0].split(",")
    rows = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    return rows[:, [header.index("t1"), header.index("t2")]]


def _clear_in_process(files: list[Path], out: Path):
    """The same job in clear mode, in this process (no Ray): one client per file, in file order."""
    listed = ",".join(str(f) for f in files)
    job = load_config(compose_config([*JOB.split(), f"dataset.files=[{listed}]"])).jobs(out)[0]
    recorder = RunRecorder(job, show_progress=False)
    serve(InProcessGrid(make_client_app(job), len(files)), job, recorder, show_progress=False)
    return recorder.finish("completed")


@pytest.fixture
def site_federation(tmp_path):
    """Three sites' files, a TLS SuperLink with SuperNode authentication and one SuperNode per file, online."""
    for tool in ("openssl", "ssh-keygen", "flwr", "flower-superlink", "fedhead-supernode"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not on PATH")
    sites = tmp_path / "sites"
    subprocess.run(
        [sys.executable, str(REPO / "examples/own-data/make_sites.py"), "--rows", str(ROWS), "--out", str(sites)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    files = [sites / f"site_{s}.csv" for s in SITES]
    entries = [new_site(f"site-{s}", tmp_path / "keys") for s in SITES]  # each site's own, in deployment
    roster = tmp_path / "keys" / "roster.json"
    assemble([entry for _, entry in entries], roster)
    logs = tmp_path / "logs"
    logs.mkdir()
    procs = Processes(logs)
    try:
        env = start_site_federation(tmp_path, files, [(str(key), str(roster)) for key, _ in entries], procs)
        yield tmp_path, files, env, procs, roster
    finally:
        procs.stop()


def test_secure_mode_in_a_site_local_tls_deployment(site_federation, task_identity):
    """The run completes with only secure sums reaching the server; ``G_cen`` equals clear mode's to 1e-9
    relative and the final Gram to the run's local tolerance."""
    work, files, env, procs, roster = site_federation
    t0 = time.monotonic()
    out = work / "out"
    overrides = f"{JOB} dataset.files=[] dataset.num_clients={len(files)} privacy.mode=secure"
    try:
        run = flwr(
            [
                "run",
                ".",
                "loopback",
                "--stream",
                "--run-config",
                f"overrides='{overrides}' output-dir='{out}' roster='{roster}'",
            ],
            env,
            limit=RUN_LIMIT_S,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"flwr run took over {RUN_LIMIT_S}s:\n{(err.stdout or b'')[-3000:]!r}\n{procs.tail('superlink')}")
    run_s = time.monotonic() - t0
    (work / "logs" / "flwr-run.log").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run_status(run.stdout, env) == "finished:completed", procs.tail("superlink")

    secure = schema.read(out / "proximal" / "results.json")
    assert secure.status == "completed", (out / "proximal" / "run.log").read_text()[-3000:]
    assert secure.provenance.get("fab", {}).get("fab_hash")  # it ran through flwr run
    assert secure.privacy["mode"] == "secure" and secure.privacy["sites"] == len(files)
    assert secure.moments["covs"] is None and secure.moments["counts"] is None
    assert secure.targets["g_star"] is None
    assert [r.round for r in secure.rounds] == [0, 1, 2]
    assert all(r.extra.get("secure_sites") == len(files) for r in secure.rounds[1:])
    # the SecAgg steps crossed the SuperLink: statistics + 3 steps (share keys, mask and sign, reveal) + the
    # regime check, then each round in two message phases: training (with the signed full list) + the reveal
    assert [kind for kind, _ in secure.timing.phases] == ["query"] * 5 + ["train", "query"] * 2

    clear = _clear_in_process(files, work / "clear")
    assert clear.targets["g_star"] is not None  # clear mode
    g_cen = pooled_g_cen([_targets(f) for f in files], clear.config["lambda_h"], clear.config["lambda_w"])
    assert _rel(clear.targets["g_cen"], g_cen) < 1e-10
    g_cen_rel = _rel(secure.targets["g_cen"], clear.targets["g_cen"])
    gram_rel = _rel(secure.rounds[-1].gram, clear.rounds[-1].gram)
    assert g_cen_rel < 1e-9 and gram_rel < LOCAL_TOL, (g_cen_rel, gram_rel)
    # the private backbones stay with the SuperNodes, nothing of a site's state under the server's output
    for k in range(1, len(files) + 1):
        assert list((work / f"node{k}").rglob("*.pt")), f"no private state under node{k}"
    assert not list(out.rglob("*.pt"))
    phases = [f"{kind} {secs:.1f}" for kind, secs in secure.timing.phases]
    print(f"secure deployment: flwr run {run_s:.0f} s; G_cen {g_cen_rel:.1e}, Gram {gram_rel:.1e} relative; {phases}")
