"""Small sites and a site's own values (``privacy:``; clients/site.py, clients/messages.py).

In process (real ClientApps, :class:`app_helpers.InProcessGrid`, no Ray): a site with fewer
training rows than ``privacy.min_rows`` refuses every message before it computes anything, the
server records only that it refused (never its count), and with ``failure.min_clients`` allowing
it the run completes without the site; a SuperNode may raise its minimum, never lower it; a site
whose target column is not numeric tells the server the file, the column and the kind of problem,
and none of its cells. The detail (the count, the offending value) is in the node's own log.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from app_helpers import InProcessGrid, instruction
from flwr.app import ConfigRecord, RecordDict

from fedhead.clients import make_client_app
from fedhead.clients.cache import CLIENT_CACHE
from fedhead.driver.recorder import RunRecorder
from fedhead.driver.server import serve
from fedhead.settings.config import compose_config, load_config
from fedhead.strategies.failures import TooFewReplies

SMALL = 7  # rows of the small site: above C + 1 = 3, below the default privacy.min_rows=10
SIZES = (30, SMALL, 38)
REFUSAL = "fewer training rows than the site's minimum (privacy.min_rows=10)"


def _cells(n: int, seed: int) -> dict[str, list[str]]:
    """Columns f1 f2 t1 t2 as the file's cells: distinctive values (9 significant digits)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(1000.0, 9000.0, size=(n, 2))
    y = x @ np.array([[1.0, 0.5], [-0.3, 2.0]]) + rng.uniform(100.0, 900.0, size=(n, 2))
    cols = {"f1": x[:, 0], "f2": x[:, 1], "t1": y[:, 0], "t2": y[:, 1]}
    return {k: [f"{v:.9g}" for v in col] for k, col in cols.items()}


def _write(path: Path, cells: dict[str, list[str]]) -> Path:
    names = list(cells)
    rows = [",".join(cells[c][i] for c in names) for i in range(len(cells[names[0]]))]
    path.write_text("\n".join([",".join(names), *rows]) + "\n")
    return path


def _leaks(text: str, cells: dict[str, list[str]], *, short: bool = True) -> list[str]:
    """The cells of a file that ``text`` quotes: as written, as Python prints them and
    (``short``: for a one-line reason, not a whole results.json full of numbers) rounded;
    at least 4 characters (7 in a whole record: its other numbers may share a short prefix)."""
    out = []
    for col in cells.values():
        for cell in col:
            forms = {cell, cell.strip()}
            try:
                v = float(cell)
                forms |= {repr(v), f"{v:.6g}"} | ({f"{v:.4g}", f"{v:.2f}"} if short else set())
            except ValueError:
                pass
            out += [f for f in forms if len(f) >= (4 if short else 7) and f in text]
    return out


def _query(grid: InProcessGrid, node: int, content: RecordDict) -> str | None:
    """The error reason of ``node``'s reply to a query (None: a reply), as flwr makes it."""
    try:
        grid.handlers[node](instruction(node, "query", content))
    except Exception as exc:  # noqa: BLE001 - flwr: a raising ClientApp -> an error reply
        return f"{type(exc)}:<'{exc}'>"
    return None


def _job(tmp_path: Path, *overrides: str):
    cfg = load_config(
        compose_config(
            [
                "dataset=table",
                "dataset.files=[]",
                f"dataset.num_clients={len(SIZES)}",
                "dataset.targets=[t1,t2]",
                "model=free",
                "procedure=exact",
                "rounds=2",
                "output.tensorboard=false",
                "output.figures=false",
                *overrides,
            ]
        )
    )
    return cfg.jobs(tmp_path / "out")[0]


class _Replies:
    """What one node's ClientApp did with each message: its reply, or the exception it raised
    (which flwr turns into an error reply)."""

    def __init__(self, grid: InProcessGrid, node: int):
        self.seen: list = []
        inner = grid.handlers[node]

        def handle(msg):
            try:
                reply = inner(msg)
            except Exception as exc:
                self.seen.append(exc)
                raise
            self.seen.append(reply)
            return reply

        grid.handlers[node] = handle


def _grid(job, files: list[Path], node_config: dict[int, dict] | None = None) -> InProcessGrid:
    CLIENT_CACHE.clear()
    grid = InProcessGrid(make_client_app(job), len(files))
    for k, node in enumerate(sorted(grid.contexts)):
        grid.contexts[node].node_config = {"data-path": str(files[k]), **(node_config or {}).get(node, {})}
    return grid


def _serve(job, grid):
    recorder = RunRecorder(job, show_progress=False)
    serve(grid, job, recorder, show_progress=False)
    return recorder.finish("completed")


def _sites(tmp_path: Path) -> tuple[list[Path], list[dict[str, list[str]]]]:
    cells = [_cells(n, i) for i, n in enumerate(SIZES)]
    return [_write(tmp_path / f"site_{i}.csv", c) for i, c in enumerate(cells)], cells


