"""Benchmark: what client-level differential privacy costs the correction (``privacy.dp_noise``).

``e_F(G_T, G_cen)`` of ``corrected_proximal`` after ``T`` rounds, against the privacy spent
(``epsilon`` at ``privacy.dp_delta``, flwr's RDP accountant, every release of the run: the
exchange and one per round; ``resources.evaluate_mse=false``, so no evaluation releases), from
no noise to strong noise, on three-site federations of per-site CSV files (``dataset=table``):

* ``tutorial``: docs/own-data.md's sites (``examples/own-data/make_sites.py --rows 100``: three
  sites of 100 rows, inputs ``f1..f5``, targets ``t1, t2``), ``model=free``'s ``P = 512`` features;
* ``tutorial-p16``: the same with ``P = 16`` (``model.feature_dim=16``): the noise a round adds
  to every entry of the ``C x P`` head enters ``G_T = W W^T`` about ``P`` times;
* ``penguins``: with ``--csv``, the Palmer penguins benchmark's sites
  (``benchmarks/bench_third_party_sites.py``'s ``write_sites``: one file per species, 139 / 67 /
  118 complete rows, three targets, the isotopes among the inputs), in public units: every
  measured column shifted and scaled by a fixed round value (``PUBLIC_UNITS``, chosen without
  looking at the rows, as a site could publish them);
* ``penguins-raw``: the same files as that benchmark writes them (grams, millimetres, years).

Each run goes through the federation as in a deployment: real ClientApps
(``fedhead.clients.make_client_app``) behind an in-process grid (no Ray), the server's
``serve`` and recorder, ``model=free`` (free features: each site reaches its local optimum in a
few hundred epochs), ``procedure=corrected_proximal``, ``--rounds`` rounds. Per setting:

1. a clear run (``privacy.mode=clear``): the true ``G_cen`` (its ``targets.g_cen``), the
   public cap ``K = privacy.dp_max_rows`` (the largest site's rows) and the clips
   ``Delta = privacy.dp_clip`` (the exchange) and ``privacy.dp_head_clip`` (the rounds' heads): each
   1.1 times the largest L2 norm of a site's per-row vector of that kind in
   the clear replies (the exchange's raw statistics ``[1, mu, Sigma, mu mu^T, x_mean,
   x_var + x_mean^2]`` and every round's head ``[W, b, 1]``), rounded up to two digits, so
   clipping does not bind without noise. (Delta is chosen here from the honest data, as a
   site's operator would from its own; a deployment must fix it before it sees any row.)
2. one secure run without noise (``privacy.mode=secure``, ``dp_noise=0``: the horizontal
   reference), then ``--repeats`` secure runs per noise multiplier ``z`` of ``--noise``
   (``dp_noise=z``, ``dp_clip``, ``dp_head_clip``, ``dp_max_rows=K``). The sites draw their noise from the
   operating system's entropy, so repeats differ; a run the noise breaks (the secure server
   refuses a noised sum: a count or a variance <= 0 in the exchange, a head beyond
   ``trust.max_abs``) is a point too.

Each point: ``epsilon`` (results.json ``privacy.dp.epsilon``), ``e_F(G_T, G_cen)`` against the
true ``G_cen`` and against the noised ``G_cen`` the run computed (its own ``targets.g_cen``,
what its log and results.json call ``e_f_cen``), ``e_F`` of the noised ``G_cen`` itself, and how
many sites reported reaching their local optimum in the last round. Written to
``OUT/points.csv`` and ``OUT/points.json`` (with the settings), the figure to ``--figure``
(default ``OUT/privacy_cost.png``): x = epsilon (log); left, y = e_F(G_T, G_cen) to the true
G_cen (log), median and interquartile band per setting where most runs finished, the no-noise
secure value as a dotted horizontal line, and above it the runs the noise broke; right, e_F of
the run's noised G_cen to the true one. The table of medians is printed (the README's).
``--replot`` draws the figure and table again from ``OUT/points.json``.

Usage::

    python benchmarks/bench_privacy_cost.py --quick                     # the tutorial's sites, 20 s
    python benchmarks/bench_privacy_cost.py --csv /tmp/pp/palmerpenguins/data/penguins.csv \\
        --out /tmp/privacy_cost --figure docs/privacy_cost.png          # the README's figure

(``penguins.csv``: ``pip download --no-deps palmerpenguins==0.1.6`` and unzip, see
bench_third_party_sites.py.) Measured: README, "What differential privacy costs the correction".
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402

from fedhead.analysis.metrics import relative_error  # noqa: E402
from fedhead.federation import protocol  # noqa: E402
from fedhead.federation import secure_records as sr  # noqa: E402
from fedhead.federation.privacy_noise import privacy_spent  # noqa: E402
from fedhead.results.io import atomic_open  # noqa: E402
from fedhead.strategies.secure import SITES_AT_OPTIMUM, SITES_SUMMED  # noqa: E402

#: The noise multipliers z of a full run (0: secure, no noise).
NOISE = (0.0, 0.0001, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
QUICK_NOISE = (0.0, 0.001)
SETTINGS = ("tutorial", "tutorial-p16", "penguins", "penguins-raw")
DELTA = 1e-5  # privacy.dp_delta (conf default)
CLIP_MARGIN = 1.1
TUTORIAL_ROWS = 100  # docs/own-data.md: make_sites.py --rows 100
#: (offset, scale) of each penguin column in public units, ``(value - offset) / scale``: round
#: values from the species' field-guide sizes, not from the rows. The runs standardise every column
#: with its pooled mean and std, so G_cen and training are the same as in the benchmark's units.
PUBLIC_UNITS = {
    "flipper_length_mm": (200.0, 10.0),
    "body_mass_g": (4000.0, 1000.0),
    "bill_depth_mm": (17.0, 2.0),
    "bill_length_mm": (44.0, 5.0),
    "year": (2008.0, 1.0),
    "d15n": (9.0, 1.0),
    "d13c": (-26.0, 1.0),
}
#: fedhead-run overrides of every run (the settings' files and targets are added).
BASE = (
    "dataset=table",
    "dataset.missing=drop",
    "model=free",
    "procedure=corrected_proximal",
    "local_tol=1e-6",
    "resources.evaluate_mse=false",
    "output.tensorboard=false",
    "output.figures=false",
)
COLUMNS = (
    "setting",
    "noise",
    "repeat",
    "status",
    "epsilon",
    "releases",
    "e_f_true",
    "e_f_recorded",
    "g_cen_error",
    "sites_at_optimum",
    "sites",
    "seconds",
)


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LocalGrid(Grid):
    """The sites' real ClientApp in this process, one Context (node state) per node, no Ray: every
    message is answered at once, a raising handler answers with an error (as flwr does)."""

    def __init__(self, client_app, num_nodes: int):
        self.app = client_app
        self.contexts = {
            1000 + i: Context(
                run_id=1,
                node_id=1000 + i,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config={},
            )
            for i in range(num_nodes)
        }
        self.replies: list[Message] = []
        self._pending: dict[str, Message] = {}
        self._sent = 0

    def set_run(self, run_id: int) -> None:
        pass

    @property
    def run(self):  # pragma: no cover - not used by serve
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = f"msg-{self._sent}"
            self._sent += 1
            try:
                reply = self.app(m, self.contexts[m.metadata.dst_node_id])
            except Exception as exc:  # noqa: BLE001 - as flwr: a raising ClientApp sends an error reply
                reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=m)
            self.replies.append(reply)
            self._pending[m.metadata.message_id] = reply
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._pending.pop(i) for i in list(message_ids) if i in self._pending]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return list(self.pull_messages(list(self.push_messages(messages))))


@dataclass
class Setting:
    """One federation of the figure: its site files and targets, and what its clear run gave."""

    name: str
    label: str
    files: list[Path]
    targets: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    rows: list[int] = field(default_factory=list)
    max_rows: int = 0
    clip: float = 0.0
    head_clip: float = 0.0
    norms: dict[str, float] = field(default_factory=dict)
    g_cen: np.ndarray | None = None


def _overrides(setting: Setting, rounds: int, local_epochs: int, extra: Sequence[str]) -> list[str]:
    return [
        *BASE,
        f"dataset.files=[{','.join(str(f) for f in setting.files)}]",
        f"dataset.targets=[{','.join(setting.targets)}]",
        f"rounds={rounds}",
        f"local_epochs={local_epochs}",
        *setting.overrides,
        *extra,
    ]


def run_once(overrides: Sequence[str], out: Path):
    """One federation in process; ``(results, grid)``."""
    from fedhead.clients import make_client_app
    from fedhead.clients.identity import SimulatedSites
    from fedhead.driver.recorder import RunRecorder
    from fedhead.driver.server import serve
    from fedhead.settings.config import compose_config, load_config

    job = load_config(compose_config(list(overrides))).jobs(out)[0]
    sites = SimulatedSites.make(job.settings.num_clients)  # the simulation's own roster (secure mode)
    grid = LocalGrid(make_client_app(job, sites), job.settings.num_clients)
    recorder = RunRecorder(job, show_progress=False)
    serve(grid, job, recorder, show_progress=False, roster=sites.roster)
    return recorder.finish("completed"), grid


def per_row_norms(replies: Iterable[Message]) -> tuple[list[int], dict[str, float]]:
    """The sites' training rows (exchange replies) and the largest L2 norm of a site's per-row
    vector, ``x / N_m``, of each kind of clear reply: what a secure site would clip."""
    rows: list[int] = []
    norms = {"exchange": 0.0, "head": 0.0}
    for msg in replies:
        if msg.has_error():
            continue
        arrays, metrics = msg.content.array_records, msg.content.metric_records.get(protocol.METRICS, {})
        n = _number(metrics.get(protocol.NUM_EXAMPLES))
        if n <= 0:
            continue
        if protocol.SITE_STATS in arrays:
            st = arrays[protocol.SITE_STATS]
            vector = sr.statistics_vector(
                n,
                st[protocol.Y_MEAN].numpy(),
                st[protocol.Y_COV].numpy(),
                st[protocol.X_MEAN].numpy(),
                st[protocol.X_VAR].numpy(),
            )
            rows.append(int(n))
            norms["exchange"] = max(norms["exchange"], float(np.linalg.norm(vector / n)))
        elif protocol.HEAD in arrays:
            weight, bias = protocol.read_head(arrays[protocol.HEAD])
            vector = sr.head_vector(n, weight, bias)
            norms["head"] = max(norms["head"], float(np.linalg.norm(vector / n)))
    return rows, norms


def _number(value: object) -> float:
    """``value`` as a float (NaN when it is not a number)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def round_up(x: float, digits: int = 2) -> float:
    """``x`` rounded up to ``digits`` significant digits."""
    power = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return math.ceil(x / power - 1e-9) * power


