"""scripts/same_results.py: a deployed run agrees with the in-process run only when both completed the
same job and ``G_cen`` and the final Gram agree to the tolerance."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from results_helpers import typed_results
from script_helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "same_results.py"


def _module():
    return load_script(SCRIPT)


def _results(final_gram, g_cen, **changes):
    base = typed_results({"gram": np.eye(2).tolist()}, {"gram": final_gram})
    return dataclasses.replace(base, targets={"g_cen": g_cen}, **changes)


def test_agreement_within_the_tolerance_only():
    compare = _module().compare
    reference = _results([[2.0, 0.0], [0.0, 1.0]], [[1.0, 0.5], [0.5, 1.0]])
    close = _results([[2.0 + 1e-12, 0.0], [0.0, 1.0]], [[1.0, 0.5], [0.5, 1.0]])
    ok, line = compare(close, reference, 1e-9)
    assert ok and "privacy clear, rounds [0, 1]" in line and "G_cen 0.0e+00" in line
    far_gram = _results([[2.0 + 1e-6, 0.0], [0.0, 1.0]], [[1.0, 0.5], [0.5, 1.0]])
    far_cen = _results([[2.0, 0.0], [0.0, 1.0]], [[1.0 + 1e-6, 0.5], [0.5, 1.0]])
    assert not compare(far_gram, reference, 1e-9)[0] and not compare(far_cen, reference, 1e-9)[0]


def test_a_failed_run_or_another_job_never_agrees():
    compare = _module().compare
    reference = _results([[2.0, 0.0], [0.0, 1.0]], [[1.0, 0.5], [0.5, 1.0]])
    failed = dataclasses.replace(reference, status="failed")
    assert compare(failed, reference, 1.0) == (False, "status: deployed failed, in process completed")
    secure = dataclasses.replace(reference, privacy={"mode": "secure"})
    ok, line = compare(secure, reference, 1.0)
    assert not ok and "privacy modes ('secure', 'clear')" in line
