"""``fedhead-data``: prepare or generate a data set into the cache folder and report it.

Hydra command with the same ``dataset`` group (``conf/dataset/``) and overrides as
``fedhead-run``::

    fedhead-data dataset=hopper
    fedhead-data dataset=beijing dataset.root=/data/beijing num_clients=4
    fedhead-data dataset=dsprites figure=dsprites.png

Prints the input/target shapes, client sizes, target moments (docs/theory.md §3) and fully active margins,
and for image data sets writes a PNG grid of sample images titled with their client and targets
(original values with units, [`fedhead.data.units`][fedhead.data.units]) next to the run: ``figure=PATH``, else
``out_dir`` / the Hydra output folder, as ``<dataset>-samples.png``.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhead.analysis.regime import MarginReport, client_margins
from fedhead.data.base import FederatedData
from fedhead.data.config import DatasetConfig
from fedhead.data.pipeline import cache_file
from fedhead.data.registry import coerce_config, load_federated
from fedhead.data.units import format_target, target_units
from fedhead.results.io import write_bytes_atomic

__all__ = ["main", "prepare", "PrepareResult", "sample_grid", "sample_grid_figure"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepareResult:
    """What [`prepare`][fedhead.cli.data.prepare] produced: the data, its cache file, margins and the figure path."""

    data: FederatedData
    cache: Path
    margins: MarginReport
    figure: Path | None


def sample_grid_figure(fed: FederatedData, path: str | Path, n: int = 16) -> Path:
    """Write a PNG grid of up to ``n`` training images (taken round-robin over the clients),
    each titled with its client and its targets in original units ([`sample_grid`][fedhead.cli.data.sample_grid])."""
    # imported when the command runs, not at start-up (--help stays fast)
    import matplotlib.pyplot as plt

    fig = sample_grid(fed, n)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return write_bytes_atomic(path, buf.getvalue())


def sample_grid(fed: FederatedData, n: int = 16):
    """The matplotlib Figure of [`sample_grid_figure`][fedhead.cli.data.sample_grid_figure]: titles
    ``name = value unit`` per target, a suptitle with the image size in pixels and, for CIFAR-geo, the source images."""
    # imported when the command runs, not at start-up (--help stays fast)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not fed.is_image:
        raise ValueError(f"{fed.name} is not an image data set")
    units = target_units(fed.name, fed.target_names)
    scales = np.broadcast_to(np.asarray(fed.target_scale, dtype=np.float64), (len(fed.target_names),))
    picks: list[tuple[int, int]] = []
    i = 0
    while len(picks) < n and any(i < c.n_train for c in fed.clients):
        for m, c in enumerate(fed.clients):
            if i < c.n_train and len(picks) < n:
                picks.append((m, i))
        i += 1
    cols = int(np.ceil(np.sqrt(len(picks))))
    rows = int(np.ceil(len(picks) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols, 2.9 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, (m, i) in zip(axes.ravel(), picks):
        img = fed.clients[m].x_train[i].numpy()
        y = fed.clients[m].y_train[i].numpy().astype(np.float64) * fed.target_scale + fed.target_offset
        if img.shape[0] == 1:
            ax.imshow(img[0], cmap="gray", vmin=0, vmax=255)
        else:
            ax.imshow(np.transpose(img, (1, 2, 0)))
        label = "\n".join(
            f"{n} = {format_target(v, u, scale=sc)}" for n, v, u, sc in zip(fed.target_names, y, units, scales)
        )
        ax.set_title(f"client {m}\n{label}", fontsize=7)
    fig.suptitle(f"{fed.name}: training samples, targets in original units\n{_image_note(fed)}", fontsize=9)
    fig.tight_layout()
    return fig


def _image_note(fed: FederatedData) -> str:
    """``"images 40 x 40 pixels, RGB; source images: Fashion-MNIST"``-style line for a grid title."""
    shape = tuple(int(d) for d in fed.input_shape)
    ch, h, w = (shape + (1, 1, 1))[:3] if len(shape) == 3 else (1, *shape[-2:])
    note = f"images {h} x {w} pixels, {'grey' if ch == 1 else 'RGB'}"
    src = str(getattr(fed, "source", "") or "").lower()
    if fed.name == "cifar_geo":
        origin = "Fashion-MNIST" if "fashion" in src else "CIFAR-10" if "cifar" in src else "source"
        note += f"; {origin} images shifted and zoomed into the frame"
    return note


def _report(res: PrepareResult) -> str:
    fed = res.data
    mom = fed.moments()
    out = [
        f"data set      {fed.name}",
        f"source        {fed.source}",
        f"cache         {res.cache}",
        f"inputs        {fed.input_shape} ({'uint8 images' if fed.is_image else 'float32'})",
        f"targets       {', '.join(fed.target_names)}",
        f"target offset {np.array2string(fed.target_offset, precision=4)}",
        f"target scale  {np.array2string(fed.target_scale, precision=4)}",
        f"clients       {fed.n_clients}",
    ]
    for m, c in enumerate(fed.clients):
        nt = 0 if c.y_test is None else int(c.y_test.shape[0])
        out.append(f"  client {m}: train x {tuple(c.x_train.shape)} y {tuple(c.y_train.shape)}, test {nt}")
    with np.printoptions(precision=4, suppress=True, linewidth=120):
        out.append("target moments (training targets, units used by the run; docs/theory.md §3)")
        for m in range(mom.n_clients):
            ev = np.linalg.eigvalsh(mom.covs[m])
            out.append(f"  client {m}: p={mom.weights[m]:.4f} mu={mom.means[m]} eig(Sigma)={ev}")
        out.append(f"  mu_g = {mom.mean_global}")
        for label, mat in (
            ("Sigma_within", mom.sigma_within),
            ("Sigma_mu", mom.sigma_mu),
            ("Sigma_cen", mom.sigma_cen),
        ):
            out.append(f"  {label} =\n{mat}")
    out.append(res.margins.table())
    if res.figure is not None:
        out.append(f"sample grid   {res.figure}")
    return "\n".join(out)


def prepare(
    cfg: DatasetConfig,
    *,
    num_clients: int | None = None,
    seed: int | None = None,
    lambda_h: float = 0.01,
    lambda_w: float = 0.01,
    figure: str | Path | None = None,
    figure_samples: int = 16,
    out_dir: str | Path | None = None,
) -> PrepareResult:
    """Prepare (load or generate + cache) a data set, compute its margins and draw its samples.

    The sample grid goes to ``figure`` when given, else to ``out_dir/<name>-samples.png``
    (``out_dir`` defaults to the working directory, which is the Hydra output folder of
    ``fedhead-data``), never into the cache folder.
    """
    cfg = coerce_config(cfg)
    fed = load_federated(cfg, num_clients=num_clients, seed=seed)
    if seed is not None:
        cfg = dataclasses.replace(cfg, seed=int(seed))
    path = cache_file(cfg)
    margins = client_margins(fed, lambda_h, lambda_w)
    fig_path = None
    if fed.is_image:
        fig_path = Path(figure) if figure else Path(out_dir or Path.cwd()) / f"{cfg.name}-samples.png"
        sample_grid_figure(fed, fig_path, figure_samples)
    return PrepareResult(data=fed, cache=path, margins=margins, figure=fig_path)


def run_from_config(cfg) -> PrepareResult:
    """Turn the composed Hydra config into typed objects once and run [`prepare`][fedhead.cli.data.prepare]."""
    # imported when the command runs, not at start-up (--help stays fast)
    from hydra.utils import instantiate

    ds = instantiate(cfg.dataset, _convert_="all")
    res = prepare(
        ds,
        num_clients=cfg.get("num_clients"),
        seed=cfg.get("seed"),
        lambda_h=float(cfg.lambda_h),
        lambda_w=float(cfg.lambda_w),
        figure=cfg.get("figure"),
        figure_samples=int(cfg.get("figure_samples", 16)),
        out_dir=cfg.get("out_dir") or _hydra_output_dir(),
    )
    print(_report(res))
    return res


def _hydra_output_dir() -> Path | None:
    """The Hydra run's output folder, or None outside a Hydra run."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):  # not inside a Hydra run (tests, library use)
        return None


def _hydra_task():
    def _main(cfg) -> None:
        # imported when the command runs, not at start-up (--help stays fast)
        from fedhead.driver.errors import debug_enabled, report

        try:
            run_from_config(cfg)
        except BaseException as exc:  # one line and an exit code (tracebacks with FEDHEAD_DEBUG=1)
            if isinstance(exc, SystemExit) or debug_enabled(cfg.get("debug")):
                raise
            sys.exit(report("fedhead-data", exc, unused_dir=_hydra_output_dir()))

    return _main


def main() -> None:
    """Console entry point ``fedhead-data`` (Hydra parses ``sys.argv``)."""
    # imported when the command runs, not at start-up (--help stays fast)
    from fedhead.driver.errors import run_hydra_app

    run_hydra_app("fedhead-data", "data", _hydra_task())


if __name__ == "__main__":
    main()
