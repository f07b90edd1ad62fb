"""A site's own privacy policy, which it enforces whatever the run config says (docs/own-data.md,
"A site's privacy policy").

The run config is the server's: ``privacy.mode``, ``privacy.min_rows``, ``privacy.dp_noise`` and the
failure policy's minimum all come with it. A site's operator states what the site will do in its
SuperNode's node config and/or a policy file the node config names
(``--node-config "privacy-policy='/site/policy.toml'"``, TOML, or JSON when its name ends in
``.json``): [`SitePolicy`][fedhead.clients.policy.SitePolicy]. A site with no rule at all keeps the
run's settings (the permissive default: a simulation's sites, whose results do not move).

Every refusal is one line naming the rule, never a row value or a count
([`PolicyRefusal`][fedhead.clients.policy.PolicyRefusal]).
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import Context

from fedhead.clients.messages import ClientError
from fedhead.federation.privacy_noise import privacy_spent
from fedhead.federation.run_privacy import client_release_in_rows
from fedhead.settings.privacy import DEFAULT_MIN_ROWS, NODE_MIN_ROWS_KEY, NODE_PRIVACY_MODE_KEY, PrivacyPolicy

__all__ = [
    "POLICY_FILE_KEY",
    "RULES",
    "PolicyRefusal",
    "SitePolicy",
    "release_epsilon",
    "row_unit_noise",
    "site_policy",
]

#: The node config key naming the site's policy file.
POLICY_FILE_KEY = "privacy-policy"
#: The rules of a policy, as a policy file spells them (the node config spells ``mode`` ``privacy-mode``).
RULES = ("mode", "min-rows", "min-survivors", "dp-noise", "epsilon-budget", "dp-delta", "dp-unit")
#: The node config key of each rule.
NODE_KEYS = {rule: NODE_PRIVACY_MODE_KEY if rule == "mode" else rule for rule in RULES}
assert NODE_KEYS["min-rows"] == NODE_MIN_ROWS_KEY
#: The ``delta`` at which a site charges its releases when its policy names none.
DEFAULT_DELTA = 1e-5


class PolicyRefusal(ClientError):
    """A message refused by the site's policy: one line naming the rule (no row value, no count)."""


