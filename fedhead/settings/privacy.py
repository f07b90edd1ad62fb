"""What a site keeps to itself (``privacy:`` in conf/config.yaml; docs/own-data.md, "What a site
refuses and what the server learns").

[`PrivacyPolicy`][fedhead.settings.privacy.PrivacyPolicy] is decided on each site, by its own
ClientApp: a site with fewer training rows than ``min_rows`` refuses every message before it
computes or sends anything of its rows, and the server learns only that it refused (the failure
policy, ``failure.min_clients``, decides whether the run continues without it). A site's
operator may raise its minimum with the SuperNode's ``--node-config "min-rows=K"``
([`PrivacyPolicy.at_site`][fedhead.settings.privacy.PrivacyPolicy.at_site]).

No flwr, no torch: the config layer and the clients both import this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedhead.analysis.constraints import Field, check, integer
from fedhead.analysis.procedure import ConfigError

__all__ = ["DEFAULT_MIN_ROWS", "NODE_MIN_ROWS_KEY", "PrivacyPolicy"]

#: The default of ``privacy.min_rows`` (see [`PrivacyPolicy`][fedhead.settings.privacy.PrivacyPolicy]).
DEFAULT_MIN_ROWS = 10

_MIN_ROWS_NEED = "must be an integer >= 1 (1: no minimum beyond C + 1 rows)"
_PRIVACY_RULES = (Field("min_rows", integer(1), _MIN_ROWS_NEED),)
#: The SuperNode's own ``--node-config`` key of its minimum
NODE_MIN_ROWS_KEY = "min-rows"


@dataclass(frozen=True)
class PrivacyPolicy:
    """A site's own limits on what it shares.

    Attributes
    ----------
    min_rows : int
        A site with fewer training rows refuses to take part: it computes and sends no statistic
        (no moments, no site statistics, no head) and answers every message with the error
        "fewer training rows than the site's minimum (privacy.min_rows=K)", never its count.
        The default, 10, is NVFlare's default ``min_count`` of federated statistics. Few rows
        are exposed by what a site sends, ``(N_m, mu_m, Sigma_m)``: one row is its mean, two are
        ``mu_m`` plus and minus the covariance's one principal axis, and ``C + 1`` rows (the
        least a site may have: its covariance must be full rank) all lie on one known ellipsoid
        ``(y - mu_m)^T Sigma_m^{-1} (y - mu_m) = C``. Every honest site of this repository
        (the built-in data sets' clients, the tutorial's 100-row sites, the tests' federations,
        the Palmer penguins benchmark's 52 rows and up) has at least 20.
    """

    min_rows: int = DEFAULT_MIN_ROWS

    def __post_init__(self) -> None:
        check(self, _PRIVACY_RULES, prefix="privacy.", error=ConfigError)

    def at_site(self, node_min_rows: object = None) -> tuple[int, str]:
        """The minimum a site applies, and the setting that sets it (as users type it).

        In a deployment the run config (``privacy.min_rows``) is the server's; a site's operator
        may raise the minimum, never lower it, with its SuperNode's own
        ``--node-config "min-rows=K"`` (``node_min_rows``; None: not set).
        """
        if node_min_rows is None:
            return self.min_rows, "privacy.min_rows"
        if not (isinstance(node_min_rows, int) and integer(1)(node_min_rows)):
            raise ConfigError(f"node config {NODE_MIN_ROWS_KEY} {_MIN_ROWS_NEED}, got {node_min_rows!r}")
        if node_min_rows > self.min_rows:
            return node_min_rows, f"node config {NODE_MIN_ROWS_KEY}"
        return self.min_rows, "privacy.min_rows"
