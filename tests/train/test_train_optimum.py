"""Local training reaches the optimum the theory is about (docs/theory.md §4, §5, §8).

The fixes of :func:`fedhead.train.train_local` (the bias held at its least-squares optimum, the
last layer solved for the initial head, the exact finishing step, the warm-up) are exact partial
minimisations or initialisations: these tests check that they leave the optimum and the federated
fixed points where they are, that they reach them, and that the tolerance stop and the reported
gaps say the truth.
"""

import dataclasses

import numpy as np
import pytest
import torch

from fedhead import ufm
from fedhead.models import FreeFeatureConfig, ResMLPConfig, build_backbone, build_head
from fedhead.train import LocalProblem, TrainConfig, evaluate_local, train_local
from fedhead.train.finishing import feature_projection
from fedhead.train.last_layer import solve_output_layer

LAM = 0.1
C, P = 2, 4
# the literal theory.md §10 recipe: trained bias, no last-layer solve, no finishing step, no warm-up
LITERAL = dict(optimal_bias=False, solve_last_layer=False, finish_features=False, warmup_steps=0)
COVS = [np.array([[1.5, 0.3], [0.3, 0.6]]), np.array([[0.9, -0.2], [-0.2, 1.4]]), np.array([[2.0, 0.5], [0.5, 0.8]])]
MEANS = [np.array([2.5, -3.0]), np.array([0.0, 0.5]), np.array([-2.0, 1.5])]  # large means: the slow bias
COUNTS = [16, 20, 12]


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


PROBLEM_FIELDS = {f.name for f in dataclasses.fields(LocalProblem)}


def cfg(n, **kw) -> tuple[TrainConfig, LocalProblem]:
    """Full-batch recipe for ``n`` samples and the problem (``train_local``'s two arguments)."""
    base = dict(epochs=2000, batch_size=n, lr=1e-2, lr_min=1e-5, lambda_h=LAM, lambda_w=LAM, clip_norm=None)
    base.update(kw)
    problem = LocalProblem(**{k: v for k, v in base.items() if k in PROBLEM_FIELDS})
    return TrainConfig(**{k: v for k, v in base.items() if k not in PROBLEM_FIELDS}), problem


@pytest.fixture
def clients(make_targets):
    return [
        torch.tensor(make_targets(n, mu, s, seed=i), dtype=torch.float32)
        for i, (n, mu, s) in enumerate(zip(COUNTS, MEANS, COVS))
    ]


def free(n, seed=0):
    return build_backbone(FreeFeatureConfig(feature_dim=P), (), n, seed)


def head_at(w, b=None):
    head = build_head(P, C, 1)
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(w, dtype=torch.float32))
        head.bias.copy_(torch.as_tensor(np.zeros(C) if b is None else b, dtype=torch.float32))
    return head


W0 = np.random.default_rng(3).standard_normal((C, P)) * 0.5


# ------------------------------------------------------------------ the pieces, against known answers
def test_optimal_features_minimise_the_objective_for_a_given_head(make_targets):
    """H = (Y - mu) A^{-1} W: the objective at it is F(W; Sigma) (the profiled value), its gradient 0."""
    y = make_targets(16, MEANS[0], COVS[0], seed=0)
    h = ufm.optimal_features(W0, y, LAM)
    res = h @ W0.T + y.mean(0) - y
    value = 0.5 * (np.sum(res**2) + LAM * np.sum(h**2)) / 16 + 0.5 * LAM * np.sum(W0**2)
    assert value == pytest.approx(ufm.profiled_objective(W0, COVS[0], LAM, LAM, hessian=False).value, rel=1e-12)
    np.testing.assert_allclose(res @ W0 + LAM * h, 0.0, atol=1e-12)  # gradient in H
    np.testing.assert_allclose(h.mean(0), 0.0, atol=1e-14)
    with pytest.raises(ufm.UFMInputError, match="target columns"):
        ufm.optimal_features(W0, y[:, :1], LAM)


@pytest.mark.parametrize("kind", ["free", "resmlp"])
def test_map_features_is_the_affine_map_of_the_features(kind):
    n = 10
    bb = free(n) if kind == "free" else build_backbone(ResMLPConfig(width=8, feature_dim=P), (3,), n, seed=0)
    x = torch.arange(n) if kind == "free" else torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        h = bb(x).double()
    m = torch.as_tensor(np.random.default_rng(1).standard_normal((P, P)))
    d = torch.as_tensor(np.random.default_rng(2).standard_normal(P))
    bb.map_features(m, d)
    with torch.no_grad():
        torch.testing.assert_close(bb(x).double(), (h + d) @ m.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["free", "resmlp"])
