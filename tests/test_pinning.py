"""PinSpeculation: an operator fixes the config, the controller holds and
learns nothing meanwhile, release hands the choice back. A real server over
real gRPC on loopback; the engine is a fake whose live switches, like the
embedded preset's, change K but not the drafting mode."""

from __future__ import annotations

import grpc
import pytest

from quickdraft.bench.gate import LoopThread
from quickdraft.client import CompletionClient
from quickdraft.server.controller import Decision
from quickdraft.server.speculative import SpecConfig
from tests.test_service import FakeEngine


@pytest.fixture()
def served(tmp_path):
    from quickdraft.server.app import QuickdraftServer
    from quickdraft.server.config import load_config

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cfg = load_config(env={}, overrides={
        "security.auth_token_file": str(token), "server.port": 0, "telemetry.metrics_port": 0, "http.enabled": False, "controller.enabled": True,
        "controller.profile_dir": str(tmp_path), "controller.decide_every_s": 3600})
    made: list[FakeEngine] = []

    async def factory(cfg, spec, live=False):
        made.append(FakeEngine(spec, live=live))
        return made[-1]

    loop = LoopThread()

    async def boot():
        server = QuickdraftServer(cfg, engine_factory=factory)
        await server.start()
        await server.wait_ready(60)
        return server

    server = loop.run(boot())
    with CompletionClient(f"127.0.0.1:{server.port}", token="s3cret") as client:
        yield server, client, made, loop
    loop.run(server.shutdown(1.0))
    loop.stop()


def test_a_pin_switches_live_and_the_controller_holds_until_release(served):
    server, client, made, loop = served
    start = made[0].spec
    assert start.parallel  # the embedded preset starts on P-EAGLE
    reply = client.pin_speculation("p3")
    assert (reply.pinned, reply.applied, reply.config.label) == (True, "live", "parallel K=3")
    assert len(made) == 1 and made[0].spec == SpecConfig(True, 3)
    assert client.controller_state().pinned == "parallel K=3"

    # The controller neither decides nor learns while pinned.
    ctl = server.controller
    ctl.ctl.decide = lambda now=None: Decision("switch", SpecConfig(True, 3), SpecConfig(True, 7), SpecConfig(True, 7), 0.1, "t", "x", 0.0)
    loop.run(ctl.tick())
    assert made[0].spec == SpecConfig(True, 3)
    before = ctl.ctl.observations
    assert "".join(client.complete(prefix="def f(")) != ""
    assert ctl.ctl.observations == before and ctl.skipped_while_pinned == 1

    reply = client.pin_speculation("")
    assert reply.pinned is False and reply.applied == "released"
    assert client.controller_state().pinned == ""
    loop.run(ctl.tick())  # the controller chooses again
    assert made[0].spec == SpecConfig(True, 7)


def test_a_pin_that_needs_another_engine_is_refused_unless_a_rebuild_is_allowed(served):
    server, client, made, _ = served
    with pytest.raises(grpc.RpcError) as e:
        client.pin_speculation("ar3")
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "allow_rebuild" in e.value.details() and "autoregressive K=3" in e.value.details()
    assert len(made) == 1 and not client.controller_state().pinned  # nothing changed
    reply = client.pin_speculation("ar3", allow_rebuild=True)
    assert (reply.applied, reply.config.label, reply.pinned) == ("rebuild", "autoregressive K=3", True)
    assert len(made) == 2 and server.engines.engine is made[1]


@pytest.mark.parametrize("config,fragment", [("p-five", "cannot parse"), ("p9", "above speculation.max_k")])
def test_a_bad_config_is_invalid_argument_naming_the_field_and_the_server_keeps_serving(served, config, fragment):
    _, client, made, _ = served
    with pytest.raises(grpc.RpcError) as e:
        client.pin_speculation(config)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("config:") and fragment in e.value.details()
    assert "".join(client.complete(prefix="x")) != ""


def test_pinning_needs_the_token_when_auth_is_on(served):
    server, _, made, _ = served
    with CompletionClient(f"127.0.0.1:{server.port}") as anonymous, pytest.raises(grpc.RpcError) as e:
        anonymous.pin_speculation("p3")
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert made[0].switches == 0


def test_short_labels_parse():
    assert SpecConfig.parse("p5") == SpecConfig(True, 5)
    assert SpecConfig.parse("ar3") == SpecConfig(False, 3)
    assert SpecConfig.parse("parallel K=5") == SpecConfig(True, 5)
