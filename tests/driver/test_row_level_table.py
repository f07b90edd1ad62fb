"""``privacy.dp_unit=row`` with a site-local table kept in its files' units, in process (real ClientApps, no
Ray): the statistics exchange carries each site's row-level release of its raw targets (never sent as is); the
server's ``G_cen`` is the clear run's within the predicted noise, the recorded standardisation is the
identity and a site's ledger charges the exchange as a row-level release. A table standardised from the sites'
statistics is refused in one line before any message."""

from __future__ import annotations

import math

import numpy as np
import pytest
from app_helpers import simulated_sites
from test_private_heads import _run_with_ledgers
from test_secure_mode import SECURE, RecordingGrid, _rel, _run
from test_site_local import SIZES, _job, _sites

from fedhead.analysis.constraints import ConfigError
from fedhead.clients import make_client_app
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.federation import protocol
from fedhead.federation import row_privacy as rp
from fedhead.federation import secure_records as sr

#: the files' units; C = 100 clips none of the raw target rows (their norms are below 50)
UNITS = ("dataset.standardize_targets=none", "dataset.standardize_inputs=none")
ROW = ("privacy.dp_unit=row", "privacy.dp_max_rows=60", "privacy.dp_clip=100", "privacy.dp_head_clip=10")
#: one round of the exact rule, no evaluation
OVER = ("procedure=exact", "resources.evaluate_mse=false", "privacy.dp_delta=1e-5")


def test_a_table_in_its_files_units_takes_the_row_level_exchange(tmp_path, task_identity):
    files = _sites(tmp_path)
    clear, _ = _run(_job(tmp_path / "clear", files, *OVER, *UNITS))
    z = 0.01
    job = _job(tmp_path / "noisy", files, *OVER, *UNITS, SECURE, *ROW, f"privacy.dp_noise={z}")
    noisy, ledgers, grid = _run_with_ledgers(job, tmp_path)  # sites with a row-unit budget
    assert clear.moments is not None and clear.targets is not None
    assert noisy.moments is not None and noisy.targets is not None
    rows, sigma = sum(SIZES), np.asarray(clear.moments["sigma_cen"])
    dim = sigma.shape[0]
    assert clear.standardization["targets"]["mode"] == "none"
    # the second moments' noise per svec entry: drawn_noise * C^2 / sqrt(w) / N (no row clipped: noise only)
    entry = rp.drawn_noise(z, dim, 100.0) * rp.noise_scales(dim, 100.0)[1 + dim] / rows
    predicted = entry * math.sqrt(dim * (dim + 1) / 2) / float(np.linalg.norm(sigma))  # relative RMS e_F(cov)
    for err in (_rel(noisy.moments["sigma_cen"], sigma), _rel(noisy.targets["g_cen"], clear.targets["g_cen"])):
        assert predicted / 50 < err < 6 * predicted, (err, predicted)  # room for the mean's noise
    configs = [m.content.config_records.get("config") or {} for m in grid.sent]
    (exchange,) = {str(c[sr.SUM_ID]) for c in configs if c.get("stage") == "statistics"}  # one sum, all the sites
    assert any(c.get(sr.STEP) == sr.MASK and c.get(sr.SUM_ID) == exchange for c in configs)  # its masked step
    assert all(protocol.ROW_RELEASE not in r.content.array_records for r in grid.replies)  # never sent as is
    st = noisy.standardization  # the identity, in the files' units
    assert st["targets"]["mode"] == "none" and st["inputs"]["mode"] == "none"
    assert st["targets"]["offset"] == [0.0, 0.0] and st["targets"]["scale"] == [1.0, 1.0]
    # the exact rule's heads are closed forms of each site's own release (no release of their own); that release,
    # noised by the site's share alone, is accounted at z / sqrt(m_min), in results.json and in each ledger
    own = z / math.sqrt(job.min_summed_sites)
    assert job.reads_own_release and job.exchange_row_noise == pytest.approx(own, rel=1e-15)
    spent = noisy.privacy["dp"]
    assert spent["releases"] == 1
    assert spent["epsilon"] == pytest.approx(rp.row_privacy_spent(own, [], rows, 1e-5), rel=1e-9)
    for releases in ledgers:
        assert [(r["sum"].rsplit("/", 1)[-1], r.get("unit"), r["noise"]) for r in releases] == [
            ("exchange", "row", pytest.approx(own, rel=1e-15))
        ]


@pytest.mark.parametrize("units", [("pooled", "none"), ("none", "pooled"), ("pooled", "pooled")])
def test_a_table_standardised_from_the_sites_is_refused_under_the_row_unit(tmp_path, task_identity, units):
    files = _sites(tmp_path)
    over = (f"dataset.standardize_targets={units[0]}", f"dataset.standardize_inputs={units[1]}")
    job = _job(tmp_path, files, *OVER, *over, SECURE, *ROW, "privacy.dp_noise=0.01")
    grid = RecordingGrid(make_client_app(job, simulated_sites(3)), 3)
    with pytest.raises(ConfigError, match=r"^privacy.dp_unit=row needs the targets in public units") as err:
        serve(grid, job, RunRecorder(job, show_progress=False), show_progress=False, roster=simulated_sites(3).roster)
    assert "\n" not in str(err.value) and "dataset.standardize_targets=none" in str(err.value)
    assert grid.sent == []  # refused before any message
