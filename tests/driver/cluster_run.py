"""A simulation run for tests/driver/test_cluster.py, in its own process (its own Ray driver):
``python cluster_run.py OUT CLIENTS [ADDRESS] [--resume]``. Every training message writes which
Ray node ran it (``OUT/nodes/<partition>_<round>``); results.json lands under ``OUT/proximal``;
``--resume`` continues the run of ``OUT`` (``resume=OUT``)."""

from __future__ import annotations

import sys
from pathlib import Path


def main(out: Path, clients: int, address: str | None, resume: bool) -> None:
    import ray
    from flwr.clientapp import ClientApp

    from fedhead.clients import app as handlers
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
    app = ClientApp()

    @app.query()
    def query(msg, context):
        return handlers.handle_query(jobs[0], msg, context)

    @app.train()
    def train(msg, context):
        reply = handlers.handle_train(jobs[0], msg, context)
        pid, rnd = int(context.node_config["partition-id"]), int(msg.content.config_records["config"]["server-round"])
        (nodes / f"{pid}_{rnd}").write_text(ray.get_runtime_context().get_node_id())
        return reply

    @app.evaluate()
    def evaluate(msg, context):
        return handlers.handle_evaluate(jobs[0], msg, context)

    run_federations(jobs, show_progress=False, client_app=app)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--resume"]
    main(Path(args[0]), int(args[1]), args[2] if len(args) > 2 else None, "--resume" in sys.argv)