def calibrate(setting: Setting, out: Path, rounds: int, local_epochs: int, extra: Sequence[str]) -> None:
    """The clear run: the true G_cen, K and Delta of ``setting``."""
    results, grid = run_once(_overrides(setting, rounds, local_epochs, extra), out)
    setting.g_cen = np.asarray((results.targets or {})["g_cen"], dtype=np.float64)
    setting.rows, setting.norms = per_row_norms(grid.replies)
    setting.max_rows = max(setting.rows)
    setting.clip = round_up(CLIP_MARGIN * setting.norms["exchange"])
    setting.head_clip = round_up(CLIP_MARGIN * setting.norms["head"])


def measure(
    setting: Setting, noise: float, repeat: int, out: Path, rounds: int, local_epochs: int, extra: Sequence[str]
) -> dict:
    """One secure run at noise multiplier ``noise``: its point (a dict of ``COLUMNS``)."""
    dp = [
        f"privacy.dp_noise={noise}",
        f"privacy.dp_clip={setting.clip}",
        f"privacy.dp_head_clip={setting.head_clip}",
        f"privacy.dp_max_rows={setting.max_rows}",
    ]
    overrides = _overrides(setting, rounds, local_epochs, ["privacy.mode=secure", f"privacy.dp_delta={DELTA}", *dp])
    point: dict = dict.fromkeys(COLUMNS)
    point.update(setting=setting.name, noise=noise, repeat=repeat, releases=1 + rounds)
    point["epsilon"] = privacy_spent(noise, 1 + rounds, len(setting.files), DELTA).epsilon
    t0 = time.perf_counter()
    try:
        results, _ = run_once([*overrides, *extra], out)
    except Exception as exc:  # noqa: BLE001 - a run the noise breaks is a point too
        point.update(status=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    else:
        last = results.rounds[-1]
        assert setting.g_cen is not None
        dp_record = (results.privacy or {}).get("dp") or {}
        if dp_record:
            point.update(epsilon=float(dp_record["epsilon"]), releases=int(dp_record["releases"]))
        point.update(
            status="ok",
            e_f_true=float(relative_error(np.asarray(last.gram), setting.g_cen)),
            e_f_recorded=_number(last.e_f_cen),
            g_cen_error=float(relative_error(np.asarray((results.targets or {})["g_cen"]), setting.g_cen)),
            sites_at_optimum=int(_number(last.extra.get(SITES_AT_OPTIMUM, -1))),
            sites=int(_number(last.extra.get(SITES_SUMMED, -1))),
        )
    point["seconds"] = round(time.perf_counter() - t0, 2)
    return point


# ------------------------------------------------------------------------------ the settings' files
def tutorial_sites(folder: Path, rows: int) -> list[Setting]:
    """docs/own-data.md's three sites (make_sites.py, ``rows`` rows each), with ``model=free``'s
    ``P = 512`` features and with ``P = 16`` (``model.feature_dim=16``)."""
    make_sites = _load(REPO / "examples" / "own-data" / "make_sites.py", "make_sites")
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, name in enumerate(("site_a", "site_b", "site_c")):
        path = folder / f"{name}.csv"
        with path.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["f1", "f2", "f3", "f4", "f5", "t1", "t2"])
            writer.writerows(make_sites.site_rows(rows, i).round(6).tolist())
        files.append(path)
    label = f"tutorial sites (3 x {rows} rows)"
    return [
        Setting("tutorial", f"{label}, P=512", files, ("t1", "t2")),
        Setting("tutorial-p16", f"{label}, P=16", files, ("t1", "t2"), ("model.feature_dim=16",)),
    ]


