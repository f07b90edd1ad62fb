"""The shared Ray session is re-entrant: an inner context neither starts nor stops Ray and keeps
flwr's backend patched until the outermost one exits (no Ray is started here)."""

from __future__ import annotations

from fedhead.driver import ray_session


def test_nested_shared_sessions_keep_the_outer_one():
    """Relative to the state the test finds: the test session's own shared session may already be
    open (it opens when a Ray test runs first in this process)."""
    import ray
    from flwr.server.superlink.fleet.vce.backend import raybackend

    original = raybackend.RayBackend.terminate
    outer, running = ray_session.shared(), ray.is_initialized()
    with ray_session.shared_ray_session({}, start=False):
        patched = raybackend.RayBackend.terminate
        assert ray_session.shared() and (patched is original) == outer
        with ray_session.shared_ray_session({"num_cpus": 1}):  # would start Ray if it were the outermost
            assert ray_session.shared() and raybackend.RayBackend.terminate is patched
        assert ray.is_initialized() == running  # the inner context started nothing
        assert ray_session.shared() and raybackend.RayBackend.terminate is patched
    assert ray_session.shared() == outer and raybackend.RayBackend.terminate is original


def test_flwr_backend_still_does_what_the_shared_session_replaces():
    """shared_ray_session swaps flwr's private ``RayBackend.terminate`` for one that only ends the
    actors: this pins what that method does in the installed flwr, so that an upgrade that
    renames it, stops shutting Ray down there or drops ``pool.terminate_all_actors`` fails here
    instead of leaking Ray sessions or stopping Ray under a sweep."""
    import ast
    import inspect

    from flwr.server.superlink.fleet.vce.backend import raybackend
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    # from the module's file: inside the test session's shared Ray session the class attribute is
    # the replacement itself
    module = inspect.getsource(raybackend)
    (cls,) = [n for n in ast.parse(module).body if isinstance(n, ast.ClassDef) and n.name == "RayBackend"]
    methods = {n.name: ast.get_source_segment(module, n) or "" for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert "ray.shutdown()" in methods["terminate"] and "self.pool.terminate_all_actors()" in methods["terminate"]
    assert "self.pool" in methods["__init__"]
    assert callable(getattr(BasicActorPool, "terminate_all_actors", None))
