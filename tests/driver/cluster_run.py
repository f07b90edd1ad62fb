"""A simulation run for tests/driver/test_cluster.py, in its own process (its own Ray driver):
``python cluster_run.py OUT CLIENTS [ADDRESS] [--resume]``. Every training message writes which
Ray node ran it (``OUT/nodes/<partition>_<round>``); results.json lands under ``OUT/proximal``;
``--resume`` continues the run of ``OUT`` (``resume=OUT``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: app_helpers


def main(out: Path, clients: int, address: str | None, resume: bool) -> None:
    import ray
    from app_helpers import handlers_app

    from fedhead.driver.simulation import run_federations
    from fedhead.settings.config import compose_config, load_config

    overrides = [
        "model=free",
        "dataset.n_train=240",
        f"dataset.cache_dir={out / 'cache'}",
        f"num_clients={clients}",
        "procedure=proximal",
        "rounds=3",
        "local_epochs=20",
        "resources.evaluate_mse=false",
        "output.tensorboard=false",
        "output.figures=false",
        f"output.dir={out}",
    ]
    overrides += [f"resources.ray_address={address}"] if address else ["resources.ray_num_cpus=2"]
    overrides += [f"resume={out}"] if resume else []
    jobs = load_config(compose_config(overrides)).jobs(out)
    nodes = out / "nodes"
    nodes.mkdir(parents=True, exist_ok=True)

    def around(stage, handle):
        if stage != "train":
            return handle

        def train(msg, context):
            reply = handle(msg, context)
            pid, rnd = (
                int(context.node_config["partition-id"]),
                int(msg.content.config_records["config"]["server-round"]),
            )
            (nodes / f"{pid}_{rnd}").write_text(ray.get_runtime_context().get_node_id())
            return reply

        return train

    app = handlers_app(jobs[0], around)
    run_federations(jobs, show_progress=False, client_app=app)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--resume"]
    main(Path(args[0]), int(args[1]), args[2] if len(args) > 2 else None, "--resume" in sys.argv)
