"""``privacy.mode`` on the server, chosen once: [`make_aggregator`][fedhead.strategies.privacy_modes.make_aggregator]
builds the aggregator a strategy calls, and differential privacy is added by wrapping the secure one
([`DifferentialPrivacy`][fedhead.strategies.privacy_modes.DifferentialPrivacy], as flwr's
``DifferentialPrivacyServerSideFixedClipping`` wraps a strategy), not by a branch in the strategy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from flwr.app import Message
from flwr.serverapp import Grid

from fedhead.analysis.constraints import ConfigError
from fedhead.federation.privacy_noise import privacy_spent
from fedhead.federation.roster import Roster
from fedhead.federation.row_privacy import exchange_event, row_privacy_spent
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.strategies.aggregator import Aggregator, HeadSum, MseSum, Phase
from fedhead.strategies.clear import ClearAggregator
from fedhead.strategies.exchange import ExchangeSettings, MomentExchange
from fedhead.strategies.secure import DP_EPSILON, DP_RELEASES, SumSetup
from fedhead.strategies.secure_aggregator import SecureAggregator
from fedhead.strategies.secure_exchange import pooled_exchange


class DifferentialPrivacy(Aggregator):
    """A secure aggregator whose sums the sites noise (``privacy.dp_noise > 0``): every decoded sum is
    one release, accounted ([`privacy_spent`][fedhead.federation.privacy_noise.privacy_spent]) over
    ``sites`` sites at ``delta``; the exchange's noised covariances are made PSD.

    Parameters
    ----------
    inner : SecureAggregator
        The secure sums it wraps.
    noise_multiplier : float
        ``z > 0`` of the sites' Gaussian noise.
    sites : int
        The population ``M`` of the accounting.
    delta : float
        The ``delta`` at which ``epsilon`` is reported.
    row_level : bool
        ``privacy.dp_unit=row``: epsilon is one row's, the exchange a row-level release and every later sum a
        client-level one ([`row_privacy_spent`][fedhead.federation.row_privacy.row_privacy_spent]).
    private_heads : bool
        The heads are DP-SGD outputs for one row
        ([`JobConfig.private_heads`][fedhead.settings.job.JobConfig.private_heads]): the sites send them un-noised, so
        a head sum is no release of its own (the run's accountant charges the training).
    exchange_noise : float or None
        The row-level exchange's accounted noise multiplier (None: ``noise_multiplier``;
        [`JobConfig.exchange_row_noise`][fedhead.settings.job.JobConfig.exchange_row_noise]).
    """

    def __init__(
        self,
        inner: SecureAggregator,
        *,
        noise_multiplier: float,
        sites: int,
        delta: float,
        row_level: bool = False,
        private_heads: bool = False,
        exchange_noise: float | None = None,
    ) -> None:
        self.inner = inner
        self.noise_multiplier = float(noise_multiplier)
        self.sites = int(sites)
        self.delta = float(delta)
        self.row_level = bool(row_level)
        self.private_heads = bool(private_heads)
        self.exchange_noise = self.noise_multiplier if exchange_noise is None else float(exchange_noise)
        self.rows = 1  # the exchange's pooled count (row_level: the accounting's population, recorded)
        self.releases = 0  # the secure sums decoded so far: differential privacy composes them

    def exchange(self, settings: ExchangeSettings, grid: Grid, node_ids: Sequence[int]) -> MomentExchange:
        """The secure exchange of the pooled moments made PSD; its sum is the first release."""
        pooled = self.inner.pool(settings, grid, node_ids).nearest_psd()
        exchange = pooled_exchange(pooled, settings)
        self.releases, self.rows = 1, max(1, round(pooled.count))
        return exchange

    def check_regime(self, exchange: MomentExchange, settings: ExchangeSettings, allow_outside_regime: bool) -> None:
        """The secure aggregator's check."""
        self.inner.check_regime(exchange, settings, allow_outside_regime)

    def address(self, phase: Phase, messages: list[Message]) -> list[Message]:
        """The secure aggregator's messages."""
        return self.inner.address(phase, messages)

    def aggregate_train(self, phase: Phase, replies: Iterable[Message]) -> HeadSum:
        """The secure aggregator's head, one release more (none for DP-SGD heads)."""
        summed = self.inner.aggregate_train(phase, replies)
        self.releases += 0 if self.private_heads else 1
        return summed

    def aggregate_evaluate(self, phase: Phase, replies: Iterable[Message]) -> MseSum:
        """The secure aggregator's errors, one release more."""
        summed = self.inner.aggregate_evaluate(phase, replies)
        self.releases += 1
        return summed

    def privacy_spent(self) -> dict[str, float]:
        """The releases so far and their ``epsilon`` at ``delta`` (empty before the first)."""
        if not self.releases:
            return {}
        if self.row_level:
            z, _ = exchange_event(self.exchange_noise)
            later = [self.noise_multiplier] * (self.releases - 1)
            epsilon = row_privacy_spent(z, later, self.rows, self.delta)
            return {DP_RELEASES: float(self.releases), DP_EPSILON: float(epsilon)}
        spent = privacy_spent(self.noise_multiplier, self.releases, self.sites, self.delta)
        return {DP_RELEASES: float(self.releases), DP_EPSILON: float(spent.epsilon)}


def make_aggregator(
    privacy: PrivacyPolicy,
    sites: int,
    roster: Roster | None = None,
    *,
    private_heads: bool = False,
    exchange_noise: float | None = None,
) -> Aggregator:
    """The aggregator of ``privacy.mode`` for ``sites`` sites: clear, secure (among the members of ``roster``,
    which secure mode needs), or secure wrapped in differential privacy when ``privacy.dp_noise > 0``
    (``private_heads``: the heads are DP-SGD outputs, summed without noise; ``exchange_noise``: the row-level
    exchange's accounted noise multiplier, None: ``privacy.dp_noise``)."""
    if not privacy.secure:
        return ClearAggregator()
    if roster is None:
        raise ConfigError(
            "privacy.mode=secure needs the federation's roster of the sites' signing keys (a simulation makes its "
            "own; a deployment's server reads the run config's roster, made by fedhead-keys)"
        )
    secure = SecureAggregator(SumSetup(roster, privacy.threshold))
    if privacy.dp_noise <= 0:
        return secure
    return DifferentialPrivacy(
        secure,
        noise_multiplier=privacy.dp_noise,
        sites=sites,
        delta=privacy.dp_delta,
        row_level=privacy.row_level,
        private_heads=private_heads and privacy.row_level,
        exchange_noise=exchange_noise,
    )