def in_public_units(files: Sequence[Path], folder: Path) -> list[Path]:
    """The penguin site files with every column of ``PUBLIC_UNITS`` as ``(value - offset) / scale``."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for f in files:
        with open(f, newline="") as fh:
            rows = list(csv.reader(fh))
        header = rows[0]
        units = [PUBLIC_UNITS.get(c) for c in header]
        lines = [header]
        for r in rows[1:]:
            lines.append([v if u is None or v == "NA" else f"{(float(v) - u[0]) / u[1]:.6g}" for v, u in zip(r, units)])
        path = folder / f.name
        with atomic_open(path) as fh:
            fh.write("".join(",".join(line) + "\n" for line in lines).encode())
        out.append(path)
    return out


def penguin_sites(csv_path: Path, folder: Path) -> list[Setting]:
    """The Palmer penguins benchmark's species sites, in public units and as that benchmark writes them."""
    bench = _load(REPO / "benchmarks" / "bench_third_party_sites.py", "bench_third_party_sites")
    raw = csv_path.with_name("penguins-raw.csv")
    files = bench.write_sites(csv_path, "species", bench.TARGETS, folder / "raw", raw if raw.is_file() else None)
    public = in_public_units(files, folder / "public")
    return [
        Setting("penguins", "Palmer penguins, public units", public, tuple(bench.TARGETS)),
        Setting("penguins-raw", "Palmer penguins, raw units", files, tuple(bench.TARGETS)),
    ]


