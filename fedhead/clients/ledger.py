"""What a site remembers of its runs and of what it released: [`SiteLedger`][fedhead.clients.ledger.SiteLedger].

Per run (its scope: flwr's run id and, in a simulation serving several jobs, the job's key;
[`run_scope`][fedhead.clients.ledger.run_scope]) a site keeps the one standardisation it accepted, the
questions it answered once, the secure sums it began and, once it refused the run, the line it refused it
with. Over every run it keeps its noised releases, the epsilon ledger of its policy's ``epsilon-budget``
([`fedhead.clients.policy`][fedhead.clients.policy]), and the ids of the secure sums it took part in (a sum
id is never used twice: [`with_used_sum_ids`][fedhead.clients.ledger.SiteLedger.with_used_sum_ids]).

The ledger lives in the node's ``state-dir`` when its node config names one
(``<state-dir>/privacy-ledger/<site>.json``: written atomically under a file lock, so it survives a
restart of the SuperNode and two runs at once), else in the node's context state (a simulation: the run's
lifetime). Nothing in it leaves the site.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from flwr.app import ConfigRecord, Context

from fedhead.clients.policy import PolicyRefusal, SitePolicy, ledger_epsilon
from fedhead.clients.state import DATA_PATH_KEY, PARTITION_ID_KEY, STATE_DIR_KEY
from fedhead.federation.roster import UsedSumIds
from fedhead.federation.run_privacy import TrainingRelease
from fedhead.results.io import write_bytes_atomic

log = logging.getLogger(__name__)

#: The ledgers' folder under a node's ``state-dir``.
LEDGER_DIR = "privacy-ledger"
_STATE_KEY = "fedhead-site-ledger"  # the node's context state: ConfigRecord {"ledger": JSON text}
_USED_SUM_IDS = "used-sum-ids"  # the ledger's record of the secure sums' ids (base64 of their digests)
T = TypeVar("T")


def run_scope(context: Context, job_key: str = "") -> str:
    """The run a message belongs to: flwr's run id, and the job's key where one app serves several jobs."""
    return f"run {context.run_id}" + (f" job {job_key}" if job_key else "")


def _site_name(context: Context) -> str:
    """The ledger's file name: the site's data file (hashed), else its partition, else its node id."""
    data = context.node_config.get(DATA_PATH_KEY)
    if data:
        return f"data-{hashlib.sha256(str(data).encode()).hexdigest()[:12]}"
    if PARTITION_ID_KEY in context.node_config:
        return f"partition-{context.node_config[PARTITION_ID_KEY]}"
    return f"node-{context.node_id}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (POSIX ``flock``) on ``path`` for the block."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class SiteLedger:
    """A node's record of its runs and releases (see the module docstring); ``file``: where it is kept
    (None: the context state)."""

    def __init__(self, context: Context):
        self.context = context
        node_dir = context.node_config.get(STATE_DIR_KEY)
        self.file = Path(str(node_dir)) / LEDGER_DIR / f"{_site_name(context)}.json" if node_dir else None

    # ------------------------------------------------------------------ storage
    def read(self) -> dict[str, Any]:
        """The ledger as it is now (``{"runs": {scope: {...}}, "releases": [{"run", "sum", "noise"}]}``)."""
        if self.file is None:
            held = self.context.state.config_records.get(_STATE_KEY)
            text = None if held is None else held.get("ledger")
        else:
            text = self.file.read_text(encoding="utf-8") if self.file.exists() else None
        if not isinstance(text, str):
            return {"runs": {}, "releases": []}
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if not (isinstance(doc, dict) and isinstance(doc.get("runs"), dict) and isinstance(doc.get("releases"), list)):
            raise PolicyRefusal("refused: this site's privacy ledger is damaged (its operator must restore it)")
        return doc

    @contextlib.contextmanager
    def update(self) -> Iterator[dict[str, Any]]:
        """The ledger to change in the block; written back (atomically, under the lock) when the block ends
        without an error."""
        if self.file is None:
            doc = self.read()
            yield doc
            self.context.state[_STATE_KEY] = ConfigRecord({"ledger": json.dumps(doc)})
            return
        with _locked(self.file.with_name(self.file.name + ".lock")):
            doc = self.read()
            yield doc
            write_bytes_atomic(self.file, json.dumps(doc, indent=1).encode("utf-8"))

    # ------------------------------------------------------------------ runs
    def refusal(self, scope: str) -> str | None:
        """The line the site refused run ``scope`` with (None: not refused)."""
        line = self.read()["runs"].get(scope, {}).get("refused")
        return line if isinstance(line, str) else None

    def refuse_run(self, scope: str, line: str) -> PolicyRefusal:
        """Refuse run ``scope`` from now on with ``line`` (the first refusal's line stays); the error to raise."""
        with self.update() as doc:
            run = doc["runs"].setdefault(scope, {})
            run.setdefault("refused", line)
            line = run["refused"]
        log.warning("%s: this site takes no further part (%s)", scope, line)
        return PolicyRefusal(line)

    def accept_standardization(self, scope: str, digest: str, fits: Callable[[], bool], misfit: str) -> None:
        """Accept the standardisation ``digest`` for run ``scope``: the run's first, if ``fits()`` (else the
        run is refused with ``misfit``), or the one accepted before; any other is refused."""
        if self.read()["runs"].get(scope, {}).get("standardization") == digest:
            return
        refused = None
        with self.update() as doc:
            run = doc["runs"].setdefault(scope, {})
            if "standardization" in run:
                raise PolicyRefusal(
                    "refused: this site accepts one standardisation per run, and this message carries another"
                )
            if fits():
                run["standardization"] = digest
            else:
                refused = run.setdefault("refused", misfit)
        if refused is not None:
            log.warning("%s: this site takes no further part (%s)", scope, refused)
            raise PolicyRefusal(refused)

    def answer_once(self, scope: str, question: str) -> None:
        """Record that run ``scope`` asked ``question``; refuse it the second time."""
        with self.update() as doc:
            run = doc["runs"].setdefault(scope, {})
            if question in run.get("answered", []):
                raise PolicyRefusal(f"refused: this site answers the {question} question once per run")
            run.setdefault("answered", []).append(question)

    def with_used_sum_ids(self, use: Callable[[UsedSumIds], T]) -> T:
        """``use(record)`` of the sum ids this site took part in, over all its runs
        ([`UsedSumIds`][fedhead.federation.roster.UsedSumIds]); the record is written back when ``use`` returns."""
        with self.update() as doc:
            used = UsedSumIds.from_bytes(base64.b64decode(doc.get(_USED_SUM_IDS, "")))
            out = use(used)
            doc[_USED_SUM_IDS] = base64.b64encode(used.to_bytes()).decode("ascii")
        return out

    # ------------------------------------------------------------------ releases
    def begin_sum(self, scope: str, name: str, policy: SitePolicy, *, noise: float, sites: int) -> None:
        """Record that run ``scope`` begins the secure sum ``name`` (noise multiplier ``noise``, over ``sites``).

        Refused: a sum begun before in the run (one release per sum), and, under the policy's
        ``epsilon-budget``, a release whose epsilon would take the ledger over it (charged here, before
        anything of it is sent).
        """
        if policy.epsilon_budget is not None:
            self._need_file(policy)
        with self.update() as doc:
            run = doc["runs"].setdefault(scope, {})
            if name in run.get("sums", []):
                raise PolicyRefusal(f"refused: secure sum {name} was already begun in this run (one release per sum)")
            if policy.epsilon_budget is not None:
                _charge(doc, policy, sites, {"run": scope, "sum": name, "noise": float(noise)}, "release")
            run.setdefault("sums", []).append(name)

    def charge_training(self, scope: str, round_: int, policy: SitePolicy, training: TrainingRelease) -> None:
        """Charge round ``round_``'s DP-SGD (``training``) of run ``scope`` under the policy's ``epsilon-budget``,
        before training: refused when it would take the ledger over the budget, or when the round was charged
        before (one training per round). Nothing to do without a budget."""
        if policy.epsilon_budget is None:
            return
        self._need_file(policy)
        record = {
            "run": scope,
            "sum": f"training round {int(round_)}",
            "noise": training.noise_multiplier,
            "sample_rate": training.sample_rate,
            "steps": training.steps,
        }
        with self.update() as doc:
            if any(r.get("run") == scope and r.get("sum") == record["sum"] for r in doc["releases"]):
                raise PolicyRefusal(f"refused: {record['sum']} was already trained in this run (one per round)")
            _charge(doc, policy, 1, record, "training round")

    def _need_file(self, policy: SitePolicy) -> None:
        if self.file is None:
            raise PolicyRefusal(
                f"refused by this site's privacy policy ({policy.named('epsilon-budget')}): the ledger needs the "
                f"node config {STATE_DIR_KEY} (it must outlive the run)"
            )

    def spent(self, sites: int, delta: float) -> float:
        """The epsilon of every release charged so far ([`ledger_epsilon`][fedhead.clients.policy.ledger_epsilon])."""
        return ledger_epsilon(self.read()["releases"], sites, delta)


def _charge(doc: dict[str, Any], policy: SitePolicy, sites: int, record: dict[str, Any], what: str) -> None:
    """Append ``record`` to the ledger ``doc``'s releases, or refuse it when the ledger would go over the
    policy's ``epsilon-budget`` ([`ledger_epsilon`][fedhead.clients.policy.ledger_epsilon])."""
    budget = policy.epsilon_budget
    assert budget is not None
    if ledger_epsilon([*doc["releases"], record], sites, policy.dp_delta) > budget:
        raise PolicyRefusal(
            f"refused by this site's privacy policy ({policy.named('epsilon-budget')}): this {what} would take "
            "the site over its budget"
        )
    doc["releases"].append(record)
