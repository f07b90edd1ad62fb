"""benchmarks/bench_third_party_sites.py: the site files it writes and its pooled G_cen (no runs, no timing)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from script_helpers import load_script

from fedhead import ufm

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_third_party_sites.py"

# palmerpenguins 0.1.6's two files, in their exact formats (the first rows of each species, edited)
PENGUINS = """species,island,bill_length_mm,bill_depth_mm,flipper_length_mm,body_mass_g,sex,year
Adelie,Torgersen,39.1,18.7,181,3750,male,2007
Adelie,Torgersen,39.5,17.4,186,3800,female,2007
Adelie,Torgersen,NA,NA,NA,NA,NA,2007
Adelie,Dream,36.7,19.3,193,3450,NA,2007
Adelie,Dream,39.3,20.6,190,3650,male,2007
Gentoo,Biscoe,46.1,13.2,211,4500,female,2007
Gentoo,Biscoe,50,16.3,230,5700,male,2007
Gentoo,Biscoe,48.7,14.1,210,4450,female,2007
Gentoo,Biscoe,50,15.2,218,5700,male,2007
"""
RAW_HEADER = (
    "studyName,Sample Number,Species,Region,Island,Stage,Individual ID,Clutch Completion,Date Egg,"
    "Culmen Length (mm),Culmen Depth (mm),Flipper Length (mm),Body Mass (g),Sex,Delta 15 N (o/oo),"
    "Delta 13 C (o/oo),Comments"
)
ISOTOPES = [("NA", "NA"), ("8.94956", "-24.69454"), ("", ""), ("8.36821", "-25.33302"), ("8.76651", "-25.32426")]
ISOTOPES += [("7.993", "-25.5139"), ("8.14756", "-25.37746"), ("8.14705", "-25.46172"), ("8.38404", "-25.23453")]


def _bench():
    return load_script(SCRIPT)


def _write(folder: Path) -> tuple[Path, Path]:
    (folder / "penguins.csv").write_text(PENGUINS)
    lines = [RAW_HEADER]
    for i, (row, (n15, c13)) in enumerate(zip(list(csv.DictReader(PENGUINS.splitlines())), ISOTOPES)):
        lines.append(
            f'PAL0708,{i + 1},{row["species"]} Penguin,Anvers,{row["island"]},"Adult, 1 Egg Stage",N{i}A1,Yes,'
            f"2007-11-11,{row['bill_length_mm']},{row['bill_depth_mm']},{row['flipper_length_mm']},"
            f"{row['body_mass_g']},{row['sex'].upper()},{n15},{c13},"
        )
    (folder / "penguins-raw.csv").write_text("\n".join(lines) + "\n")
    return folder / "penguins.csv", folder / "penguins-raw.csv"


def test_help_works():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--sites" in out.stdout and "--inputs" in out.stdout


def test_site_files_hold_numeric_columns_with_missing_values_as_na(tmp_path):
    bench = _bench()
    path, raw = _write(tmp_path)
    files = bench.write_sites(path, "species", bench.TARGETS, tmp_path / "sites", raw)
    assert [f.name for f in files] == ["penguins_adelie.csv", "penguins_gentoo.csv"]
    rows = list(csv.reader(files[0].open()))
    assert rows[0] == [
        "flipper_length_mm",
        "body_mass_g",
        "bill_depth_mm",
        "bill_length_mm",
        "year",
        "d15n",
        "d13c",
        "male",
        "island_Biscoe",
        "island_Dream",
        "island_Torgersen",
    ]
    assert rows[1] == ["181", "3750", "18.7", "39.1", "2007", "NA", "NA", "1", "0", "0", "1"]
    assert rows[3] == ["NA", "NA", "NA", "NA", "2007", "NA", "NA", "NA", "0", "0", "1"]
    assert rows[4] == ["193", "3450", "19.3", "36.7", "2007", "8.36821", "-25.33302", "NA", "0", "1", "0"]
    by_island = bench.write_sites(path, "island", bench.TARGETS, tmp_path / "islands")
    assert [f.name for f in by_island] == ["penguins_biscoe.csv", "penguins_dream.csv", "penguins_torgersen.csv"]
    header = next(csv.reader(by_island[0].open()))
    assert "d15n" not in header and header[-2:] == ["species_Adelie", "species_Gentoo"]


def test_pooled_g_cen_is_the_one_of_the_complete_rows(tmp_path):
    bench = _bench()
    path, raw = _write(tmp_path)
    files = bench.write_sites(path, "species", bench.TARGETS, tmp_path / "sites", raw)
    g_cen, counts = bench.pooled_g_cen(files, 3)
    assert counts == [2, 4]  # three Adelie rows lack isotopes, measurements or sex
    y = np.array([[186, 3800, 17.4], [190, 3650, 20.6], [211, 4500, 13.2], [230, 5700, 16.3]])
    y = np.vstack([y, [[210, 4450, 14.1], [218, 5700, 15.2]]])
    z = (y - y.mean(axis=0)) / y.std(axis=0)
    expected = ufm.optimal_gram(z.T @ z / len(z), bench.LAMBDA, bench.LAMBDA)
    np.testing.assert_allclose(g_cen, expected, rtol=0, atol=1e-12)


def test_refuses_a_raw_file_of_other_penguins(tmp_path):
    bench = _bench()
    path, raw = _write(tmp_path)
    raw.write_text(raw.read_text().replace(",39.5,", ",39.6,"))
    with pytest.raises(SystemExit, match="its rows are not those of"):
        bench.write_sites(path, "species", bench.TARGETS, tmp_path / "sites", raw)