# ------------------------------------------------------------------------------ output
def write_points(points: list[dict], settings: list[Setting], args: argparse.Namespace, out: Path) -> None:
    with atomic_open(out / "points.csv") as fh:
        lines = [",".join(COLUMNS)]
        lines += [",".join("" if p[c] is None else str(p[c]) for c in COLUMNS) for p in points]
        fh.write(("\n".join(lines) + "\n").encode())
    meta = {
        "procedure": "corrected_proximal",
        "model": "free",
        "rounds": args.rounds,
        "local_epochs": args.local_epochs,
        "local_tol": 1e-6,
        "evaluate_mse": False,
        "releases": 1 + args.rounds,
        "dp_delta": DELTA,
        "noise": list(args.noise),
        "repeats": args.repeats,
        "extra": list(args.extra),
        "settings": [
            {
                "name": s.name,
                "label": s.label,
                "files": [f.name for f in s.files],
                "targets": list(s.targets),
                "rows": s.rows,
                "dp_max_rows": s.max_rows,
                "dp_clip": s.clip,
                "dp_head_clip": s.head_clip,
                "per_row_norms": s.norms,
                "g_cen_true": None if s.g_cen is None else s.g_cen.tolist(),
            }
            for s in settings
        ],
        "points": [{k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in p.items()} for p in points],
    }
    with atomic_open(out / "points.json") as fh:
        fh.write(json.dumps(meta, indent=1).encode())


