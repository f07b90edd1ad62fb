"""A deployed message starts a fresh ``flwr-clientapp`` process that imports ``fedhead.client_app``:
a message that touches no model (the statistics query, a SecAgg step, a site's regime check, a
site-local moment query) imports no torch; only training, evaluation and the mismatch query, which
build a model, do. Each check runs in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchvision", "tensorboard", "matplotlib")

#: Three sites of a secure table job answer the secure statistics exchange (the sum begins), its first
#: SecAgg step (share-keys) and the regime check; then a clear site answers the statistics query and a
#: moment query in the pooled standardisation: all through fedhead's ClientApp.
SITES = """
import sys
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

import fedhead.client_app  # noqa: F401 - what flwr-clientapp imports first
from fedhead.cli.keys import assemble, new_site
from fedhead.clients import make_client_app
from fedhead.federation import protocol
from fedhead.federation import secure_records as sr
from fedhead.settings.config import compose_config, load_config

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 1
tmp = Path(sys.argv[1])
rng = np.random.default_rng(0)
files = []
for i in range(3):
    x, y = rng.normal(size=(40, 2)), rng.normal(size=(40, 2))
    rows = [",".join(repr(float(v)) for v in row) for row in np.column_stack([x, y])]
    files.append(tmp / f"site{i}.csv")
    files[-1].write_text("\\n".join(["f1,f2,t1,t2", *rows]) + "\\n")
base = ["dataset=table", "dataset.targets=[t1,t2]", "model=free", "output.tensorboard=false",
        "output.figures=false", "dataset.num_clients=3", "rounds=1", "procedure=exact"]


def job(*overrides):
    return load_config(compose_config([*base, *overrides])).jobs(str(tmp / "out"))[0]


keys = [new_site(f"site-{i}", tmp / "keys") for i in range(3)]
assemble([entry for _, entry in keys], tmp / "roster.json")


def context(i):
    node = {"partition-id": i, "data-path": str(files[i]), "signing-key": str(keys[i][0]),
            "roster": str(tmp / "roster.json")}
    return Context(run_id=21, node_id=100 + i, node_config=node, state=RecordDict(), run_config={})


def ask(app, ctx, config, records=None):
    content = RecordDict({protocol.CONFIG: ConfigRecord(config), **(records or {})})
    reply = app(Message(content=content, dst_node_id=ctx.node_id, message_type="query"), ctx)
    assert not reply.has_error(), reply.error
    return reply.content


secure = make_client_app(job("privacy.mode=secure"))
sites = [context(i) for i in range(3)]
begun = {ctx.node_id: ask(secure, ctx, {protocol.STAGE: protocol.STAGE_STATISTICS, sr.SUM_ID: "light/exchange"})
         for ctx in sites}
book = {n: sr.unpack_keys(c.config_records[sr.SECURE][sr.PAYLOAD]) for n, c in begun.items()}
step = {protocol.STAGE: sr.STAGE_SECURE, sr.SUM_ID: "light/exchange", sr.STEP: sr.SHARE_KEYS}
payload = ConfigRecord({sr.PAYLOAD: sr.pack_book(book, 2)})
for ctx in sites:
    shares = ask(secure, ctx, step, {sr.SECURE: payload})
    assert set(sr.unpack_shares(shares.config_records[sr.SECURE][sr.PAYLOAD]).ciphertexts) == set(book) - {ctx.node_id}
zeros, ones = Array(np.zeros(2)), Array(np.ones(2))
pooled = {protocol.STANDARDIZATION: ArrayRecord({protocol.TARGET_OFFSET: zeros, protocol.TARGET_SCALE: ones,
                                                 protocol.INPUT_OFFSET: zeros, protocol.INPUT_SCALE: ones})}
