"""examples/library-app, a user's own Flower app (its own model, data and ``clients`` package)
around fedhead's strategy and client step, run from its folder: its ServerApp body and its
ClientApp serve each other in this process (no Ray), with the run config of its pyproject.toml.

What the theory predicts (docs/theory.md §5-6): with the exact selection the shared Gram follows
the BW fixed-point iteration to ``G_star``, the barycenter of the clients' optimal Grams computed
here from the clients' own data; trained proximal clients (the user's MLP) follow the exact
recursion from the run's own ``G_0``. docs/library.md lists the example's code, kept equal here.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from app_helpers import InProcessGrid

from fedhead import ufm

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "examples" / "library-app"
LAM = 0.01


@pytest.fixture
def example(monkeypatch, task_identity, one_torch_thread):
    """The example's folder as the working directory and first on ``sys.path``; its modules are
    imported afresh and removed afterwards (its ``clients`` package is not fedhead's)."""
    mine = ("clients", "myapp")

    def forget():
        for name in [n for n in sys.modules if n.split(".")[0] in mine]:
            del sys.modules[name]

    forget()
    monkeypatch.chdir(APP)
    monkeypatch.syspath_prepend(str(APP))
    yield
    forget()


def run_config(tmp_path: Path, **overrides) -> dict:
    cfg = tomllib.loads((APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    return {**cfg, "output-dir": str(tmp_path), **overrides}


def serve(tmp_path: Path, **overrides) -> tuple[dict, dict]:
    """Run the example's ServerApp body against its ClientApp; its summary.json and run config."""
    from flwr.app import Context, RecordDict
    from myapp.client_app import app as client_app
    from myapp.server_app import main

    cfg = run_config(tmp_path, **overrides)
    grid = InProcessGrid(client_app, int(cfg["num-clients"]), run_config=cfg)
    main(grid, Context(run_id=11, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    return json.loads((tmp_path / "summary.json").read_text()), cfg


def g_star_from_the_clients_data(cfg: dict) -> np.ndarray:
    from myapp.task import load_partition

    ys = [load_partition(m, 3, int(cfg["seed"]))[1].double().numpy() for m in range(3)]
    moments = ufm.TargetMoments.from_targets(ys)
    grams = ufm.optimal_gram(np.asarray(moments.covs), LAM, LAM)
    return ufm.bw_barycenter(grams, np.asarray(moments.weights)).gram


def rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))


def test_the_users_clients_package_and_fedheads_import_side_by_side(example):
    from myapp import client_app  # noqa: F401  (imports both)

    import clients
    import fedhead.clients

    assert Path(clients.__file__).parent == APP / "clients" and len(clients.SITES) == 3
    assert Path(fedhead.clients.__file__).parent == REPO / "clients"
    assert callable(fedhead.clients.train_step)


def test_exact_selection_reaches_the_barycenter_of_the_clients_grams(example, tmp_path):
    summary, cfg = serve(tmp_path, procedure="exact", **{"num-server-rounds": 12})
    g_star = g_star_from_the_clients_data(cfg)
    np.testing.assert_allclose(summary["targets"]["g_star"], g_star, rtol=0, atol=1e-9 * np.abs(g_star).max())
    errors = [rel(r["gram"], g_star) for r in summary["rounds"]]
    assert errors[-1] < 1e-6 and errors[-1] < 1e-3 * errors[1], errors


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_trained_proximal_clients_report_their_step_and_the_users_metric(example, tmp_path):
    """The user's MLP trained by fedhead's step for two rounds: every reply carries fedhead's
    metrics and the user's own, the server measured every round against the same ``G_star``."""
    summary, cfg = serve(tmp_path, **{"num-server-rounds": 2, "local-epochs": 40})
    g_star = g_star_from_the_clients_data(cfg)
    np.testing.assert_allclose(summary["targets"]["g_star"], g_star, rtol=0, atol=1e-9 * np.abs(g_star).max())
    rounds = summary["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds[1:]:
        assert len(r["trained_gaps"]) == 3 and all(np.isfinite(r["trained_gaps"]))
        assert all(1 <= e <= 40 for e in r["local_epochs"]) and np.isfinite(r["train_mse"])
        assert [m["partition-id"] for m in r["client_metrics"]] == [0, 1, 2]
        assert all(m["backbone_norm"] > 0 for m in r["client_metrics"])  # the user's metric
        assert r["e_f_star"] == pytest.approx(rel(r["gram"], g_star), rel=1e-9)


def test_docs_list_the_examples_code_as_it_is():
    doc = (REPO / "docs" / "library.md").read_text()
    for name in ("server_app.py", "client_app.py"):
        assert f"```python\n{(APP / 'myapp' / name).read_text()}```" in doc, f"docs/library.md lists another {name}"
    for link in re.findall(r"\]\(([^)]+)\)", doc):
        assert (REPO / "docs" / link).resolve().is_relative_to(REPO) and (REPO / "docs" / link).exists(), link