def _by_noise(points: list[dict], setting: str, key: str, noises: Sequence[float]) -> tuple[np.ndarray, list]:
    """``(runs, len(noises))`` of ``key`` over the finished runs of ``setting`` where most of the runs
    at that noise finished (NaN elsewhere), and the ``(j, value)`` of finished runs outside those."""
    mine = [p for p in points if p["setting"] == setting]
    runs = max((sum(p["noise"] == z for p in mine) for z in noises), default=1)
    arr, lone = np.full((max(runs, 1), len(noises)), np.nan), []
    for j, z in enumerate(noises):
        at = [p for p in mine if p["noise"] == z]
        vals = [p[key] for p in at if p["status"] == "ok"]
        if 2 * len(vals) > len(at):
            arr[: len(vals), j] = vals
        else:
            lone += [(j, v) for v in vals]
    return arr, lone


def figure(points: list[dict], settings: list[Setting], path: Path) -> Path:
    """Left: x = epsilon (log), y = e_F(G_T, G_cen) against the true G_cen (log), the median and
    interquartile band over the finished repeats per setting (where most finished; a lone finished
    run elsewhere as a small marker), the no-noise secure run as a dotted line; above it, the runs
    the noise broke. Right: e_F of the noised G_cen the run computed, against the true one."""
    import matplotlib

    matplotlib.use("Agg")
    from fedhead.plotting import save_figure
    from fedhead.plotting.canvas import blank_figure
    from fedhead.plotting.curves import plot_error_curves

    colors = ["#d62728", "#ff7f0e", "#1f77b4", "#7f7f7f"]
    noises = sorted({p["noise"] for p in points if p["noise"] > 0}, reverse=True)
    eps = [next(p["epsilon"] for p in points if p["noise"] == z) for z in noises]
    fig = blank_figure(figsize=(11.5, 6.4))
    grid = fig.add_gridspec(2, 2, height_ratios=(1, 4.2), width_ratios=(3, 2), hspace=0.08, wspace=0.25)
    strip = fig.add_subplot(grid[0, 0])
    main = fig.add_subplot(grid[1, 0], sharex=strip)
    side = fig.add_subplot(grid[1, 1])
    panels = (
        (main, "e_f_true", r"$e_F(G_T, G_{\mathrm{cen}})$, true $G_{\mathrm{cen}}$ (the clear run's)"),
        (side, "g_cen_error", r"$e_F(\tilde G_{\mathrm{cen}}, G_{\mathrm{cen}})$: the run's noised $G_{\mathrm{cen}}$"),
    )
    for ax, key, ylabel in panels:
        curves, styles = {}, {}
        for i, s in enumerate(settings):
            color = colors[i % len(colors)]
            arr, lone = _by_noise(points, s.name, key, noises)
            label = f"{s.label}: K={s.max_rows}, " + rf"$\Delta$={s.clip:g} / {s.head_clip:g} (heads)"
            curves[label], styles[label] = arr, {"color": color}
            if lone:
                ax.plot([eps[j] for j, _ in lone], [v for _, v in lone], "o", color=color, ms=3.5, mfc="none")
            clear = [p[key] for p in points if p["setting"] == s.name and p["noise"] == 0 and p["status"] == "ok"]
            if clear and key == "e_f_true":
                ax.axhline(float(np.median(clear)), color=color, linestyle=":", linewidth=1.2)
        plot_error_curves(
            ax,
            eps,
            curves,
            styles=styles,
            logx=True,
            xlabel=r"$\varepsilon$ ($\delta=10^{-5}$)",
            ylabel=ylabel,
            legend=False,
        )
        shown = [p[key] for p in points if p["status"] == "ok" and (p["noise"] > 0 or key == "e_f_true")]
        if not any(isinstance(v, float) and 0 < v < math.inf for v in shown):  # nothing to draw on a log axis
            ax.set_ylim(1e-3, 1.0)
            ax.text(0.5, 0.5, "no finished run", transform=ax.transAxes, ha="center")
    for i, s in enumerate(settings):  # the runs the noise broke (refused by the server), per setting
        for j, z in enumerate(noises):
            at = [p for p in points if p["setting"] == s.name and p["noise"] == z]
            refused = sum(p["status"] != "ok" for p in at)
            if refused:
                strip.plot([eps[j]], [i], "x", color=colors[i % len(colors)], ms=5 + 2 * refused)
                strip.annotate(
                    f"{refused}/{len(at)}",
                    (eps[j], i),
                    xytext=(7, -3),
                    textcoords="offset points",
                    fontsize=6.5,
                    color=colors[i % len(colors)],
                )
    strip.set_ylim(len(settings) - 0.4, -0.6)
    strip.set_yticks(range(len(settings)), [s.name for s in settings], fontsize=7)
    strip.set_title("runs refused by the server (noised exchange: count <= 0 or a variance <= 0)", fontsize=8)
    strip.tick_params(axis="x", labelbottom=False)
    strip.grid(True, axis="x", alpha=0.3)
    main.plot([], [], color="k", linestyle=":", label="secure, no noise (each setting)")
    main.plot([], [], "o", color="k", ms=3.5, mfc="none", label="one finished run where most were refused")
    handles, labels = main.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.62, 0.93), fontsize=7.5, frameon=False)
    fig.text(
        0.625,
        0.99,
        "corrected_proximal, 3 sites, T = 2 rounds, evaluate_mse=false (3 releases):\n"
        "median and interquartile band of 3 runs per noise multiplier",
        fontsize=8,
        va="top",
    )
    refs = [p["e_f_true"] for p in points if p["noise"] == 0 and p["status"] == "ok"]
    if refs:
        main.annotate(
            f"secure, no noise: {min(refs):.1e} - {max(refs):.1e}",
            (0.02, min(refs)),
            xytext=(0, 4),
            textcoords="offset points",
            xycoords=("axes fraction", "data"),
            fontsize=7,
        )
    fig.subplots_adjust(left=0.07, right=0.98, top=0.93, bottom=0.09)
    return save_figure(fig, path)


