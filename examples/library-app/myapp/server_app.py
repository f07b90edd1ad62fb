"""The user's ServerApp: fedhead's strategy, its moment exchange, rounds and measurements."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedhead.federation.roster import Roster
from fedhead.models import initial_head
from fedhead.results.io import to_jsonable, write_json_atomic
from fedhead.settings.config import load_procedure
from fedhead.settings.privacy import PrivacyPolicy
from fedhead.settings.trust import TrustPolicy
from fedhead.strategies import make_strategy
from myapp.task import FEATURE_DIM

app = ServerApp()


class Summary:
    """A fedhead ``RunObserver``: keeps the moment exchange and every round's record."""

    def __init__(self) -> None:
        self.exchange = None
        self.rounds = []

    def on_exchange(self, exchange) -> None:
        self.exchange = exchange

    def on_round(self, record) -> None:
        self.rounds.append(record)


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    procedure = load_procedure(str(cfg["procedure"]))
    summary = Summary()
    strategy = make_strategy(
        procedure.strategy_kind,
        lambda_h=float(cfg["lambda-h"]),
        lambda_w=float(cfg["lambda-w"]),
        min_nodes=int(cfg["num-clients"]),
        gamma=procedure.gamma,
        centered=procedure.centered,
        observer=summary,
        evaluate_mse=not procedure.exact,  # the exact rule trains no backbone
        trust=TrustPolicy(extra_metrics=("backbone_norm",)),  # the metric our ClientApp adds
        privacy=PrivacyPolicy(mode=str(cfg["privacy-mode"])),  # "secure": the server receives only sums
        roster=Roster.load(str(cfg["roster"])) if cfg["roster"] else None,  # secure: the sites' keys (fedhead-keys)
    )
    # run(), not Strategy.start(): the moment exchange and the diagnosis come before round 1
    strategy.run(grid, lambda c: initial_head(FEATURE_DIM, c, int(cfg["seed"])), int(cfg["num-server-rounds"]))
    write_json_atomic(
        Path(str(cfg["output-dir"])) / "summary.json",
        to_jsonable(
            {
                "procedure": procedure.name,
                "targets": summary.exchange.targets.to_dict(),  # g_star, g_cen, the clients' Grams, weights
                "rounds": [r.to_dict() for r in summary.rounds],  # gram, e_f_star, client_metrics, ...
            }
        ),
    )
