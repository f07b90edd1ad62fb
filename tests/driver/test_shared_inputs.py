"""The simulation driver warns, naming the file, when a client's rows share inputs but not targets."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from fedhead.driver.checks import prepare_data
from fedhead.settings.config import compose_config, load_config


def _sites(folder: Path) -> list[Path]:
    rng = np.random.default_rng(3)
    out = []
    for i, n in enumerate((20, 24, 22)):
        x = rng.normal(size=(n, 3))
        if i == 1:
            x[5:9] = x[4]  # five rows of site_1 with the inputs of row 4, their targets differ
        y = x @ rng.normal(size=(3, 2)) + rng.normal(size=(n, 2))
        lines = ["f1,f2,f3,t1,t2"] + [",".join(repr(float(v)) for v in (*x[j], *y[j])) for j in range(n)]
        out.append(folder / f"site_{i}.csv")
        out[-1].write_text("\n".join(lines) + "\n")
    return out


def _job(tmp_path: Path, files: list[Path], model: str):
    cfg = load_config(
        compose_config(
            [
                "dataset=table",
                f"dataset.files=[{','.join(map(str, files))}]",
                "dataset.targets=[t1,t2]",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                f"model={model}",
                "procedure=proximal",
                "diagnose_only=true",
            ]
        )
    )
    return cfg.jobs(tmp_path / "out")[0]


def test_the_site_whose_rows_share_inputs_is_named(tmp_path, caplog):
    files = _sites(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fedhead.data.table"):
        prepare_data(_job(tmp_path, files, "resmlp_small"))
    said = [r.getMessage() for r in caplog.records if "share their inputs" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("site_1.csv: 5 of 24 training rows share their inputs"), said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fedhead.data.table"):
        prepare_data(_job(tmp_path, files, "free"))  # free features do not depend on the inputs
    assert "share their inputs" not in caplog.text
