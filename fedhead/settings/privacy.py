"""What a site keeps to itself (``privacy:`` in conf/config.yaml; docs/own-data.md, "What a site
refuses and what the server learns").

[`PrivacyPolicy`][fedhead.settings.privacy.PrivacyPolicy] is the run's, i.e. in a deployment the
server's: a site with fewer training rows than ``min_rows`` refuses every message before it
computes or sends anything of its rows, and the server learns only that it refused (the failure
policy, ``failure.min_clients``, decides whether the run continues without it).

A site enforces its own policy on top of it, whatever the run config says
([`SitePolicy`][fedhead.clients.policy.SitePolicy]; docs/own-data.md, "A site's privacy policy"): in
its SuperNode's node config and/or a TOML (or JSON) file the node config names
(``--node-config "privacy-policy='/site/policy.toml'"``)::

    mode = "secure"        # nothing in the clear (node config: privacy-mode)
    min-rows = 50          # the site's minimum of training rows; the run's min_rows no longer applies
    min-survivors = 4      # no sum is unmasked over fewer sites
    dp-noise = 1.0         # a run with privacy.dp_noise below it is refused
    epsilon-budget = 8.0   # over all runs, in a ledger under the node's state-dir
    dp-delta = 1e-6        # the delta the ledger accounts at (default 1e-5)
    dp-unit = "row"        # the budget protects one row (default "site": a site's whole contribution)

A site with no rule at all keeps the run's settings (the default; a simulation's results do not move).

``mode=secure`` sends every array the server aggregates (the one-time moment exchange, each
round's heads, each evaluation's errors) only as a site's share of a secure sum
([`fedhead.federation.secure_sum`][fedhead.federation.secure_sum]): the server learns the sum
over the sites, never one site's values. On top of it, ``dp_noise > 0`` makes each release
client-level differentially private: each site caps its weight at ``dp_max_rows``, clips its
per-row statistics to the L2 norm ``dp_clip`` and adds Gaussian noise before masking, so the
server sees only a noised sum
([`fedhead.federation.privacy_noise`][fedhead.federation.privacy_noise] has the formulas and
the accounting).

No flwr, no torch: the config layer and the clients both import this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedhead.analysis.constraints import ConfigError, Field, Together, check, integer, number, one_of, optional
from fedhead.settings.trust import TrustPolicy

if TYPE_CHECKING:
    from fedhead.settings.procedure import ProcedureConfig

__all__ = ["DEFAULT_MIN_ROWS", "DP_UNITS", "MIN_SECURE_SITES", "MODES", "NODE_MIN_ROWS_KEY", "PrivacyPolicy"]

#: The default of ``privacy.min_rows`` (see [`PrivacyPolicy`][fedhead.settings.privacy.PrivacyPolicy]).
DEFAULT_MIN_ROWS = 10
#: The values of ``privacy.mode``: ``clear`` sends each site's values, ``secure`` only their sums.
MODES = ("clear", "secure")
#: The values of ``privacy.dp_unit``: what one differentially private release protects (a site, or one row of one site).
DP_UNITS = ("site", "row")
#: The fewest sites of ``privacy.mode=secure`` (the secure sum's own minimum).
MIN_SECURE_SITES = 3

_MIN_ROWS_NEED = "must be an integer >= 1 (1: no minimum beyond C + 1 rows)"
_PRIVACY_RULES = (
    Field("min_rows", integer(1), _MIN_ROWS_NEED),
    Field("mode", one_of(MODES), "must be 'clear' or 'secure'"),
    Field("threshold", optional(integer(2)), "must be an integer >= 2 or null (a majority of the sites)"),
    Field("dp_noise", number(0), "must be a finite number >= 0 (0: no noise)"),
    Field("dp_clip", number(0, low_open=True), "must be a finite number > 0"),
    Field("dp_head_clip", optional(number(0, low_open=True)), "must be a finite number > 0 or null (dp_clip)"),
    Field("dp_max_rows", optional(integer(1)), "must be an integer >= 1 or null"),
    Field("dp_delta", number(0, 1, low_open=True, high_open=True), "must be a number in (0, 1)"),
    Field("dp_unit", one_of(DP_UNITS), "must be 'site' or 'row'"),
    Together(
        lambda p: p.dp_unit == "site" or p.dp_noise > 0,
        "privacy.dp_unit=row needs privacy.dp_noise > 0 (the noise multiplier of the row-level exchange), got "
        "privacy.dp_noise={dp_noise}",
    ),
    Together(
        lambda p: p.threshold is None or p.mode == "secure",
        "privacy.threshold={threshold} needs privacy.mode=secure (it is the secure sum's threshold), got "
        "privacy.mode={mode}",
    ),
    Together(
        lambda p: p.dp_noise == 0 or p.mode == "secure",
        "privacy.dp_noise={dp_noise} needs privacy.mode=secure, so that the server never sees an un-noised "
        "sum, got privacy.mode={mode}",
    ),
    Together(
        lambda p: p.dp_noise == 0 or p.dp_max_rows is not None,
        "privacy.dp_noise={dp_noise} needs privacy.dp_max_rows (the public cap K on a site's weight: one "
        "site changes a sum by at most K * privacy.dp_clip)",
    ),
)
#: The SuperNode's own ``--node-config`` key of its minimum
NODE_MIN_ROWS_KEY = "min-rows"
#: The SuperNode's own ``--node-config`` key that makes it refuse to send anything in the clear (``secure``)
NODE_PRIVACY_MODE_KEY = "privacy-mode"


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
    mode : {"clear", "secure"}
        ``clear`` (default): each site sends its own values. ``secure``: every array the server
        aggregates leaves a site only as its share of a secure sum, so the server learns the sum
        over the sites; needs at least 3 sites
        ([`check_sites`][fedhead.settings.privacy.PrivacyPolicy.check_sites]).
    threshold : int or None
        The secure sum's Shamir threshold ``t``: a sum is decoded only from ``t`` surviving sites,
        and ``t`` colluding sites could unmask one site's input. It must be a majority of the
        sites, ``max(2, floor(M/2) + 1) <= t <= M``. None (default): ``floor(M/2) + 1``. Only with
        ``mode=secure``.
    dp_noise : float
        The noise multiplier ``z`` of client-level differential privacy (0, the default: no
        noise). Each released sum carries Gaussian noise of standard deviation
        ``z * dp_max_rows * dp_clip``, drawn in parts by the sites. Needs ``mode=secure`` (a
        site's noise alone is not enough to hide it, only the sum's) and ``dp_max_rows``.
    dp_clip : float
        ``Delta``: the L2 norm to which each site clips its per-row statistic vector before
        weighting it (default 1.0), in the units the site sums: standardised targets in the moment
        exchange of a built-in data set, a site-local table's raw statistics in its exchange, the
        errors in an evaluation; the heads too unless ``dp_head_clip`` is set.
    dp_head_clip : float or None
        ``Delta`` of the rounds' heads ``[vec W_m, b_m, 1]`` (None: ``dp_clip``). Each release is a
        Gaussian mechanism of noise multiplier ``z`` on its own sensitivity ``K Delta``, so a tighter
        bound on the heads lowers their noise at the same ``epsilon``.
    dp_max_rows : int or None
        ``K``: a public cap on a site's weight in every sum, ``w_m = min(N_m, K)``; one site then
        changes a sum by at most ``K * Delta`` (its L2 sensitivity). Required when
        ``dp_noise > 0``.
    dp_delta : float
        The ``delta`` at which the spent ``epsilon`` is reported (default 1e-5).
    dp_unit : {"site", "row"}
        What the one-time moment exchange protects. ``site`` (default): a site's whole contribution
        (client-level, as above). ``row``: one row of one site
        ([`fedhead.federation.row_privacy`][fedhead.federation.row_privacy]): each site clips every
        target row to the L2 norm ``dp_clip`` (``C``, in the targets' public standardised units), releases
        its count, sums and second moments with its share of discrete Gaussian noise of multiplier
        ``dp_noise`` calibrated to one row, and the server reads the pooled statistics. The rounds keep
        their client-level noise (``dp_noise``, ``dp_head_clip``, ``dp_max_rows``), except heads trained with
        DP-SGD (``train.dp_noise > 0``), which are summed without noise, each weighted by ``dp_max_rows``.
        Needs ``dp_noise > 0``; a site-local table is refused unless it keeps its files' units
        ([`check_units`][fedhead.settings.privacy.PrivacyPolicy.check_units]).
    """

    min_rows: int = DEFAULT_MIN_ROWS
    mode: str = "clear"
    threshold: int | None = None
    dp_noise: float = 0.0
    dp_clip: float = 1.0
    dp_head_clip: float | None = None
    dp_max_rows: int | None = None
    dp_delta: float = 1e-5
    dp_unit: str = "site"

    def __post_init__(self) -> None:
        check(self, _PRIVACY_RULES, prefix="privacy.", error=ConfigError)
        for name in ("dp_noise", "dp_clip", "dp_delta"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.dp_head_clip is not None:
            object.__setattr__(self, "dp_head_clip", float(self.dp_head_clip))

    def clip_of(self, heads: bool) -> float:
        """``Delta`` of a release: ``dp_head_clip`` (else ``dp_clip``) for a round's heads, ``dp_clip`` otherwise."""
        return self.dp_clip if not heads or self.dp_head_clip is None else self.dp_head_clip

    @property
    def row_level(self) -> bool:
        """Whether the exchange is differentially private for one row (``dp_unit=row``)."""
        return self.dp_unit == "row"

    @property
    def secure(self) -> bool:
        """Whether the server receives only secure sums (``mode=secure``)."""
        return self.mode == "secure"

    def check_sites(self, num_clients: int) -> None:
        """Refuse ``mode=secure`` with fewer than 3 sites, and a threshold that is not a majority.

        The range is [`fedhead.federation.secure_sum.check_threshold`][fedhead.federation.secure_sum.check_threshold]'s
        (the settings layer may not import the federation layer; a test keeps the two equal).
        """
        if not self.secure:
            return
        if num_clients < MIN_SECURE_SITES:
            raise ConfigError(
                f"privacy.mode=secure needs at least {MIN_SECURE_SITES} sites: with two, each learns the other's "
                f"statistics from the sum and its own (num_clients={num_clients})"
            )
        if self.threshold is not None:
            low = max(2, num_clients // 2 + 1)
            if not low <= self.threshold <= num_clients:
                raise ConfigError(
                    f"privacy.threshold must be an integer in [{low}, {num_clients}] for num_clients={num_clients} "
                    f"(a majority of the sites, so that no two groups of sites can reveal both shares of one "
                    f"site), got {self.threshold!r}"
                )

    def check_strategy(self, num_clients: int, trust: TrustPolicy, *, site_units: tuple[str, str] | None) -> None:
        """A strategy's checks: [`check_sites`][fedhead.settings.privacy.PrivacyPolicy.check_sites],
        [`check_trust`][fedhead.settings.privacy.PrivacyPolicy.check_trust] and
        [`check_units`][fedhead.settings.privacy.PrivacyPolicy.check_units] (``site_units``: a site-local table's
        standardisation modes, of its targets and inputs)."""
        self.check_sites(num_clients)
        self.check_trust(trust)
        self.check_units(site_units)

    def check_units(self, site_units: tuple[str, str] | None) -> None:
        """Refuse ``dp_unit=row`` for a site-local table whose standardisation (``site_units``: the modes of its
        targets and inputs) is derived from the sites' statistics: the row clip needs the targets in public units
        before any row is seen. A table kept in the units its files hold (``none``, ``none``) is accepted: those
        units are declared with the run, and its row-level exchange releases the raw targets' statistics."""
        if self.row_level and site_units is not None and tuple(site_units) != ("none", "none"):
            raise ConfigError(
                "privacy.dp_unit=row needs the targets in public units before any row is seen; a site-local "
                "table's standardisation is derived from the sites' statistics (use privacy.dp_unit=site, or "
                "keep the files' units: dataset.standardize_targets=none dataset.standardize_inputs=none, with "
                "privacy.dp_clip in those units)"
            )

    def check_dp_sgd(self, dp_sgd_noise: float, evaluate_mse: bool, procedures: Iterable[ProcedureConfig]) -> None:
        """Refuse, before anything runs, what DP-SGD (``train.dp_noise > 0``) cannot keep private: centred targets,
        a correction whose ``Sigma_m`` is not the site's own row-level release, and evaluations in a row-level run
        (each evaluation's errors are a client-level release, whose noise at a row-level noise multiplier
        overwhelms the sum after the first round's training, and whose epsilon adds to the run's)."""
        if dp_sgd_noise <= 0:
            return
        procedures = list(procedures)
        corrected = [p.name for p in procedures if not p.exact and (p.centered or (p.gamma > 0 and not self.row_level))]
        if corrected:
            raise ConfigError(
                f"train.dp_noise > 0 (DP-SGD): procedure(s) {corrected} would read each site's own mean or covariance "
                "outside the private steps; the correction under DP-SGD needs privacy.mode=secure privacy.dp_unit=row "
                "(each site then reads its Sigma_m from its own noised exchange release); centring is not supported"
            )
        if self.row_level and evaluate_mse and any(not p.exact for p in procedures):
            raise ConfigError(
                "privacy.dp_unit=row with train.dp_noise > 0: each evaluation's errors would be a client-level "
                "release, whose noise overwhelms it at this noise multiplier; set resources.evaluate_mse=false (the "
                "test rows' errors are then not released)"
            )

    def check_trust(self, trust: TrustPolicy) -> None:
        """Refuse, in secure mode, the trust keys that need a site's own values (the server sees only sums):
        ``trust.expected_counts``, ``trust.max_count`` and ``trust.clip_update``."""
        if not self.secure:
            return
        per_site = [k for k in ("expected_counts", "max_count", "clip_update") if getattr(trust, k) is not None]
        if per_site:
            keys = ", ".join(f"trust.{k}" for k in per_site)
            raise ConfigError(
                f"privacy.mode=secure: {keys} need each site's count or head, which the server no longer sees; "
                "set them to null (the server checks only the sums: docs/privacy.md)"
            )

    def threshold_for(self, num_clients: int) -> int:
        """The secure sum's threshold for ``num_clients`` sites: ``threshold``, else ``floor(M/2) + 1``."""
        return num_clients // 2 + 1 if self.threshold is None else self.threshold
