"""What one deployed message costs a site (flwr 1.42, SuperNode ``--isolation subprocess``).

Every message starts a ``flwr-clientapp`` process at each site: the interpreter, flwr's own imports,
the FAB's installation, ``import fedhead.client_app``, the job built from the run config, then the
handler. Each piece is timed here in fresh interpreters, ``--repeat`` times (minimum and median),
for a statistics query and a SecAgg step (share-keys) of a 3-site table job, and for the statistics query
as a later message of the run, whose job the node's state keeps (``later``); flwr's polling delays
are read from flwr's source. What they add up to, and the deployment's phases: docs/deployment.md
("What a message costs").

    python benchmarks/bench_message_cost.py                 # 5 repeats
    python benchmarks/bench_message_cost.py --repeat 1      # quick (tested)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: One message's process, as flwr-clientapp runs it; prints its timings as JSON.
MESSAGE = r"""
import json, pickle, sys, time
from pathlib import Path

t0 = time.perf_counter()
import flwr.supernode.runtime.run_clientapp  # noqa: F401 - what flwr-clientapp imports first
t1 = time.perf_counter()
from flwr.cli.install import install_from_fab

install_from_fab(Path(sys.argv[1]), skip_prompt=True)
t2 = time.perf_counter()
import fedhead.client_app as ca
t3 = time.perf_counter()
import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedhead.federation import protocol
from fedhead.federation import secure_records as sr

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 1
work, secure, later = Path(sys.argv[2]), sys.argv[3] == "secure", sys.argv[3] == "later"
files = sorted(work.glob("site*.csv"))
overrides = (
    "dataset=table dataset.targets=[t1,t2] model=free procedure=exact rounds=1 output.tensorboard=false "
    f"output.figures=false dataset.num_clients={len(files)}" + (" privacy.mode=secure" if secure else "")
)
run_config = {"overrides": overrides, "output-dir": str(work / "out")}


def context(i, state=None):
    node = {"partition-id": i, "data-path": str(files[i]), "signing-key": str(work / "keys" / f"site-{i}.key")}
    node["roster"] = str(work / "keys" / "roster.json")
    return Context(run_id=21, node_id=100 + i, node_config=node, state=state or RecordDict(), run_config=run_config)


def ask(ctx, config, records=None):
    content = RecordDict({protocol.CONFIG: ConfigRecord(config), **(records or {})})
    reply = ca.app(Message(content=content, dst_node_id=ctx.node_id, message_type="query"), ctx)
    assert not reply.has_error(), reply.error
    return reply.content


kept = pickle.loads((work / "state.pkl").read_bytes()) if later else None  # the node's state: the run's job
site0 = context(0, kept)
ca.job_of_run(site0)
t4 = time.perf_counter()
job = t4 - t3
stats, setup = {protocol.STAGE: protocol.STAGE_STATISTICS}, 0.0
if not secure:
    ask(site0, stats)
    t5 = time.perf_counter()
    (work / "state.pkl").write_bytes(pickle.dumps(site0.state))  # what the SuperNode keeps for the next message