def table(points: list[dict], settings: list[Setting]) -> str:
    """Median (min - max) of e_F (true and recorded) per setting and noise; the README's table."""
    out = ["| setting | z | epsilon | e_F to true G_cen | e_F to noised G_cen | e_F(noised G_cen, G_cen) | runs ok |"]
    out.append("|---|---|---|---|---|---|---|")

    def span(vals: list[float]) -> str:
        if not vals:
            return "-"
        mid = float(np.median(vals))
        return f"{mid:.2g}" if len(vals) == 1 else f"{mid:.2g} ({min(vals):.2g}-{max(vals):.2g})"

    for s in settings:
        for z in sorted({p["noise"] for p in points if p["setting"] == s.name}):
            pts = [p for p in points if p["setting"] == s.name and p["noise"] == z]
            ok = [p for p in pts if p["status"] == "ok"]
            eps = pts[0]["epsilon"]
            cells = [span([p[k] for p in ok]) for k in ("e_f_true", "e_f_recorded", "g_cen_error")]
            out.append(
                f"| {s.name} | {z:g} | {'inf' if math.isinf(eps) else f'{eps:.3g}'} | "
                + " | ".join(cells)
                + f" | {len(ok)}/{len(pts)} |"
            )
    return "\n".join(out)


def replot(out: Path, fig_path: Path) -> int:
    """The figure and the table again, from ``out/points.json``."""
    meta = json.loads((out / "points.json").read_text())
    settings = [
        Setting(
            d["name"],
            d["label"],
            [Path(f) for f in d["files"]],
            tuple(d["targets"]),
            (),
            d["rows"],
            d["dp_max_rows"],
            d["dp_clip"],
            d.get("dp_head_clip", d["dp_clip"]),
            d["per_row_norms"],
        )
        for d in meta["settings"]
    ]
    points = [{**p, "epsilon": math.inf if p["epsilon"] is None else p["epsilon"]} for p in meta["points"]]
    path = figure(points, settings, fig_path)
    print(f"{table(points, settings)}\n\nwrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=None, help="palmerpenguins' data/penguins.csv (default: no penguins)")
    ap.add_argument("--out", type=Path, default=None, help="folder for points, runs, figure (default: temporary)")
    ap.add_argument("--figure", type=Path, default=None, help="the PNG (default OUT/privacy_cost.png)")
    ap.add_argument("--noise", type=float, nargs="+", default=None, help=f"noise multipliers z (default {NOISE})")
    ap.add_argument("--repeats", type=int, default=3, help="secure runs per noisy z (default 3)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds T (default 2)")
    ap.add_argument("--local-epochs", type=int, default=300, help="local epochs per round, cap (default 300)")
    ap.add_argument("--rows", type=int, default=TUTORIAL_ROWS, help="rows per tutorial site (default 100)")
    ap.add_argument("--settings", nargs="+", default=None, help=f"only these settings (default all): {SETTINGS}")
    ap.add_argument("--quick", action="store_true", help="tutorial, z in {0, 0.001}, 1 repeat, 1 round, 100 epochs")
    ap.add_argument("--replot", action="store_true", help="redraw the figure and table from OUT/points.json")
    ap.add_argument("--extra", nargs="*", default=[], help="further fedhead-run overrides for every run")
    args = ap.parse_args(argv)
    if args.quick:
        args.csv, args.repeats, args.rounds, args.local_epochs = None, 1, 1, 100
        args.settings = args.settings or ["tutorial"]
        args.noise = args.noise or list(QUICK_NOISE)
    args.noise = sorted(set(args.noise if args.noise is not None else NOISE))
    if args.csv is not None and not args.csv.is_file():
        ap.error(f"--csv {args.csv}: no such file (pip download palmerpenguins; see bench_third_party_sites.py)")
    if args.repeats < 1 or args.rounds < 1 or any(z < 0 for z in args.noise):
        ap.error("--repeats and --rounds must be >= 1 and every --noise >= 0")
    warnings.filterwarnings("ignore")
    if args.replot:
        if args.out is None or not (args.out / "points.json").is_file():
            ap.error("--replot needs --out with the points.json of an earlier run")
        return replot(args.out, args.figure or args.out / "privacy_cost.png")
    out = args.out or Path(tempfile.mkdtemp(prefix="fedhead-privacy-cost-"))
    out.mkdir(parents=True, exist_ok=True)
    fig_path = args.figure or out / "privacy_cost.png"

    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # the ServerApp's messages
    logging.getLogger("flwr").setLevel(logging.ERROR)
    logging.getLogger("fedhead").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    settings = tutorial_sites(out / "sites" / "tutorial", args.rows)
    if args.csv is not None:
        settings += penguin_sites(args.csv, out / "sites" / "penguins")
    if args.settings:
        unknown = set(args.settings) - {s.name for s in settings}
        if unknown:
            ap.error(f"--settings: unknown or unavailable {sorted(unknown)} (known: {[s.name for s in settings]})")
        settings = [s for s in settings if s.name in args.settings]
    print(f"cpus {os.cpu_count()}, load {os.getloadavg()[0]:.1f}; T={args.rounds}, releases {1 + args.rounds}")
    points: list[dict] = []
    t0 = time.perf_counter()
    for s in settings:
        calibrate(s, out / "runs" / s.name / "clear", args.rounds, args.local_epochs, args.extra)
        norms = ", ".join(f"{k} {v:.3g}" for k, v in s.norms.items())
        print(
            f"{s.name}: rows {s.rows}, K={s.max_rows}, per-row norms {norms} -> "
            f"Delta={s.clip:g}, heads {s.head_clip:g}",
            flush=True,
        )
        for z in args.noise:
            for r in range(1 if z == 0 else args.repeats):
                p = measure(s, z, r, out / "runs" / s.name / f"z{z:g}-{r}", args.rounds, args.local_epochs, args.extra)
                points.append(p)
                print(
                    f"  z={z:<6g} eps={p['epsilon']:<10.4g} e_F true {p['e_f_true'] or float('nan'):.3g}, "
                    f"recorded {p['e_f_recorded'] or float('nan'):.3g}, {p['status'][:90]} ({p['seconds']} s)",
                    flush=True,
                )
    write_points(points, settings, args, out)
    path = figure(points, settings, fig_path)
    print(f"\n{table(points, settings)}\n")
    print(f"wrote {out / 'points.csv'}, {out / 'points.json'}, {path} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
