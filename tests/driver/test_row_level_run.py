"""``privacy.dp_unit=row`` end to end, in process (real ClientApps, no Ray): the sites send row-clipped,
noised statistics into the exchange's secure sum; the server's ``G_cen`` is the clear one's within the
predicted noise, and the run's epsilon composes the row-level exchange with the later client-level sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_secure_mode import SECURE, _hopper_job, _rel, _run

from fedhead.federation import protocol
from fedhead.federation import row_privacy as rp
from fedhead.federation import secure_records as sr

ROW = ("privacy.dp_unit=row", "privacy.dp_max_rows=60", "privacy.dp_clip=40", "privacy.dp_head_clip=10")
OVER = ("procedure=corrected_proximal", "rounds=1", "privacy.dp_delta=1e-5")


def test_row_level_exchange_gives_g_cen_within_the_predicted_noise(tmp_path, task_identity):
    clear, _ = _run(_hopper_job(tmp_path / "clear", *OVER))
    z, rows = 0.01, 240
    noisy, grid = _run(_hopper_job(tmp_path / "noisy", SECURE, *OVER, *ROW, f"privacy.dp_noise={z}"))
    sigma = np.asarray(clear.moments["sigma_cen"])
    dim = sigma.shape[0]
    # the covariance's noise per svec entry of the second moments: drawn_noise * C^2 / sqrt(w) / N (C = 40 clips
    # no standardised row here, so the noise is the only error)
    entry = rp.drawn_noise(z, dim, 40.0) * rp.noise_scales(dim, 40.0)[1 + dim] / rows
    predicted = entry * math.sqrt(dim * (dim + 1) / 2) / float(np.linalg.norm(sigma))  # relative RMS e_F(cov)
    err = _rel(noisy.targets["g_cen"], clear.targets["g_cen"])
    assert predicted / 50 < err < 4 * predicted, (err, predicted)
    masks = [m for m in grid.sent if (m.content.config_records.get("config") or {}).get(sr.STEP) == sr.MASK]
    assert masks  # the exchange went through the secure sum's steps
    assert all(protocol.ROW_RELEASE not in r.content.array_records for r in grid.replies)  # never sent as is
    spent = noisy.privacy["dp"]
    assert spent["releases"] == 3  # the exchange, the round, its evaluation
    assert spent["epsilon"] == pytest.approx(rp.row_privacy_spent(z, [z, z], rows, 1e-5), rel=1e-9)