def _integer(low: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _number(test):
    return lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and test(float(v))


_CHECKS = {
    "mode": (lambda v: v in ("secure", "clear"), "must be secure or clear"),
    "min-rows": (_integer(1), "must be an integer >= 1"),
    "min-survivors": (_integer(2), "must be an integer >= 2"),
    "dp-noise": (_number(lambda v: v >= 0), "must be a finite number >= 0"),
    "epsilon-budget": (_number(lambda v: v > 0), "must be a finite number > 0"),
    "dp-delta": (_number(lambda v: 0 < v < 1), "must be a number in (0, 1)"),
    "dp-unit": (lambda v: v in ("site", "row"), "must be site or row"),
}


@dataclass(frozen=True)
class SitePolicy:
    """What a site enforces of every run, whatever its run config says.

    Attributes
    ----------
    mode : {"secure", "clear"} or None
        ``secure``: nothing leaves the site in the clear; a message that would send a statistic, a head or an
        objective other than as a share of a secure sum is refused. Implied by ``dp-noise > 0`` and by an
        ``epsilon-budget`` (a clear value has an infinite epsilon).
    min_rows : int or None
        The fewest training rows the site takes part with. A site with any rule takes its minimum from its
        policy alone (``DEFAULT_MIN_ROWS`` when it names none), never from the run: a run's ``privacy.min_rows``
        that could raise it would answer, run after run, whether the site has that many rows. None, with no
        rule at all: the run's ``privacy.min_rows``.
    min_survivors : int or None
        The fewest sites a secure sum may be revealed over: a ``reveal`` naming fewer survivors is refused.
        A noised sum is never revealed over fewer sites than its noise was drawn for (``m_min``) either.
    dp_noise : float
        The weakest noise multiplier ``z`` the site accepts (0: none asked). A run with
        ``privacy.dp_noise`` below it is refused: a smaller ``z`` is a larger epsilon per release. Only ``z``
        sets a release's epsilon: the noise's standard deviation is ``z K Delta``, proportional to the
        sensitivity ``K Delta`` (``privacy.dp_max_rows``, ``privacy.dp_clip``), so no ``K`` or ``Delta`` weakens
        a release and the policy has no floor for them.
    epsilon_budget : float or None
        The epsilon the site releases over all its runs: each noised release is charged, in a ledger in the
        node's ``state-dir`` ([`fedhead.clients.ledger`][fedhead.clients.ledger]), before anything of it is
        sent; one that would go over the budget is refused.
    dp_delta : float
        The ``delta`` at which the site's ledger accounts epsilon (not the run's ``privacy.dp_delta``).
    dp_unit : {"site", "row"}
        What the ``epsilon-budget`` protects (default ``site``): the site's whole contribution, or one row of
        it. A row-level release (``privacy.dp_unit=row``) has no site-level epsilon and is refused under a
        ``site`` budget; under a ``row`` budget a client-level release of noise multiplier ``z`` is charged as
        one of ``z / 2`` ([`row_unit_noise`][fedhead.clients.policy.row_unit_noise]).
    sources : dict
        Where each rule was set (``node config`` or the policy file's path), for the refusals.
    """

    mode: str | None = None
    min_rows: int | None = None
    min_survivors: int | None = None
    dp_noise: float = 0.0
    epsilon_budget: float | None = None
    dp_delta: float = DEFAULT_DELTA
    dp_unit: str = "site"
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def enforced(self) -> bool:
        """Whether the site states any rule (else the run's settings apply: the permissive default)."""
        return bool(self.sources)

    @property
    def secure_only(self) -> bool:
        """Whether nothing may leave the site in the clear."""
        return self.mode == "secure" or self.dp_noise > 0 or self.epsilon_budget is not None

    def setting(self, rule: str) -> str:
        """The rule as its operator typed it: ``node config <key>`` or ``<policy file> <rule>``."""
        where = self.sources.get(rule, "site policy")
        return f"{where} {NODE_KEYS[rule] if where == 'node config' else rule}"

    def named(self, rule: str) -> str:
        """``rule=value`` with where it was set, as a refusal names it."""
        value = {
            "mode": self.mode,
            "min-rows": self.min_rows,
            "min-survivors": self.min_survivors,
            "dp-noise": self.dp_noise,
            "epsilon-budget": self.epsilon_budget,
        }.get(rule)
        return self.setting(rule) if value is None else f"{self.setting(rule)}={value}"

    def row_minimum(self, run_min_rows: int) -> tuple[int, str]:
        """The fewest training rows the site takes part with, and the setting that says so (as users type it)."""
        if not self.enforced:
            return run_min_rows, "privacy.min_rows"
        if self.min_rows is None:
            return DEFAULT_MIN_ROWS, "site policy default min-rows"
        return self.min_rows, self.setting("min-rows")

    def check_run(self, privacy: PrivacyPolicy) -> None:
        """Refuse a run whose privacy settings are weaker than this policy (the run config alone decides)."""
        if self.dp_noise > 0 and privacy.dp_noise < self.dp_noise:
            raise PolicyRefusal(
                f"refused by this site's privacy policy ({self.named('dp-noise')}): the run's "
                f"privacy.dp_noise={privacy.dp_noise:g} is weaker"
            )
        if self.epsilon_budget is not None and privacy.dp_noise <= 0:
            raise PolicyRefusal(
                f"refused by this site's privacy policy ({self.named('epsilon-budget')}): the run's "
                "privacy.dp_noise=0 releases exact sums (an infinite epsilon)"
            )

    def check_reveal(self, survivors: int, noised_for: int) -> None:
        """Refuse to unmask a sum over fewer ``survivors`` than the policy's floor or than the ``noised_for``
        sites its noise was drawn for (0: not noised)."""
        if self.min_survivors is not None and survivors < self.min_survivors:
            raise PolicyRefusal(
                f"refused by this site's privacy policy ({self.named('min-survivors')}): the reveal names "
                "fewer surviving sites"
            )
        if survivors < noised_for:
            raise PolicyRefusal(
                "refused: the reveal names fewer surviving sites than the sum's noise was drawn for "
                f"(m_min={noised_for}: the failure policy's minimum)"
            )


def release_epsilon(noise: list[float], sites: int, delta: float) -> float:
    """The epsilon of a site's releases (one noise multiplier each), at ``delta`` per group of equal
    noise: [`privacy_spent`][fedhead.federation.privacy_noise.privacy_spent] of each group (Renyi
    composition within it), summed over the groups (basic composition, at ``delta`` times the number of
    groups)."""
    counts: dict[float, int] = {}
    for z in noise:
        counts[float(z)] = counts.get(float(z), 0) + 1
    return sum(privacy_spent(z, k, max(1, int(sites)), delta).epsilon for z, k in sorted(counts.items()))


def row_unit_noise(noise: float, unit: str) -> float:
    """The noise multiplier of a release of ``unit`` (``site`` or ``row``) in the row unit: ``z`` for a row-level
    release, ``z / 2`` for a client-level one (one row moves a site's clipped, capped term by at most twice the
    site's sensitivity ``K Delta``; [`fedhead.federation.row_privacy`][fedhead.federation.row_privacy])."""
    return float(noise) if unit == "row" else client_release_in_rows(noise)


# ------------------------------------------------------------------------------------ parsing
def parse_policy(rules: Mapping[str, object], source: str, node: Mapping[str, object] | None = None) -> SitePolicy:
    """The policy of a file's ``rules`` (read from ``source``) and the node config's ``node`` rules.

    A rule set in both places with different values, an unknown rule in the file and a value out of
    its range are refused (one line naming the rule and where it was set).
    """
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    unknown = sorted(set(rules) - set(RULES))
    if unknown:
        raise PolicyRefusal(f"site policy {source}: unknown rule(s) {unknown} (known: {list(RULES)})")
    for rule in RULES:
        pairs = ((source, rules.get(rule)), ("node config", (node or {}).get(NODE_KEYS[rule])))
        given = [(where, v) for where, v in pairs if v is not None]
        if len({repr(v) for _, v in given}) > 1:
            raise PolicyRefusal(f"site policy: {rule} is set twice, to different values ({source} and node config)")
        if not given:
            continue
        where, value = given[-1]
        test, need = _CHECKS[rule]
        if not test(value):
            key = NODE_KEYS[rule] if where == "node config" else rule
            raise PolicyRefusal(f"{where} {key} {need}, got {value!r}")
        merged[rule], sources[rule] = value, where
    budget = merged.get("epsilon-budget")
    return SitePolicy(
        mode=merged.get("mode"),
        min_rows=merged.get("min-rows"),
        min_survivors=merged.get("min-survivors"),
        dp_noise=float(merged.get("dp-noise", 0.0)),
        epsilon_budget=None if budget is None else float(budget),
        dp_delta=float(merged.get("dp-delta", DEFAULT_DELTA)),
        dp_unit=str(merged.get("dp-unit", "site")),
        sources=sources,
    )


def read_policy_file(path: str) -> dict[str, object]:
    """The rules of a policy file: a flat TOML table, or a JSON object when the name ends in ``.json``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        rules = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        raise PolicyRefusal(f"site policy {path}: cannot read it ({type(exc).__name__})") from None
    if not isinstance(rules, dict):
        raise PolicyRefusal(f"site policy {path}: must hold one table of rules")
    return rules


def site_policy(context: Context) -> SitePolicy:
    """The policy of the node ``context`` runs on: its node config's rules and its policy file's."""
    node = {k: v for k, v in context.node_config.items() if k in NODE_KEYS.values()}
    path = context.node_config.get(POLICY_FILE_KEY)
    rules = {} if not path else read_policy_file(str(path))
    return parse_policy(rules, str(path or "site policy"), node)
