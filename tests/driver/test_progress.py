"""Progress display: bars on a terminal only, one plain line otherwise (fedhead.progress).

Unit tests of the helper with a fake terminal, and a small federation run in a subprocess whose
output goes to a pipe, as under CI or a batch scheduler: no carriage-return frame may reach it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tqdm.auto import tqdm

from fedhead import progress as progress_module
from fedhead.driver import logs
from fedhead.progress import PROGRESS, PlainProgress, on_terminal, progress

ROOT = Path(__file__).resolve().parents[2]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@contextlib.contextmanager
def stderr_to(stream: io.StringIO):
    """stderr is ``stream`` inside the block (a fixture cannot: pytest resets sys.stderr after set-up)."""
    saved = sys.modules.pop("ipykernel", None)  # not a notebook
    try:
        with contextlib.redirect_stderr(stream):
            yield stream
    finally:
        if saved is not None:
            sys.modules["ipykernel"] = saved


def test_on_terminal_follows_stderr():
    with stderr_to(FakeTerminal()):
        assert on_terminal()
    assert not on_terminal(io.StringIO())
    closed = io.StringIO()
    closed.close()
    assert not on_terminal(closed)


def test_a_terminal_gets_a_tqdm_bar_drawn_on_stderr(caplog):
    with caplog.at_level(logging.INFO, logger=PROGRESS), stderr_to(FakeTerminal()) as terminal:
        bar = progress(range(4), desc="render", unit="img")
        assert isinstance(bar, tqdm)
        assert list(bar) == [0, 1, 2, 3]
    assert "\r" in terminal.getvalue() and "render" in terminal.getvalue()
    assert not caplog.records  # the bar is the display; no extra line


def test_off_a_terminal_one_line_per_step_and_no_frames(caplog):
    with caplog.at_level(logging.INFO, logger=PROGRESS), stderr_to(io.StringIO()) as pipe:
        items = list(progress(range(5), desc="dsprites images", unit="chunk"))
        with progress(total=10, desc="gap_terms", unit="inst") as bar:
            assert isinstance(bar, PlainProgress)
            bar.update(3)
            bar.update(4)
            bar.set_postfix(e_star=0.25)
    assert items == [0, 1, 2, 3, 4]
    assert pipe.getvalue() == ""
    lines = [r.getMessage() for r in caplog.records if r.name == PROGRESS]
    assert len(lines) == 2
    assert lines[0].startswith("dsprites images: 5 chunk in ") and lines[0].endswith(" s")
    assert lines[1].startswith("gap_terms: 7/10 inst in ") and lines[1].endswith("s (e_star=0.25)")


def test_off_a_terminal_silent_without_summary_or_when_disabled(caplog):
    with caplog.at_level(logging.INFO, logger=PROGRESS), stderr_to(io.StringIO()) as pipe:
        bar = progress(total=3, desc="proximal rounds", unit="round", summary=False, leave=True)
        bar.update(3)
        bar.close()
        bar.close()
        assert list(progress(range(2), desc="epochs", disable=True)) == [0, 1]
    assert not caplog.records and pipe.getvalue() == ""


def test_disabled_on_a_terminal_draws_nothing():
    with stderr_to(FakeTerminal()) as terminal:
        assert list(progress(range(3), desc="local epochs", disable=True)) == [0, 1, 2]
    assert terminal.getvalue() == ""


def test_a_broken_loop_still_logs_its_line_once(caplog):
    with caplog.at_level(logging.INFO, logger=PROGRESS), stderr_to(io.StringIO()), pytest.raises(RuntimeError):
        for i in progress(range(10), desc="MPIIGaze files", unit="file"):
            if i == 2:
                raise RuntimeError("bad file")
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == ["MPIIGaze files: 2/10 file"]


def test_progress_lines_reach_the_run_console(tmp_path):
    stream = io.StringIO()
    try:
        logs.configure_run_logging(tmp_path, stream=stream)
        progress_module.log.info("dsprites images: 3 chunk in 1.0 s")
    finally:
        logs.remove_run_logging()
    assert stream.getvalue().splitlines() == ["dsprites images: 3 chunk in 1.0 s"]
    assert "[fedhead.progress][INFO] dsprites images" in (tmp_path / "run.log").read_text()


SMALL_RUN = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from flwr.supercore.task_identity import TaskIdentity

    from app_helpers import InProcessGrid
    from fedhead.clients import make_client_app
    from fedhead.driver import logs
    from fedhead.driver.checks import prepare_data
    from fedhead.driver.recorder import RunRecorder
    from fedhead.driver.server import finish_job, serve
    from fedhead.settings.config import compose_config, load_config

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 1
    out = Path(sys.argv[1])
    logs.configure_run_logging(out)
    overrides = ["dataset.n_train=240", f"dataset.cache_dir={out / 'cache'}", "model=free",
                 "experiment.procedures=[proximal]", "rounds=2", "local_epochs=3", "num_clients=3"]
    job = load_config(compose_config(overrides)).jobs(out)[0]
    prepare_data(job)
    rec = RunRecorder(job, show_progress=True)
    pgrid = serve(InProcessGrid(make_client_app(job), 3), job, rec, show_progress=True)
    finish_job(job, rec, pgrid, 0.0, 1.0)
    """
)


@pytest.mark.timeout(180)
def test_a_run_piped_to_a_file_has_no_bar_frames_and_one_line_per_round(tmp_path):
    """The round bar and the message-phase bars are on; stdout and stderr go to a pipe."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    proc = subprocess.run(
        [sys.executable, "-c", SMALL_RUN, str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=170,
    )
    text = proc.stdout.decode()
    assert proc.returncode == 0, text[-3000:]
    assert "\r" not in text and "\x1b[" not in text
    rounds = [line for line in text.splitlines() if line.startswith("[proximal] round ")]
    assert [line.split(":")[0] for line in rounds] == [f"[proximal] round {t}/2" for t in range(3)]