def test_a_site_below_the_minimum_refuses_locally_and_the_run_continues_without_it(tmp_path, task_identity, caplog):
    files, cells = _sites(tmp_path)
    job = _job(tmp_path, "failure.min_clients=2")
    assert job.privacy.min_rows == 10  # the default
    grid = _grid(job, files)
    small = _Replies(grid, 1001)
    with caplog.at_level(logging.WARNING, logger="fedhead.clients"):
        res = _serve(job, grid)
    assert res.status == "completed" and [r.round for r in res.rounds] == [0, 1, 2]
    assert sorted(res.dataset.counts) == [30, 38]  # the two other sites
    # every message the small site received: an error reply, nothing of its rows
    assert small.seen and all(isinstance(r, Exception) for r in small.seen), small.seen
    kinds = {m.metadata.message_type for m in grid.sent if m.metadata.dst_node_id == 1001}
    assert kinds == {"query"}  # refused at the statistics exchange, then left out
    # what the server recorded: that it refused, with the minimum; not its count, no value
    written = json.loads((job.output_dir / "results.json").read_text())
    dropped = [d for r in written["rounds"] for d in r["dropped"]]
    assert [d["node"] for d in dropped] == [1001], dropped
    reason = dropped[0]["reason"]
    assert REFUSAL in reason and "site_1.csv" in reason, reason
    record = json.dumps(written)
    assert not re.search(rf"\b{SMALL}\b", reason), reason
    assert f"{SMALL} training row" not in record and not _leaks(record, cells[1], short=False)
    # the node's own log has the count
    said = [r.getMessage() for r in caplog.records if r.name == "fedhead.clients.messages"]
    assert any(REFUSAL in s and f"[{SMALL} training row(s)]" in s for s in said), said


def test_a_site_below_the_minimum_stops_a_run_that_needs_every_site(tmp_path, task_identity):
    files, cells = _sites(tmp_path)
    job = _job(tmp_path)
    with pytest.raises(TooFewReplies) as err:
        _serve(job, _grid(job, files))
    text = str(err.value)
    assert "node 1001" in text and REFUSAL in text, text
    assert not re.search(rf"\b{SMALL}\b", text) and not _leaks(text, cells[1]), text


def test_the_minimum_is_the_sites_to_raise_and_a_lower_one_admits_the_site(tmp_path, task_identity):
    files, _ = _sites(tmp_path)
    job = _job(tmp_path, "privacy.min_rows=5", "failure.min_clients=2")
    stats = RecordDict({"config": ConfigRecord({"stage": "statistics"})})
    # the run's minimum of 5 admits the 7-row site ...
    assert _query(_grid(job, files), 1001, stats) is None
    # ... its own node config sets it (the run can neither lower nor raise it): it refuses, naming its own setting
    reason = _query(_grid(job, files, {1001: {"min-rows": 20}}), 1001, stats)
    assert reason and "fewer training rows than the site's minimum (node config min-rows=20)" in reason, reason
    assert not re.search(rf"\b{SMALL}\b", reason), reason
    # a node minimum below the run's is the site's own; a malformed one is refused, naming the key
    grid = _grid(job, files, {1000: {"min-rows": 2}, 1001: {"min-rows": "many"}})
    assert _query(grid, 1000, stats) is None
    strict = _job(tmp_path / "strict", "privacy.min_rows=20", "failure.min_clients=2")
    assert _query(_grid(strict, files, {1001: {"min-rows": 5}}), 1001, stats) is None  # the run cannot raise it
    reason = _query(grid, 1001, stats)
    assert reason and "node config min-rows must be an integer >= 1" in reason, reason


def test_a_partition_of_a_built_in_data_set_below_the_minimum_refuses(tmp_path, task_identity):
    cfg = load_config(
        compose_config(
            ["dataset.n_train=240", f"dataset.cache_dir={tmp_path / 'cache'}", "num_clients=3", "model=free"]
            + ["procedure=exact", "rounds=1", "output.tensorboard=false", "output.figures=false"]
            + ["failure.min_clients=2"]
        )
    )
    job = cfg.jobs(tmp_path / "out")[0]
    CLIENT_CACHE.clear()
    grid = InProcessGrid(make_client_app(job), 3)
    grid.contexts[1002].node_config = {**grid.contexts[1002].node_config, "min-rows": 100_000}
    res = _serve(job, grid)
    assert res.status == "completed"
    dropped = [d for r in res.rounds for d in r.dropped]
    assert [d["node"] for d in dropped] == [1002], dropped
    assert (
        "partition 2: fewer training rows than the site's minimum (node config min-rows=100000)"
        in (dropped[0]["reason"])
    )
    assert {m.metadata.message_type for m in grid.sent if m.metadata.dst_node_id == 1002} == {"query"}


def test_a_non_numeric_target_cell_names_file_column_and_kind_and_no_cell(tmp_path, task_identity, caplog):
    files, cells = _sites(tmp_path)
    bad = {k: list(v) for k, v in cells[2].items()}
    bad["t1"][11] = "n/a-8421.5x"  # one cell that is not a number: the column is read as text
    _write(files[2], bad)
    job = _job(tmp_path, "failure.min_clients=2", "privacy.min_rows=5")
    with caplog.at_level(logging.WARNING, logger="fedhead.clients"):
        res = _serve(job, _grid(job, files))
    assert res.status == "completed"
    written = (job.output_dir / "results.json").read_text()
    dropped = [d for r in json.loads(written)["rounds"] for d in r["dropped"]]
    assert [d["node"] for d in dropped] == [1002], dropped
    reason = dropped[0]["reason"]
    assert "site_2.csv: column 't1' (dataset.targets) is not numeric" in reason, reason
    assert not _leaks(reason, bad) and not _leaks(written, bad, short=False), reason
    assert "row 12" not in reason
    said = " ".join(r.getMessage() for r in caplog.records if r.name == "fedhead.clients.messages")
    assert "'n/a-8421.5x' in data row 12" in said, said  # the node's own log says which cell
