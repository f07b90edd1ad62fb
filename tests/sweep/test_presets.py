"""The sweep presets: unique runs, the swept knobs as asked, and every run's config composes and
validates exactly as ``fedhead-run`` would build it (no Ray, no data)."""

from __future__ import annotations

import pytest

from fedhead.analysis.constraints import ConfigError
from fedhead.settings.config import compose_config, load_config
from fedhead.sweep import PRESETS, plan
from fedhead.sweep.presets import MAIN_PROCEDURES, PAPER_EPOCHS, RHOS
from fedhead.sweep.specs import FILE_ONLY, SETTINGS


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_smoke_run_composes_and_validates(name, tmp_path):
    runs = plan(name, "smoke")
    assert runs and len({r.id for r in runs}) == len(runs)
    for spec in runs:
        cfg = load_config(compose_config(list(spec.overrides)))
        job = cfg.jobs(tmp_path)[0]
        assert job.procedure.name == spec.procedure
        assert job.settings.seed == spec.seed
        assert job.dataset.name == spec.dataset
        assert job.settings.rounds == (1 if name == "mismatch" else 3)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_paper_runs_compose_first_and_last(name, tmp_path):
    runs = plan(name, "paper")
    for spec in (runs[0], runs[-1]):
        cfg = load_config(compose_config(list(spec.overrides)))
        job = cfg.jobs(tmp_path)[0]
        assert job.settings.rounds == (1 if name == "mismatch" else 8)
        assert job.model.width in (64, 1024)  # the paper's networks, not the smoke ones
        assert getattr(job.dataset, "image_size", None) is None


def test_paper_main_grid_is_the_protocol():
    runs = plan("main", "paper")
    assert len(runs) == len(SETTINGS) * len(MAIN_PROCEDURES) * 5
    assert {r.seed for r in runs} == {0, 1, 2, 3, 4}
    hopper = [r for r in runs if r.setting == "hopper" and r.procedure == "proximal" and r.seed == 0][0]
    job = load_config(compose_config(list(hopper.overrides))).jobs("/tmp/x")[0]
    assert (job.settings.rounds, job.settings.local_epochs, job.procedure.rho) == (8, 4000, 1e-3)
    assert job.train.local_tol is None and job.model.name == "resmlp" and job.model.width == 1024
    image = [r for r in runs if r.setting == "dsprites"][0]
    assert load_config(compose_config(list(image.overrides))).model.name == "resnet18"


def test_swept_knobs_reach_the_run_config(tmp_path):
    rho_runs = plan("rho", "paper")
    assert sorted({r.params["rho"] for r in rho_runs}) == sorted(RHOS)
    spec = [r for r in rho_runs if r.params["rho"] == 1e-2][0]
    job = load_config(compose_config(list(spec.overrides))).jobs(tmp_path)[0]
    assert job.procedure.rho == 1e-2 and job.train.finish_rotation is False
    for scale in ("cpu", "smoke"):  # E fixed at every scale: no tolerance stop ends a rho run early
        spec = [r for r in plan("rho", scale) if r.params["rho"] == 1e-3][0]
        job = load_config(compose_config(list(spec.overrides))).jobs(tmp_path)[0]
        assert job.train.local_tol is None and job.train.finish_rotation is False
    e_runs = plan("epochs", "paper")
    assert sorted({r.params["local_epochs"] for r in e_runs}) == list(PAPER_EPOCHS)
    spec = [r for r in e_runs if r.params["local_epochs"] == 200][0]
    job = load_config(compose_config(list(spec.overrides))).jobs(tmp_path)[0]
    assert job.settings.local_epochs == 200 and job.train.local_tol is None
    fm = [r for r in plan("full_model", "paper") if r.params["gamma"] == 1.0][0]
    job = load_config(compose_config(list(fm.overrides))).jobs(tmp_path)[0]
    assert job.procedure.full_model and job.procedure.gamma == 1.0 and job.procedure.reference == "cen"
    big = plan("data_size", "paper")[0]
    assert load_config(compose_config(list(big.overrides))).dataset.n_train == 48000


def test_narrowing_and_bad_names():
    runs = plan("main", "smoke", seeds=[3, 4], settings=["hopper"])
    assert {(r.setting, r.seed) for r in runs} == {("hopper", 3), ("hopper", 4)}
    assert all(s in SETTINGS for s in FILE_ONLY)
    with pytest.raises(ConfigError, match="not a preset"):
        plan("nope", "smoke")
    with pytest.raises(ConfigError, match=r"choose one of \['cpu', 'paper', 'smoke'\]"):
        plan("main", "huge")
    with pytest.raises(ConfigError, match="unknown data sets"):
        plan("main", "smoke", settings=["mnist"])