def test_solved_last_layer_gives_the_optimal_features(kind, make_targets):
    """Where the layer's inputs span the samples (N - 1 <= width), the exact solve (ridge 0) makes
    the model's objective equal the profiled objective F(W; Sigma) of the head."""
    n = 10
    y = torch.tensor(make_targets(n, MEANS[0], COVS[0], seed=1), dtype=torch.float32)
    bb = free(n) if kind == "free" else build_backbone(ResMLPConfig(width=16, feature_dim=P), (3,), n, seed=0)
    x = torch.arange(n) if kind == "free" else torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    solve_output_layer(bb, x, y, W0, LAM, ridge=0.0)
    with torch.no_grad():
        h = bb(x).double().numpy()
    np.testing.assert_allclose(h, ufm.optimal_features(W0, y.double().numpy(), LAM), atol=1e-4)
    ev = evaluate_local(bb, (W0, y.double().mean(0).numpy()), x, y, lambda_h=LAM, lambda_w=LAM)
    f = ufm.profiled_objective(W0, np.cov(y.double().numpy().T, bias=True), LAM, LAM, hessian=False).value
    assert ev.objective == pytest.approx(f, rel=1e-5)


def test_feature_projection_is_the_row_space_projector():
    p_w = feature_projection(torch.as_tensor(W0)).numpy()
    np.testing.assert_allclose(p_w @ p_w, p_w, atol=1e-12)
    np.testing.assert_allclose(W0 @ p_w, W0, atol=1e-12)
    assert np.trace(p_w) == pytest.approx(C, abs=1e-12)


# ------------------------------------------------------------------ the optimum is unchanged and reached
def test_bias_fix_changes_no_optimum_and_reaches_it_faster(clients):
    """Client 0 has a large target mean. The literal recipe needs many more steps, but both end at
    the same optimum: Gram phi(Sigma_m), bias mu_m, L*_m."""
    y = clients[0]
    n = y.shape[0]
    sigma = np.cov(y.double().numpy().T, bias=True)
    g_m = ufm.optimal_gram(sigma, LAM, LAM)
    fixed = train_local(free(n), head_at(W0), torch.arange(n), y, *cfg(n, epochs=1500), device="cpu")
    literal = train_local(free(n), head_at(W0), torch.arange(n), y, *cfg(n, epochs=8000, **LITERAL), device="cpu")
    short = train_local(free(n), head_at(W0), torch.arange(n), y, *cfg(n, epochs=1500, **LITERAL), device="cpu")
    for r in (fixed, literal):
        assert r.metrics.relative_gap < 1e-6
        assert rel(r.weight @ r.weight.T, g_m) < 1e-4
        np.testing.assert_allclose(r.bias, y.double().mean(0).numpy(), atol=1e-3)
    assert short.metrics.relative_gap > 100 * fixed.metrics.relative_gap  # the slow direction, at equal steps


def _federate(clients, rounds, *, rho, gamma, **kw):
    """An in-process federation of train_local clients (private free features kept per client)."""
    moments = ufm.TargetMoments.from_targets([y.double().numpy() for y in clients])
    sigma_cen = np.asarray(moments.sigma_cen)
    weights = np.asarray(moments.weights)
    backbones = [free(y.shape[0], seed=0) for y in clients]
    w, b = W0.copy(), np.zeros(C)
    grams = [w @ w.T]
    for _ in range(rounds):
        outs = [
            train_local(
                bb,
                head_at(w, b),
                torch.arange(y.shape[0]),
                y,
                *cfg(y.shape[0], rho=rho, gamma=gamma, **kw),
                broadcast_weight=w,
                sigma_cen=sigma_cen if gamma > 0 else None,
                device="cpu",
                seed=0,
            )
            for bb, y in zip(backbones, clients)
        ]
        w = sum(p * o.weight for p, o in zip(weights, outs))
        b = sum(p * o.bias for p, o in zip(weights, outs))
        grams.append(w @ w.T)
    return np.array(grams), b, moments, outs


