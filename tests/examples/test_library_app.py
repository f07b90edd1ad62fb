"""examples/library-app, a user's own Flower app (its own model, data and ``clients`` package)
around fedhead's strategy and client step, run from its folder: its ServerApp body and its
ClientApp serve each other in this process (no Ray), with the run config of its pyproject.toml.

What the theory predicts (docs/theory.md §5-6): with the exact selection the shared Gram follows
the BW fixed-point iteration to ``G_star``, the barycenter of the clients' optimal Grams computed
here from the clients' own data; trained proximal clients (the user's MLP, at their exact local
optima) follow the proximal rounds exactly, the exact recursion from the run's own ``G_0`` up to
O(rho), and reach ``G_star``. docs/library.md lists the example's code, kept equal here.
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
from fedhead.cli.keys import assemble, new_site

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
    if cfg["privacy-mode"] == "secure":  # each site's signing key and the roster, as fedhead-keys makes them
        entries = [new_site(f"site-{i}", tmp_path / "keys") for i in range(len(grid.contexts))]
        roster = tmp_path / "keys" / "roster.json"
        assemble([entry for _, entry in entries], roster)
        cfg["roster"] = str(roster)
        for context, (key, _) in zip(grid.contexts.values(), entries, strict=True):
            context.node_config = {**context.node_config, "signing-key": str(key), "roster": cfg["roster"]}
    main(grid, Context(run_id=11, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    return json.loads((tmp_path / "summary.json").read_text()), cfg


def the_clients_targets(cfg: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The clients' ``Sigma_m (M, C, C)``, weights ``p_m (M,)`` and optimal Grams ``(M, C, C)``,
    computed here from their own data."""
    from myapp.task import load_partition

    ys = [load_partition(m, 3, int(cfg["seed"]))[1].double().numpy() for m in range(3)]
    moments = ufm.TargetMoments.from_targets(ys)
    covs = np.asarray(moments.covs)
    return covs, np.asarray(moments.weights), ufm.optimal_gram(covs, LAM, LAM)


def g_star_from_the_clients_data(cfg: dict) -> np.ndarray:
    _, weights, grams = the_clients_targets(cfg)
    return ufm.bw_barycenter(grams, weights).gram


def rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))


def test_the_users_clients_package_and_fedheads_import_side_by_side(example):
    from myapp import client_app  # noqa: F401  (imports both)

    import clients
    import fedhead.clients

    assert Path(clients.__file__).parent == APP / "clients" and len(clients.SITES) == 3
    assert Path(fedhead.clients.__file__).parent == REPO / "fedhead" / "clients"
    assert callable(fedhead.clients.train_step)


def test_exact_selection_reaches_the_barycenter_of_the_clients_grams(example, tmp_path):
    summary, cfg = serve(tmp_path, procedure="exact", **{"num-server-rounds": 12})
    g_star = g_star_from_the_clients_data(cfg)
    np.testing.assert_allclose(summary["targets"]["g_star"], g_star, rtol=0, atol=1e-9 * np.abs(g_star).max())
    errors = [rel(r["gram"], g_star) for r in summary["rounds"]]
    assert errors[-1] < 1e-6 and errors[-1] < 1e-3 * errors[1], errors


def proximal_heads(gram: np.ndarray, covs: np.ndarray, rho: float) -> np.ndarray:
    """The heads ``(M, C, P)`` that proximal clients at their exact local optima return for a broadcast
    ``W_t`` with Gram ``gram`` (docs/theory.md §5): each the minimiser of ``F(W; Sigma_m) + rho/2
    ||W - W_t||^2`` near ``W_t``. Right-equivariant in ``W_t``, so any ``W_t`` with that Gram gives
    the same Grams and objective values."""
    from myapp.task import FEATURE_DIM

    chol = np.linalg.cholesky(gram)
    w_t = np.hstack([chol, np.zeros((chol.shape[0], FEATURE_DIM - chol.shape[1]))])
    return np.array([ufm.local_head(w_t, s, LAM, LAM, rho=rho, w_ref=w_t).head for s in covs])


