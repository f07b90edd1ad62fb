"""What a site remembers of its runs and of what it released: [`SiteLedger`][fedhead.clients.ledger.SiteLedger].

Per run (its scope: flwr's run id and, in a simulation serving several jobs, the job's key;
[`run_scope`][fedhead.clients.ledger.run_scope]) a site keeps the one standardisation it accepted, the
questions it answered once and, once it refused the run, the line it refused it with. Over every run it
keeps its noised releases, the epsilon ledger of its policy's ``epsilon-budget``
([`fedhead.clients.policy`][fedhead.clients.policy]), and the ids of the secure sums it took part in, its
one record of them: a sum id is never begun twice, in a run or over runs
([`begin_sum`][fedhead.clients.ledger.SiteLedger.begin_sum] refuses one,
[`with_used_sum_ids`][fedhead.clients.ledger.SiteLedger.with_used_sum_ids] records it).

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
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from flwr.app import ConfigRecord, Context

from fedhead.analysis.constraints import ConfigError
from fedhead.clients.policy import PolicyRefusal, SitePolicy, release_epsilon, row_unit_noise
from fedhead.clients.state import DATA_PATH_KEY, PARTITION_ID_KEY, STATE_DIR_KEY
from fedhead.federation.roster import UsedSumIds
from fedhead.federation.run_privacy import TrainingRelease, release_event, run_accountant, training_event
from fedhead.results.io import write_bytes_atomic

log = logging.getLogger(__name__)

#: The ledgers' folder under a node's ``state-dir``.
LEDGER_DIR = "privacy-ledger"
_STATE_KEY = "fedhead-site-ledger"  # the node's context state: ConfigRecord {"ledger": JSON text}
_USED_SUM_IDS = "used-sum-ids"  # the ledger's record of the secure sums' ids (base64 of their digests)
T = TypeVar("T")


def _used_sum_ids(doc: dict[str, Any]) -> UsedSumIds:
    """The ledger's one record of the sum ids this site took part in."""
    return UsedSumIds.from_bytes(base64.b64decode(doc.get(_USED_SUM_IDS, "")))


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

    def release_once(self, scope: str, phase: str) -> None:
        """Record that run ``scope`` asked this site to release ``phase`` (the exchange, a round's training or
        evaluation) into a secure sum; refuse it the second time, whatever the sum is named."""
        with self.update() as doc:
            run = doc["runs"].setdefault(scope, {})
            if phase in run.get("released", []):
                raise PolicyRefusal(f"refused: this site releases {phase} once per run, into one secure sum")
            run.setdefault("released", []).append(phase)

    def with_used_sum_ids(self, use: Callable[[UsedSumIds], T]) -> T:
        """``use(record)`` of the sum ids this site took part in, over all its runs
        ([`UsedSumIds`][fedhead.federation.roster.UsedSumIds]); the record is written back when ``use`` returns."""
        with self.update() as doc:
            used = _used_sum_ids(doc)
            out = use(used)
            doc[_USED_SUM_IDS] = base64.b64encode(used.to_bytes()).decode("ascii")
        return out

    # ------------------------------------------------------------------ releases
    def begin_sum(
        self,
        scope: str,
        name: str,
        policy: SitePolicy,
        *,
        noise: float,
        sites: int,
        unit: str = "site",
        set_up: bool = False,
        charged: bool = True,
    ) -> None:
        """Check that run ``scope`` may begin the secure sum ``name`` (noise multiplier ``noise`` of a ``unit``-level
        release, ``site`` or ``row``, over ``sites``).

        Refused: a sum id this site took part in before, in this run or another (one release per sum: a
        replayed phase message or a repeated id; the id is recorded when the sum begins,
        [`with_used_sum_ids`][fedhead.clients.ledger.SiteLedger.with_used_sum_ids], or, ``set_up``, when this
        site set it up within the previous sum's messages, unmasked until now), and, under the policy's
        ``epsilon-budget``, a release whose epsilon would take the ledger over it (charged here, before
        anything of it is sent, in the policy's ``dp-unit``) or that has no epsilon in that unit. ``charged=False``:
        a release whose epsilon is already charged (a head trained with DP-SGD, charged with its round's training by
        [`charge_training`][fedhead.clients.ledger.SiteLedger.charge_training]); only its sum id is recorded.
        """
        if policy.epsilon_budget is not None and self.file is None:
            raise PolicyRefusal(
                f"refused by this site's privacy policy ({policy.named('epsilon-budget')}): the ledger needs the "
                f"node config {STATE_DIR_KEY} (it must outlive the run)"
            )
        if policy.epsilon_budget is not None and unit == "row" and policy.dp_unit != "row":
            raise PolicyRefusal(
                f"refused by this site's privacy policy ({policy.named('epsilon-budget')}): a row-level release has "
                "no site-level epsilon (a policy with dp-unit = row budgets per row)"
            )
        with self.update() as doc:
            try:
                begun = name in _used_sum_ids(doc) and not set_up
            except ConfigError as exc:  # not a sum id
                raise PolicyRefusal(f"refused: {exc}") from None
            if begun:
                raise PolicyRefusal(
                    f"refused: secure sum {name} was begun before (one release per sum id, over all runs)"
                )
            if policy.epsilon_budget is not None and charged:
                entry: dict[str, Any] = {"run": scope, "sum": name, "noise": float(noise)}
                if unit != "site":  # a client-level release keeps the ledger's first format
                    entry["unit"] = unit
                spent = self._epsilon([*doc["releases"], entry], policy.dp_unit, sites, policy.dp_delta)
                if spent > policy.epsilon_budget:
                    raise PolicyRefusal(
                        f"refused by this site's privacy policy ({policy.named('epsilon-budget')}): this release "
                        "would take the site over its budget"
                    )
                doc["releases"].append(entry)

    def charge_training(self, scope: str, round_: int, policy: SitePolicy, training: TrainingRelease) -> None:
        """Charge round ``round_``'s DP-SGD (``training``) of run ``scope`` under the policy's ``epsilon-budget``,
        before training. Refused: a round that would take the ledger over the budget, a round charged before
        (one training per round), and a site-unit budget (DP-SGD protects rows: it has no site-level epsilon).
        Nothing to do without a budget."""
        if policy.epsilon_budget is None:
            return
        if self.file is None or policy.dp_unit != "row":
            need = f"the ledger needs the node config {STATE_DIR_KEY} (it must outlive the run)"
            rows = "a training round has no site-level epsilon (a policy with dp-unit = row budgets per row)"
            raise PolicyRefusal(
                f"refused by this site's privacy policy ({policy.named('epsilon-budget')}): "
                + (need if self.file is None else rows)
            )
        name = f"training round {int(round_)}"
        record = {"run": scope, "sum": name, "unit": "row", "noise": training.noise_multiplier}
        record.update(sample_rate=training.sample_rate, steps=training.steps)
        with self.update() as doc:
            if any(r.get("run") == scope and r.get("sum") == name for r in doc["releases"]):
                raise PolicyRefusal(f"refused: {name} was already trained in this run (one per round)")
            if self._epsilon([*doc["releases"], record], "row", 1, policy.dp_delta) > policy.epsilon_budget:
                raise PolicyRefusal(
                    f"refused by this site's privacy policy ({policy.named('epsilon-budget')}): this training round "
                    "would take the site over its budget"
                )
            doc["releases"].append(record)

    @staticmethod
    def _epsilon(releases: list[dict[str, Any]], unit: str, sites: int, delta: float) -> float:
        """The epsilon of ``releases`` in ``unit`` ([`release_epsilon`][fedhead.clients.policy.release_epsilon]; a
        ``row`` unit charges each at [`row_unit_noise`][fedhead.clients.policy.row_unit_noise], a ``site`` unit gives
        a row-level release no finite epsilon). With a training round (``steps``: only in a ``row`` unit) every
        record is composed by one accountant ([`run_accountant`][fedhead.federation.run_privacy.run_accountant])."""
        trained = [r for r in releases if "steps" in r]
        if trained:
            if unit != "row":
                return math.inf
            noise = [
                row_unit_noise(float(r["noise"]), str(r.get("unit", "site"))) for r in releases if "steps" not in r
            ]
            rounds = [TrainingRelease(float(r["noise"]), float(r["sample_rate"]), int(r["steps"])) for r in trained]
            events = [*map(release_event, noise), *map(training_event, rounds)]
            return float(run_accountant(events).get_epsilon(delta))
        if unit == "row":
            noise = [row_unit_noise(float(r["noise"]), str(r.get("unit", "site"))) for r in releases]
        else:
            noise = [float(r["noise"]) if r.get("unit", "site") == "site" else 0.0 for r in releases]
        return release_epsilon(noise, sites, delta)

    def spent(self, sites: int, delta: float, unit: str = "site") -> float:
        """The epsilon of every release charged so far, in ``unit`` (``site`` or ``row``)."""
        return self._epsilon(self.read()["releases"], unit, sites, delta)