@pytest.mark.parametrize("optimal_bias", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_federated_fixed_points_are_unchanged(clients, optimal_bias):
    """With and without the bias fix: corrected-proximal clients put G_1 on G_cen; proximal clients
    follow the exact BW recursion; the aggregated bias is mu_g (docs/theory.md §6, §8). Without the
    fix the trained bias needs 8000 steps per round to get there (hence a slow test)."""
    epochs = 1500 if optimal_bias else 8000
    grams, b, moments, _ = _federate(clients, 1, rho=1e-5, gamma=1.0, epochs=epochs, optimal_bias=optimal_bias)
    g_cen = ufm.optimal_gram(moments.sigma_cen, LAM, LAM)
    assert rel(grams[1], g_cen) < 1e-3
    grams, b, moments, _ = _federate(clients, 3, rho=1e-5, gamma=0.0, epochs=epochs, optimal_bias=optimal_bias)
    g_m = ufm.optimal_gram(np.asarray(moments.covs), LAM, LAM)
    recursion = ufm.gram_recursion(grams[0], g_m, np.asarray(moments.weights), 3)
    for t in range(1, 4):
        assert rel(grams[t], recursion[t]) < 2e-3, t
    np.testing.assert_allclose(b, moments.mean_global, atol=2e-3)


def test_corrected_client_reports_the_gap_of_the_objective_it_minimised(clients):
    _, _, moments, outs = _federate(clients, 1, rho=0.0, gamma=1.0, epochs=1500)
    for o in outs:
        assert o.metrics.trained_gap < 1e-5  # L_m + C_m is at its optimum ...
        assert o.metrics.relative_gap > 1e-2  # ... which is not the optimum of L_m
        # gamma = 1: the corrected objective is F(W; Sigma_cen) (docs/theory.md §8), its optimum L*(Sigma_cen)
        assert o.metrics.trained_optimal_objective == pytest.approx(
            float(ufm.optimal_loss(moments.sigma_cen, LAM, LAM)), rel=1e-9
        )


# ------------------------------------------------------------------ selection: the closest optimal head
def test_distance_to_the_selected_head_shrinks_with_rho(clients):
    """The proximal optimum is Pi_m(W_t) + O(rho): the returned head's distance to Pi_m(W_t) falls
    linearly with rho (docs/theory.md §5); a proximal term pulling anywhere else fails this."""
    y = clients[0]
    n = y.shape[0]
    pi = ufm.closest_head(W0, ufm.optimal_gram(np.cov(y.double().numpy().T, bias=True), LAM, LAM))
    dist = {}
    for rho in (1e-2, 1e-3, 1e-4):
        r = train_local(
            free(n), head_at(W0), torch.arange(n), y, *cfg(n, epochs=1500, rho=rho), broadcast_weight=W0, device="cpu"
        )
        dist[rho] = rel(r.weight, pi)
    assert dist[1e-3] < 0.2 * dist[1e-2] and dist[1e-4] < 0.2 * dist[1e-3]
    assert dist[1e-4] < 1e-3


# ------------------------------------------------------------------ the tolerance stop
def test_local_tol_stops_once_the_gap_is_reached(clients):
    y = clients[1]
    n = y.shape[0]
    r = train_local(
        free(n), head_at(W0), torch.arange(n), y, *cfg(n, epochs=3000, local_tol=1e-4, check_every=10), device="cpu"
    )
    m = r.metrics
    assert m.converged and m.trained_gap <= 1e-4 and m.epochs < 3000 and m.n_steps == m.epochs
    epochs = [e for e, _ in m.gap_trace]
    assert epochs == list(range(10, m.epochs + 1, 10)) and m.gap_trace[-1][1] <= 1e-4
    assert all(g > 1e-4 for _, g in m.gap_trace[:-1])  # it stopped at the first check below the tolerance
    # without the closing solves nothing reaches 1e-12 in 20 epochs, and the run says so
    short = cfg(n, epochs=20, local_tol=1e-12, solve_last_layer=False)
    r = train_local(free(n), head_at(W0), torch.arange(n), y, *short, device="cpu")
    assert r.metrics.converged is False and r.metrics.epochs == 20
    r = train_local(free(n), head_at(W0), torch.arange(n), y, *cfg(n, epochs=20), device="cpu")
    assert r.metrics.converged is None and r.metrics.gap_trace == ()


@pytest.mark.parametrize(
    "override,msg",
    [
        ("local_tol=0", r"^train: TrainConfig\.local_tol must be a relative gap in \(0, 1\)"),
        ("local_tol=-1e-3", r"^train: TrainConfig\.local_tol must be a relative gap in \(0, 1\)"),
        ("local_epochs=0", r"^local_epochs must be an integer >= 1, got 0$"),
    ],
)
def test_bad_tolerance_or_cap_is_one_clear_config_error(override, msg):
    """Refused when the config is loaded, before any data, Ray or Flower (one line: the CLI prints it)."""
    from fedhead.settings.config import ConfigError, compose_config, load_config

    with pytest.raises(ConfigError, match=msg):
        load_config(compose_config([override]))


# ------------------------------------------------------------------ the closing solves: head and last layer
@pytest.mark.parametrize("kind", ["free", "resmlp"])
@pytest.mark.parametrize("rho", [0.0, 1e-3])
def test_short_training_ends_at_the_exact_local_optimum(kind, rho, make_targets):
    """After 30 epochs (far from the optimum for the optimiser alone) the closing solves put the
    head on the minimiser of F(W; Sigma_m) + rho/2 ||W - W_t||^2 and the features on the optimal ones
    for it: the trained gap is at rounding level and the head is the exact proximal step (rho > 0)
    or on the optimal Gram (rho = 0). The ResMLP's last layer has 16 inputs for 10 samples."""
    n = 10
    y = torch.tensor(make_targets(n, MEANS[0], COVS[0], seed=1), dtype=torch.float32)
    sigma = np.cov(y.double().numpy().T, bias=True)
    bb = free(n) if kind == "free" else build_backbone(ResMLPConfig(width=16, depth=1, feature_dim=P), (3,), n, seed=0)
    x = torch.arange(n) if kind == "free" else torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    tc, pb = cfg(n, epochs=30, rho=rho)
    r = train_local(bb, head_at(W0), x, y, tc, pb, broadcast_weight=W0 if rho else None, device="cpu")
    if rho:  # the proximal step sits above L* by the pull of rho: exactly that much
        step = ufm.local_head(W0, sigma, LAM, LAM, rho=rho, w_ref=W0).head
        assert rel(r.weight, step) < 1e-5
        l_star = float(ufm.optimal_loss(sigma, LAM, LAM))
        pulled = (ufm.profiled_objective(step, sigma, LAM, LAM, hessian=False).value - l_star) / l_star
        assert pulled > 1e-7 and r.metrics.trained_gap == pytest.approx(pulled, abs=1e-9)
    else:
        assert r.metrics.trained_gap < 1e-9
        assert rel(r.weight @ r.weight.T, ufm.optimal_gram(sigma, LAM, LAM)) < 1e-6
    literal = train_local(
        free(n) if kind == "free" else build_backbone(ResMLPConfig(width=16, depth=1, feature_dim=P), (3,), n, seed=0),
        head_at(W0),
        x,
        y,
        *cfg(n, epochs=30, rho=rho, solve_last_layer=False),
        broadcast_weight=W0 if rho else None,
        device="cpu",
    )
    assert literal.metrics.trained_gap > 1e-4  # the optimiser alone is far from it after 30 epochs


def test_without_the_rotation_a_proximal_head_stays_as_training_left_it(make_targets):
    """``finish_rotation=False`` with rho > 0 (the rho sweep): no closing head solve, since it would
    select the closest head for any rho. The head is the one training made (so farther from the
    exact proximal step than the rotated run's); the last layer is still solved for it, so the
    trained gap is that head's profiled gap, and the rotated run ends at the proximal step."""
    n = 10
    y = torch.tensor(make_targets(n, MEANS[0], COVS[0], seed=1), dtype=torch.float32)
    sigma = np.cov(y.double().numpy().T, bias=True)
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    step = ufm.local_head(W0, sigma, LAM, LAM, rho=1e-3, w_ref=W0).head
    runs = {}
    for rotate in (True, False):
        bb = build_backbone(ResMLPConfig(width=16, depth=1, feature_dim=P), (3,), n, seed=0)
        tc, pb = cfg(n, epochs=30, rho=1e-3, finish_rotation=rotate)
        runs[rotate] = train_local(bb, head_at(W0), x, y, tc, pb, broadcast_weight=W0, device="cpu")
    assert rel(runs[True].weight, step) < 1e-5 and rel(runs[False].weight, step) > 1e-3
    l_star = float(ufm.optimal_loss(sigma, LAM, LAM))
    profiled = ufm.profiled_objective(runs[False].weight.astype(np.float64), sigma, LAM, LAM, hessian=False).value
    assert runs[False].metrics.trained_gap == pytest.approx((profiled - l_star) / l_star, rel=1e-4)
    # not moved to the unpenalised optimum either: the pull and the training of the head stay
    assert runs[False].metrics.trained_gap > 1e-6


def test_the_closing_solve_never_raises_the_objective(make_targets):
    """keep_better: a last layer already at the optimum for W (the exact solve, ridge 0) is left as it
    is, since every filtered candidate has a higher objective."""
    n = 10
    y = torch.tensor(make_targets(n, MEANS[0], COVS[0], seed=1), dtype=torch.float32)
    bb = build_backbone(ResMLPConfig(width=16, feature_dim=P), (3,), n, seed=0)
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    solve_output_layer(bb, x, y, W0, LAM, ridge=0.0)
    before = [t.detach().clone() for t in bb.output_layer().parameters()]
    assert solve_output_layer(bb, x, y, W0, LAM, ridge=1e-4, keep_better=True) is False
    for a, b in zip(before, bb.output_layer().parameters(), strict=True):
        assert torch.equal(a, b)