def test_trained_proximal_clients_follow_the_recursion_to_g_star(example, tmp_path):
    """The user's MLP trained by fedhead's step: its last layer sees the inputs, on which the targets
    are linear, so the closing head and last-layer solve put every client at its exact local optimum
    after any number of epochs (3 here). Then the Grams are the proximal rounds' to 1e-6, the exact
    BW recursion's from the run's own ``G_0`` up to the proximal term's O(rho) pull, and reach
    ``G_star``. Measured (2 busy cores, ~12 s): 3e-8 from the proximal rounds; 2.2e-2, 3.6e-4,
    3.4e-4 from the recursion; 0.69, 3.0e-2, 1.9e-3, 3.0e-4 from ``G_star``; trained gaps
    <= 4.6e-4, the theory's to 1e-9."""
    from fedhead.settings.config import load_procedure

    summary, cfg = serve(tmp_path, **{"num-server-rounds": 3, "local-epochs": 3})
    rho = load_procedure(str(cfg["procedure"])).rho
    assert cfg["procedure"] == "proximal" and rho == 1e-3
    covs, weights, grams = the_clients_targets(cfg)
    g_star = g_star_from_the_clients_data(cfg)
    np.testing.assert_allclose(summary["targets"]["g_star"], g_star, rtol=0, atol=1e-9 * np.abs(g_star).max())
    rounds = summary["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    g = np.array([r["gram"] for r in rounds])
    recursion = ufm.gram_recursion(g[0], grams, weights, 3)
    for t, r in enumerate(rounds[1:], start=1):
        heads = proximal_heads(g[t - 1], covs, rho)
        w_next = np.einsum("m,mij->ij", weights, heads)
        assert rel(g[t], w_next @ w_next.T) < 1e-6, t
        # the clients' gaps of L_m at their proximal optima: F(W_m; Sigma_m) against L*(Sigma_m)
        f_m = [ufm.profiled_objective(w, s, LAM, LAM, hessian=False).value for w, s in zip(heads, covs)]
        l_star = ufm.optimal_loss(covs, LAM, LAM)
        np.testing.assert_allclose(r["trained_gaps"], (np.asarray(f_m) - l_star) / l_star, rtol=0, atol=1e-7)
        # the server's own recursion column is the exact recursion from G_0
        np.testing.assert_allclose(r["recursion_gram"], recursion[t], rtol=0, atol=1e-9 * np.abs(recursion[t]).max())
        assert r["e_f_recursion"] == pytest.approx(rel(g[t], recursion[t]), rel=1e-9)
        assert r["e_f_recursion"] < (30 * rho if t == 1 else rho), (t, r["e_f_recursion"])
        assert r["e_f_star"] == pytest.approx(rel(g[t], g_star), rel=1e-9)
        assert len(r["trained_gaps"]) == 3 and max(r["trained_gaps"]) <= 1e-3, r["trained_gaps"]
        assert r["local_epochs"] == [3, 3, 3] and np.isfinite(r["train_mse"])
        assert [m["partition-id"] for m in r["client_metrics"]] == [0, 1, 2]
        assert all(m["backbone_norm"] > 0 for m in r["client_metrics"])  # the user's metric
    errors = [r["e_f_star"] for r in rounds]
    assert all(b < a for a, b in zip(errors, errors[1:])) and errors[-1] < 1e-3, errors


def test_docs_list_the_examples_code_as_it_is():
    doc = (REPO / "docs" / "library.md").read_text()
    for name in ("server_app.py", "client_app.py"):
        assert f"```python\n{(APP / 'myapp' / name).read_text()}```" in doc, f"docs/library.md lists another {name}"
    for link in re.findall(r"\]\(([^)]+)\)", doc):
        assert (REPO / "docs" / link).resolve().is_relative_to(REPO) and (REPO / "docs" / link).exists(), link


def test_secure_mode_gives_the_clear_runs_g_cen_and_grams(example, tmp_path):
    """``privacy-mode = "secure"``: the user's ClientApp with fedhead's mod; the server holds only sums."""
    over = {"num-server-rounds": 2, "local-epochs": 3}
    clear, _ = serve(tmp_path / "clear", **over)
    secure, _ = serve(tmp_path / "secure", **over, **{"privacy-mode": "secure"})
    assert rel(secure["targets"]["g_cen"], np.asarray(clear["targets"]["g_cen"])) < 1e-9
    assert secure["targets"]["g_star"] is None and clear["targets"]["g_star"] is not None
    for a, b in zip(clear["rounds"], secure["rounds"], strict=True):
        assert rel(b["gram"], np.asarray(a["gram"])) < 1e-6
        assert b["trained_gaps"] is None
