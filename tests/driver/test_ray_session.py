"""The shared Ray session is re-entrant: an inner context neither starts nor stops Ray and keeps
flwr's backend patched until the outermost one exits (no Ray is started here)."""

from __future__ import annotations

from fedhead.driver import ray_session


def test_nested_shared_sessions_keep_the_outer_one():
    from flwr.server.superlink.fleet.vce.backend import raybackend

    original = raybackend.RayBackend.terminate
    assert not ray_session.shared()
    with ray_session.shared_ray_session({}, start=False):
        patched = raybackend.RayBackend.terminate
        assert ray_session.shared() and patched is not original
        with ray_session.shared_ray_session({"num_cpus": 1}):  # would start Ray if it were the outer one
            assert ray_session.shared() and raybackend.RayBackend.terminate is patched
        import ray

        assert not ray.is_initialized()  # the inner context started nothing
        assert ray_session.shared() and raybackend.RayBackend.terminate is patched
    assert not ray_session.shared() and raybackend.RayBackend.terminate is original
