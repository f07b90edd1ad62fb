"""``deploy_commands.finished_status``: a deployment's outcome is the run's status at the SuperLink,
whatever ``flwr run`` exited with (no flwr process: ``flwr ls`` is a stand-in)."""

from __future__ import annotations

import json
import subprocess

from deploy_commands import finished_status


def _ls(statuses: list[str], asked: list[str]):
    def ls(run_id: str) -> subprocess.CompletedProcess:
        asked.append(run_id)
        runs = [{"run-id": run_id, "status": statuses.pop(0) if len(statuses) > 1 else statuses[0]}]
        return subprocess.CompletedProcess([], 0, stdout=json.dumps({"success": True, "runs": runs}), stderr="")

    return ls


def test_polls_until_the_run_has_finished_and_returns_its_status():
    asked: list[str] = []
    streamed = "Loading project configuration...\nSuccessfully started run 4711\n... ServerApp raised an exception"
    status = finished_status(streamed, _ls(["running", "running", "finished:failed"], asked), poll=0)
    assert status == "finished:failed" and asked == ["4711"] * 3


def test_reads_the_run_id_of_json_output_and_names_no_run_as_none():
    asked: list[str] = []
    started = json.dumps({"success": True, "run-id": "99", "federation-id": ""}, indent=2)
    assert finished_status(started, _ls(["finished:completed"], asked), poll=0) == "finished:completed"
    assert asked == ["99"]
    assert finished_status("❌ Failed to start run", _ls(["finished:completed"], asked), poll=0) is None


def test_gives_up_after_its_limit_with_the_last_status():
    assert finished_status("Successfully started run 7", _ls(["running"], []), limit=0, poll=0) == "running"