else:  # the other sites begin the sum here; only this site's share-keys step is timed
    sites = [context(i) for i in range(len(files))]
    begun = {c.node_id: ask(c, {**stats, sr.SUM_ID: "x"}) for c in sites}
    book = {n: sr.unpack_keys(c.config_records[sr.SECURE][sr.PAYLOAD]) for n, c in begun.items()}
    step = {protocol.STAGE: sr.STAGE_SECURE, sr.SUM_ID: "x", sr.STEP: sr.SHARE_KEYS}
    begin = time.perf_counter()
    ask(sites[0], step, {sr.SECURE: ConfigRecord({sr.PAYLOAD: sr.pack_book(book, 2)})})
    t5 = time.perf_counter()
    setup, t4 = begin - t4, begin  # the sum's begins: earlier messages, not this one
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "torchvision", "tensorboard", "matplotlib", "hydra"})
times = {"flwr": t1 - t0, "fab": t2 - t1, "app": t3 - t2, "job": job, "handler": t5 - t4, "setup": setup}
print(json.dumps({**times, "heavy": heavy}))
"""

#: flwr 1.42's waits around a message (seconds): the SuperNode's pull loop when idle
#: (supernode/start_client_internal.py, fixed), the SuperExec's task poll (FLWR_SUPEREXEC_TASK_POLL_INTERVAL,
#: supercore/superexec/run_superexec.py) and the SuperNode's wait for the ClientApp's reply (fixed).
POLLS = {"SuperNode pull when idle": 3.0, "SuperExec task poll (default)": 1.0, "reply wait": 0.5}


#: The messages timed: a statistics query (a run's first message at the site: the job is built), a SecAgg step,
#: the statistics query again as a later message of the run (the job kept in the node's state).
KINDS = ("clear", "secure", "later")


def build_fab(out: Path) -> Path:
    """The FAB that ``flwr run .`` sends (``flwr build`` of this repository)."""
    subprocess.run(["flwr", "build", "--app", str(REPO)], cwd=out, check=True, capture_output=True, timeout=300)
    return next(out.glob("*.fab"))


def write_sites(work: Path, n: int = 3, rows: int = 40) -> None:
    """``n`` site files of the own-data kind (inputs f1, f2; targets t1, t2), and for secure mode each site's
    signing key ``keys/site-<i>.key`` and their roster ``keys/roster.json`` (``fedhead-keys``)."""
    import numpy as np

    from fedhead.cli.keys import assemble, new_site

    entries = [new_site(f"site-{i}", work / "keys")[1] for i in range(n)]
    assemble(entries, work / "keys" / "roster.json")

    rng = np.random.default_rng(0)
    for i in range(n):
        table = np.column_stack([rng.normal(size=(rows, 2)), rng.normal(size=(rows, 2))])
        lines = [",".join(repr(float(v)) for v in row) for row in table]
        (work / f"site{i}.csv").write_text("\n".join(["f1,f2,t1,t2", *lines]) + "\n")


def one_message(fab: Path, work: Path, kind: str, env: dict[str, str]) -> dict:
    """One message's process: its pieces (s), the interpreter's start and the whole wall time."""
    start = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-c", MESSAGE, str(fab), str(work), kind],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=work,
    )
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"{kind} message failed: {res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["wall"] = wall
    out["python"] = wall - sum(out[k] for k in ("flwr", "fab", "app", "job", "handler", "setup"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes per message kind (default 5)")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fab = build_fab(work)
        write_sites(work)
        paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, FLWR_HOME=str(work / "flwr-home"), OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        load = os.getloadavg()[0]
        runs = {kind: [one_message(fab, work, kind, env) for _ in range(args.repeat)] for kind in KINDS}
    print(f"one message's flwr-clientapp process, {args.repeat} fresh process(es) each, load average {load:.1f}")
    print(f"{'piece':<28}" + "".join(f"{k + ' min':>13}{k + ' median':>15}" for k in runs))
    pieces = {
        "interpreter + exit": "python",
        "flwr's imports": "flwr",
        "FAB install": "fab",
        "import fedhead.client_app": "app",
        "job (run config or state)": "job",
        "handler": "handler",
        "whole process": "wall",
    }
    for label, key in pieces.items():
        stats = [(min(r[key] for r in rs), statistics.median(r[key] for r in rs)) for rs in runs.values()]
        cells = "".join(f"{lo:13.2f}{mid:15.2f}" for lo, mid in stats)
        print(f"{label:<28}{cells}")
    print("heavy modules loaded: " + "; ".join(f"{k} {rs[0]['heavy'] or 'none'}" for k, rs in runs.items()))
    print("flwr's waits (s, each adds up to its value): " + ", ".join(f"{k} {v:g}" for k, v in POLLS.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