regime = ask(secure, sites[0], {protocol.STAGE: sr.STAGE_REGIME}, pooled)
assert regime.metric_records[protocol.METRICS][sr.FULLY_ACTIVE] in (0, 1)
clear_app = make_client_app(job())
clear = ask(clear_app, context(0), {protocol.STAGE: protocol.STAGE_STATISTICS})
assert clear.array_records[protocol.SITE_STATS][protocol.Y_MEAN].numpy().shape == (2,)
moments = ask(clear_app, context(0), {}, pooled)
assert moments.array_records[protocol.MOMENTS][protocol.COV].numpy().shape == (2, 2)
print(sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY)))
"""


def _fresh(code: str, *args: str) -> str:
    """``code`` run in a fresh interpreter (``HEAVY`` defined): its stdout's last line."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    script = f"HEAVY = {HEAVY!r}\n" + textwrap.dedent(code)
    res = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.strip().splitlines()[-1]


def test_the_statistics_query_a_secagg_step_the_regime_check_and_the_moment_query_import_no_torch(tmp_path):
    assert _fresh(SITES, str(tmp_path)) == "[]"


def test_the_client_apps_module_imports_no_torch():
    """flwr-clientapp imports the app's module before every message: torch comes with the first handler that
    needs it. (The ServerApp's module does import torch: its process lives for the whole run, and its job
    builds models.)"""
    code = "import sys, fedhead.client_app\nprint(sorted({m.split('.')[0] for m in sys.modules} & set(HEAVY)))"
    assert _fresh(code) == "[]"


#: One deployed run at one site, two messages in two fresh processes, the node's state carried between them as flwr
#: carries it: the first builds the job from the run config (Hydra) and keeps it in the state; the second answers
#: a statistics query from the kept job. argv: the folder, "first" or "second".
TWO_MESSAGES = """
import pickle
import sys
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

import fedhead.client_app as ca
from fedhead.clients.cache import JOB_STATE
from fedhead.federation import protocol

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 5, 0, 1
tmp, which = Path(sys.argv[1]), sys.argv[2]
site = tmp / "site.csv"
if which == "first":
    rows = np.random.default_rng(0).normal(size=(40, 4))
    site.write_text("\\n".join(["f1,f2,t1,t2", *(",".join(repr(float(v)) for v in r) for r in rows)]) + "\\n")
overrides = "dataset=table dataset.targets=[t1,t2] model=free procedure=exact rounds=1 dataset.num_clients=3"
run_config = {"overrides": overrides, "output-dir": str(tmp / "out")}
state = RecordDict() if which == "first" else pickle.loads((tmp / "state.pkl").read_bytes())
ctx = Context(run_id=5, node_id=9, node_config={"data-path": str(site)}, state=state, run_config=run_config)
msg = Message(RecordDict({protocol.CONFIG: ConfigRecord({protocol.STAGE: protocol.STAGE_STATISTICS})}), dst_node_id=9,
              message_type="query")
reply = ca.app(msg, ctx)
assert not reply.has_error(), reply.error
(tmp / "state.pkl").write_bytes(pickle.dumps(ctx.state))
print(ca.job_of_run(ctx).config_hash, JOB_STATE in ctx.state,
      sorted({m.split(".")[0] for m in sys.modules} & {"hydra", "omegaconf", *HEAVY}), flush=True)
import os
os._exit(0)  # what is measured is printed; a native thread once aborted the interpreter's teardown on busy cores
"""


def test_a_runs_later_message_takes_its_job_from_the_nodes_state_without_hydra(tmp_path):
    """The job built at a run's first message at a node is kept in ``context.state``: a later message (a fresh
    process) answers from it, the same job, with neither Hydra nor OmegaConf imported."""
    first = _fresh(TWO_MESSAGES, str(tmp_path), "first").split(" ", 2)
    second = _fresh(TWO_MESSAGES, str(tmp_path), "second").split(" ", 2)
    assert first[:2] == [first[0], "True"] and first[2] == "['hydra', 'omegaconf']"
    assert second == [first[0], "True", "[]"]
