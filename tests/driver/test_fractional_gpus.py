"""Fractional-GPU packing of the Ray simulation, on the CPU with Ray's declared (fake) GPUs.

``ray.init(num_gpus=1)`` declares one GPU that does not exist; Ray schedules by the declared
resources, so the packing that ``resources.client_gpus`` asks for (several clients' actors on
one GPU) is checked here without one: fedhead's ``backend_config`` -> Flower's actor-pool size ->
Ray placing that many actors at once, each seeing GPU 0; and one whole fedhead simulation with
``resources.client_gpus=0.25 resources.ray_num_gpus=1`` (the clients train on the CPU:
``device=cpu``, and the CUDA preflight is skipped, since the declared GPU is not real).
Marked slow: each Ray start takes 10-30 s on 2 shared cores.
"""

from __future__ import annotations

import os

import pytest

from fedhead.settings.config import ResourcesConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def fake_gpu_ray():
    """Ray with 8 CPUs and 1 GPU declared (neither need exist), one start for the module's packing tests."""
    import ray

    from fedhead.driver.ray_session import start_ray, stop_ray

    stop_ray()
    args = ResourcesConfig(ray_num_cpus=8, ray_num_gpus=1).backend_config(4, use_cuda=True)["init_args"]
    assert args == {"num_cpus": 8, "num_gpus": 1}
    start_ray(args)
    try:
        yield ray
    finally:
        stop_ray()


@pytest.mark.parametrize("num_clients", [4, 6, 8])
def test_default_share_packs_every_client_on_one_gpu(fake_gpu_ray, num_clients):
    """The default share (``client_gpus`` null on CUDA: 1/num_clients) fits ``num_clients`` actors
    on one GPU, by Flower's count and by Ray's placement (Ray keeps 4 decimals of a share)."""
    from flwr.simulation.ray_transport.ray_actor import pool_size_from_resources

    ray = fake_gpu_ray
    res = ResourcesConfig(client_cpus=1.0, ray_num_gpus=1).backend_config(num_clients, use_cuda=True)
    client = res["client_resources"]
    assert 0 < client["num_gpus"] <= 1 / num_clients
    assert pool_size_from_resources(client) == num_clients

    @ray.remote
    class Probe:
        def where(self):
            return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")

    actors = [Probe.options(num_cpus=client["num_cpus"], num_gpus=client["num_gpus"]).remote() for _ in range(8)]
    try:
        ready, pending = ray.wait([a.where.remote() for a in actors], num_returns=8, timeout=60)
        # exactly num_clients actors fit beside each other (8 CPUs declared), the rest wait
        assert len(ready) == min(num_clients, 8), (len(ready), client)
        for gpu_ids, visible in ray.get(ready):
            assert [str(g) for g in gpu_ids] == ["0"] and visible == "0"
    finally:
        for a in actors:
            ray.kill(a)


def test_simulation_with_fractional_fake_gpus(tmp_path, monkeypatch):
    """A whole fedhead simulation with four clients at 0.25 GPU each on one declared GPU."""
    from fedhead.driver import simulation
    from fedhead.driver.ray_session import stop_ray
    from fedhead.settings.config import compose_config, load_config

    stop_ray()  # the packing tests' Ray (8 CPUs declared): this simulation starts its own
    monkeypatch.setattr(simulation, "preflight", lambda jobs: None)  # it refuses GPU shares without CUDA
    seen = {}
    original = ResourcesConfig.backend_config

    def spy(self, num_clients, use_cuda):
        seen["backend"] = out = original(self, num_clients, use_cuda)
        return out

    monkeypatch.setattr(ResourcesConfig, "backend_config", spy)
    cfg = load_config(
        compose_config(
            [
                "model=free",
                "dataset.n_train=200",
                f"dataset.cache_dir={tmp_path / 'cache'}",
                "num_clients=4",
                "experiment=single",
                "rounds=1",
                "local_epochs=5",
                "device=cpu",
                "resources.client_cpus=0.5",
                "resources.client_gpus=0.25",
                "resources.ray_num_cpus=2",
                "resources.ray_num_gpus=1",
                "resources.evaluate_mse=false",
                "output.figures=false",
                "output.tensorboard=false",
            ]
        )
    )
    jobs = cfg.jobs(tmp_path / "out")
    (res,) = simulation.run_federations(jobs, show_progress=False)
    assert res["status"] == "completed" and [r["round"] for r in res["rounds"]] == [0, 1]
    assert seen["backend"]["client_resources"] == {"num_cpus": 0.5, "num_gpus": 0.25}
    init = seen["backend"]["init_args"]  # (the driver adds its logging options to it)
    assert (init["num_cpus"], init["num_gpus"]) == (2, 1)