def test_cpu_main_grid_is_the_protocol_on_every_setting(tmp_path):
    """scale=cpu: the paper's protocol (8 rounds, rho = 1e-3 for the proximal procedures, the same
    lambdas, seeds 0-2, every setting) with CPU-sized data and networks and a tolerance stop; a
    tabular and an image run compose as fedhead-run builds them."""
    runs = plan("main", "cpu")
    assert len(runs) == len(SETTINGS) * len(MAIN_PROCEDURES) * 3 and {r.seed for r in runs} == {0, 1, 2}
    for setting, model in (("hopper", "resmlp_small"), ("dsprites", "rescnn")):
        spec = [r for r in runs if r.setting == setting and r.procedure == "corrected_proximal" and r.seed == 0][0]
        job = load_config(compose_config(list(spec.overrides))).jobs(tmp_path)[0]
        assert (job.settings.rounds, job.procedure.rho, job.settings.lambda_h, job.settings.lambda_w) == (
            8,
            1e-3,
            0.01,
            0.01,
        )
        assert job.model.name == model and job.train.local_tol == 1e-3 and job.train.solve_last_layer
    narrowed = plan("main", "cpu", seeds=[0], settings=["hopper", "walker2d"])
    assert len(narrowed) == 2 * len(MAIN_PROCEDURES)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_cpu_runs_compose_first_and_last_and_honour_seeds_and_settings(name, tmp_path):
    """Every preset at scale=cpu composes; ``seeds=`` replaces its seeds and ``settings=`` picks
    from every setting of the preset, also those the scale leaves out by default."""
    runs = plan(name, "cpu")
    for spec in (runs[0], runs[-1]):
        job = load_config(compose_config(list(spec.overrides))).jobs(tmp_path)[0]
        assert job.settings.rounds == (1 if name == "mismatch" else 8)
    assert {r.seed for r in plan(name, "cpu", seeds=[7])} == {7}
    for setting in sorted({r.dataset for r in plan(name, "paper")}):
        assert {r.dataset for r in plan(name, "cpu", settings=[setting])} == {setting}, setting


def test_every_preset_lists_its_file_only_settings_at_cpu_scale():
    """A file-only setting stays in the preset wherever its kind (tabular, image) does (it runs with
    data_roots, else is skipped with the file it needs): the scale drops no data set for its files."""
    from fedhead.sweep.specs import IMAGE

    for name in PRESETS:
        cpu = {r.dataset for r in plan(name, "cpu")}
        kinds = {s in IMAGE for s in cpu}
        for setting in {r.dataset for r in plan(name, "paper")} & set(FILE_ONLY):
            assert setting in cpu or (setting in IMAGE) not in kinds, (name, setting)


def test_finite_budget_presets_run_the_literal_local_training(tmp_path):
    """E is the variable of the epochs preset and of full-model E = 400: no closing solve ends
    their clients at the optimum whatever E; full-model E = 4000 keeps them (its claim assumes
    optima); E / 20 at scale=cpu."""
    for scale in ("cpu", "paper"):
        for spec in plan("epochs", scale, seeds=[0], settings=["hopper"]):
            job = load_config(compose_config(list(spec.overrides))).jobs(tmp_path)[0]
            assert not job.train.solve_last_layer and job.train.local_tol is None
    assert sorted({r.params["local_epochs"] for r in plan("epochs", "cpu")}) == [2, 5, 10, 20, 50, 100, 200]
    assert {r.procedure for r in plan("epochs", "cpu")} == {"ordinary"}
    fm = {r.params["paper_local_epochs"]: r for r in plan("full_model", "cpu", seeds=[0], settings=["hopper"])}
    short = load_config(compose_config(list(fm[400].overrides))).jobs(tmp_path)[0]
    long = load_config(compose_config(list(fm[4000].overrides))).jobs(tmp_path)[0]
    assert (short.settings.local_epochs, short.train.solve_last_layer) == (20, False)
    assert (long.settings.local_epochs, long.train.solve_last_layer) == (200, True)


def test_fixed_e_is_main_without_the_tolerance_stop(tmp_path):
    """fixed_e: main's procedures with E epochs every round; at the paper scale (no tolerance stop)
    its runs are main's, config for config."""
    from fedhead.sweep.runner import build_job

    fixed = plan("fixed_e", "cpu")
    assert {r.dataset for r in fixed} == {"beijing", "swimmer", "hopper", "halfcheetah", "walker2d"}
    assert {r.seed for r in fixed} == {0} and {r.procedure for r in fixed} == set(MAIN_PROCEDURES)
    job = load_config(compose_config(list(fixed[0].overrides))).jobs(tmp_path)[0]
    assert job.train.local_tol is None and job.settings.local_epochs == 2000
    main = {(r.setting, r.procedure, r.seed): r for r in plan("main", "paper", settings=["hopper"], seeds=[0])}
    for spec in plan("fixed_e", "paper", settings=["hopper"], seeds=[0]):
        twin = main[(spec.setting, spec.procedure, spec.seed)]
        assert build_job(spec, tmp_path, {}).config_hash == build_job(twin, tmp_path, {}).config_hash


def test_runs_picks_runs_by_id_pattern():
    runs = plan("epochs", "cpu", runs=["epochs/hopper/E20/*", "epochs/walker2d/E2/ordinary/s1"])
    assert sorted(r.id for r in runs) == [
        "epochs/hopper/E20/ordinary/s0",
        "epochs/hopper/E20/ordinary/s1",
        "epochs/hopper/E20/ordinary/s2",
        "epochs/walker2d/E2/ordinary/s1",
    ]
    with pytest.raises(ConfigError, match="no run id matches"):
        plan("epochs", "cpu", runs=["nope/*"])
