"""Hardening of the server's core, without a network or vLLM: long prompts
are refused or tokenized off the event loop, fairly between clients;
admission gives each client a fair share; per-user tokens; the engine
manager's memory and retirement rules; nothing in ServerInfo names a path."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from quickdraft.server.admission import Admission, Client
from quickdraft.server.auth import Auth, TokensFile, digest
from quickdraft.server.config import ConfigError, load_config
from quickdraft.server.engine_manager import EngineManager
from quickdraft.server.errors import RequestError
from quickdraft.server.service import CompletionService, public_model_name
from quickdraft.server.speculative import SpecConfig
from quickdraft.server.telemetry import Telemetry
from quickdraft.server.tokenizer_pool import INLINE_CHARS, TokenizerPool
from quickdraft.v1 import completion_pb2 as pb
from tests.test_service import PROMPT_TOKENS, FakeEngine

# --- the tokenizer pool ----------------------------------------------------------------------


def test_a_client_holds_at_most_one_thread_and_another_client_is_not_queued_behind_it():
    """Two threads; client A sends three long prompts whose tokenization blocks
    until released; B's prompt runs on the second thread while all of A's wait."""

    async def run():
        pool = TokenizerPool(threads=2)
        gate = threading.Event()
        started: list[str] = []

        def job(name):
            def fn():
                started.append(name)
                if name.startswith("a"):
                    gate.wait(10)
                return name
            return fn

        a = [asyncio.create_task(pool.run("A", INLINE_CHARS, job(f"a{i}"))) for i in range(3)]
        await asyncio.sleep(0.05)
        b = await asyncio.wait_for(pool.run("B", INLINE_CHARS, job("b")), 5)
        assert b == "b"
        assert started == ["a0", "b"], started  # a1 and a2 waited for a0, not for a free thread
        assert pool.busy == 1 and pool.queued == 2
        gate.set()
        assert await asyncio.gather(*a) == ["a0", "a1", "a2"]
        pool.shutdown()

    asyncio.run(run())


def test_freed_threads_go_round_robin_between_clients():
    async def run():
        pool = TokenizerPool(threads=1)
        gate = threading.Event()
        order: list[str] = []

        def job(name):
            def fn():
                if name == "a0":
                    gate.wait(10)
                order.append(name)
            return fn

        tasks = [asyncio.create_task(pool.run("A", INLINE_CHARS, job(f"a{i}"))) for i in range(3)]
        await asyncio.sleep(0.05)
        tasks += [asyncio.create_task(pool.run("B", INLINE_CHARS, job(f"b{i}"))) for i in range(2)]
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(*tasks)
        assert order == ["a0", "b0", "a1", "b1", "a2"], order
        pool.shutdown()

    asyncio.run(run())


def test_a_cancelled_wait_leaves_the_pool_usable():
    async def run():
        pool = TokenizerPool(threads=1)
        gate = threading.Event()
        first = asyncio.create_task(pool.run("A", INLINE_CHARS, lambda: gate.wait(10)))
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(pool.run("B", INLINE_CHARS, lambda: "never"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        gate.set()
        await first
        assert await asyncio.wait_for(pool.run("B", INLINE_CHARS, lambda: "ok"), 5) == "ok"
        assert pool.busy == 0 and pool.queued == 0
        pool.shutdown()

    asyncio.run(run())


def test_short_prompts_tokenize_on_the_loop_thread():
    async def run():
        pool = TokenizerPool(threads=1)
        where = await pool.run("A", INLINE_CHARS - 1, lambda: threading.current_thread().name)
        pool.shutdown()
        return where

    assert asyncio.run(run()) == threading.main_thread().name


def test_a_client_past_its_share_of_tokenizer_time_waits_and_others_do_not():
    """Share 0.25 over a 10-s window: 2.5 s of tokenizing is free; a client
    past it waits until its use decays back, however often it asks; another
    client's first long prompt does not wait. Time is a fake clock the jobs move."""
    from quickdraft.server.tokenizer_pool import WINDOW_S

    now = [1000.0]

    def job(seconds):
        def fn():
            now[0] += seconds
        return fn

    async def run():
        pool = TokenizerPool(threads=1, share=0.25, clock=lambda: now[0])
        await pool.run("A", INLINE_CHARS, job(2.0))
        assert pool.wait_s("A") == 0.0  # 2 s spent, 2.5 s allowed
        await pool.run("A", INLINE_CHARS, job(2.0))
        spent = pool.spent_s("A")
        assert spent == pytest.approx(2.0 * math.exp(-2.0 / WINDOW_S) + 2.0)  # the first decayed meanwhile
        assert pool.wait_s("A") == pytest.approx(WINDOW_S * math.log(spent / 2.5))
        assert pool.wait_s("B") == 0.0
        now[0] += pool.wait_s("A")  # after that wait, A's use has decayed to its share
        assert pool.spent_s("A") == pytest.approx(2.5)
        assert pool.wait_s("A") == pytest.approx(0.0, abs=1e-9)
        pool.shutdown()

    asyncio.run(run())


def test_a_throttled_client_sleeps_before_its_turn():
    """The wait is real: the next long prompt of a client past its share
    sleeps (asyncio.sleep) and is counted; a short prompt never waits."""
    now = [0.0]

    async def run():
        pool = TokenizerPool(threads=1, share=0.25, clock=lambda: now[0])

        def hog():
            now[0] += 10.0

        await pool.run("A", INLINE_CHARS, hog)
        slept: list[float] = []
        real_sleep = asyncio.sleep

        async def fake_sleep(s):
            slept.append(s)
            now[0] += s
            await real_sleep(0)

        asyncio.sleep = fake_sleep
        try:
            assert await pool.run("A", INLINE_CHARS - 1, lambda: "short") == "short"
            assert slept == [] and pool.throttled == 0
            assert await pool.run("A", INLINE_CHARS, lambda: "long") == "long"
        finally:
            asyncio.sleep = real_sleep
        assert len(slept) == 1 and slept[0] > 0 and pool.throttled == 1
        pool.shutdown()

    asyncio.run(run())


# --- the service: sizes first, then long prompts off the loop --------------------------------


class CountingTokens:
    """The embedded tokenizer, counting calls; ``block_s`` holds each call (a slow tokenizer)."""

    def __init__(self, block_s: float = 0.0):
        self.calls = 0
        self.longest = 0
        self.threads: set[str] = set()
        self.block_s = block_s

    def text(self, s):
        self.calls += 1
        self.longest = max(self.longest, len(s))
        self.threads.add(threading.current_thread().name)
        if self.block_s:
            time.sleep(self.block_s)  # holds the GIL-free wait a Rust tokenizer would
        return PROMPT_TOKENS.text(s)

    def raw(self, s):
        return self.text(s)

    def special(self, token):
        return PROMPT_TOKENS.special(token)


def service_with(tokens: CountingTokens, **limits):
    cfg = load_config(env={})
    for k, v in limits.items():
        setattr(cfg.limits, k, v)

    async def factory(cfg, spec, live=False):
        return FakeEngine(spec, prompt_tokens=tokens)

    manager = EngineManager(cfg, engine_factory=factory)
    return cfg, manager, CompletionService(cfg, manager, Telemetry("embedded"))


def test_a_prompt_over_max_prompt_chars_is_refused_before_any_tokenizer_runs():
    """With strict_prompt: refused by its size alone."""
    tokens = CountingTokens()

    async def run():
        cfg, manager, service = service_with(tokens)
        await manager.start(SpecConfig.off())
        with pytest.raises(RequestError) as err:
            [m async for m in service.complete(pb.CompleteRequest(prefix="x" * (cfg.max_prompt_chars() + 1), strict_prompt=True), "c")]
        return cfg, err.value

    cfg, err = asyncio.run(run())
    assert err.code == "INVALID_ARGUMENT" and "limits.max_prompt_chars" in err.message and "max_prompt_tokens" in err.message
    assert "strict_prompt" in err.message
    assert tokens.calls == 0
    assert cfg.max_prompt_chars() == cfg.max_prompt_tokens() * 8


def test_a_prompt_over_max_prompt_chars_is_cut_before_any_tokenizer_sees_it():
    """Without strict_prompt: cut to max_prompt_chars by characters first, so
    the tokenizer never sees more than that, however long the request."""
    tokens = CountingTokens()

    async def run():
        cfg, manager, service = service_with(tokens)
        await manager.start(SpecConfig.off())
        prefix = "value = compute(alpha, beta)\n" * (cfg.limits.max_request_bytes // 40)
        msgs = [m async for m in service.complete(pb.CompleteRequest(prefix=prefix, suffix=prefix[:50_000]), "c")]
        return cfg, msgs[-1].final

    cfg, final = asyncio.run(run())
    assert 0 < tokens.longest <= cfg.max_prompt_chars()
    assert final.prompt_fit.truncated and 0 < final.prompt_tokens <= cfg.max_prompt_tokens()


def test_a_long_prompt_is_tokenized_off_the_event_loop():
    """A tokenization that takes 0.3 s: the loop keeps ticking meanwhile."""
    tokens = CountingTokens(block_s=0.3)

    async def run():
        cfg, manager, service = service_with(tokens)
        await manager.start(SpecConfig.off())
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        before = ticks
        msgs = [m async for m in service.complete(pb.CompleteRequest(prefix="-" * (INLINE_CHARS + 64)), "c")]  # long tokens: fits the embedded window
        during = ticks - before
        t.cancel()
        return msgs, during

    msgs, during = asyncio.run(run())
    assert msgs[-1].HasField("final")
    assert tokens.threads and all(n.startswith("quickdraft-tokenize") for n in tokens.threads), tokens.threads
    assert during >= 5, f"the event loop ticked {during} times during a 0.3 s tokenization"


# --- admission ------------------------------------------------------------------------------


def test_a_client_at_its_fair_share_of_a_busy_server_is_refused_and_others_are_not():
    adm = Admission(max_streams=8, max_per_client=8)
    held = []
    for _ in range(4):  # A alone: no share to protect yet
        cm = adm.admit("A")
        cm.__enter__()
        held.append(cm)
    cm = adm.admit("B")
    cm.__enter__()
    held.append(cm)
    # Half full; two holders (and a newcomer) -> A's share is 8 // 2 = 4, which it holds.
    with pytest.raises(RequestError) as err:
        adm.admit("A").__enter__()
    assert err.value.code == "RESOURCE_EXHAUSTED" and "fair share" in err.value.message
    for name in ("B", "C", "D"):
        cm = adm.admit(name)
        cm.__enter__()
        held.append(cm)
    assert adm.open == 8
    for cm in held:
        cm.__exit__(None, None, None)
    assert adm.open == 0 and not adm.per_client


def test_a_users_own_stream_limit_counts_for_that_user_only():
    adm = Admission(max_streams=64, max_per_client=32)
    alice = Client("user:alice", "alice", max_streams=1)
    with adm.admit(alice):
        with pytest.raises(RequestError) as err:
            with adm.admit(alice):
                pass
        assert "this user's max_streams (1)" in err.value.message
        with adm.admit(Client("user:bob", "bob")):
            assert adm.open == 2


# --- per-user tokens ------------------------------------------------------------------------


def tokens_file(tmp_path, **users):
    tf = TokensFile()
    tokens = {name: tf.add(name, **opts) for name, opts in users.items()}
    path = tmp_path / "tokens.toml"
    tf.write(path)
    return path, tokens


def test_tokens_file_stores_digests_and_identifies_users(tmp_path):
    path, tokens = tokens_file(tmp_path, alice={"max_streams": 2}, bob={"admin": True})
    text = path.read_text()
    assert tokens["alice"] not in text and digest(tokens["alice"]) in text
    assert path.stat().st_mode & 0o077 == 0
    auth = Auth(tokens_file=path)
    a = auth.client(f"Bearer {tokens['alice']}", "ipv4:10.0.0.1")
    assert (a.key, a.user, a.max_streams, a.admin) == ("user:alice", "alice", 2, False)
    assert auth.client(f"Bearer {tokens['bob']}", "ipv4:10.0.0.1").admin
    assert not auth.allows(f"Bearer {tokens['alice']}x") and not auth.allows(tokens["alice"]) and not auth.allows("")
    assert auth.client("Bearer made-up", "ipv4:10.0.0.9") == Client("ipv4:10.0.0.9")


def test_reload_picks_up_new_users_and_keeps_the_old_ones_when_the_file_breaks(tmp_path):
    path, tokens = tokens_file(tmp_path, alice={})
    auth = Auth(tokens_file=path)
    tf = TokensFile.read(path)
    carol = tf.add("carol")
    tf.write(path)
    assert not auth.allows(f"Bearer {carol}")
    assert auth.reload() and auth.allows(f"Bearer {carol}")
    path.write_text("[users.x]\ntoken_sha256 = 'not a digest'\n")
    assert not auth.reload()
    assert auth.allows(f"Bearer {carol}") and auth.allows(f"Bearer {tokens['alice']}")


@pytest.mark.parametrize("text, says", [
    ('[users.a]\ntoken_sha256 = ["abc"]\n', "64 lowercase hex"),
    ('[users."a b"]\ntoken_sha256 = ["' + "0" * 64 + '"]\n', "user id"),
    ('[users.a]\ntoken_sha256 = ["' + "0" * 64 + '"]\n[users.b]\ntoken_sha256 = ["' + "0" * 64 + '"]\n', "one token, one user"),
    ('[users.a]\ntoken_sha256 = ["' + "0" * 64 + '"]\nmax_streams = 0\n', "max_streams"),
    ('[users.a]\ntoken = "plain"\n', "token_sha256"),
    ("users = [", "not valid TOML"),
])
def test_a_bad_tokens_file_is_refused_naming_what_is_wrong(tmp_path, text, says):
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        TokensFile.read(path)
    assert says in str(err.value) and "auth_tokens_file" in str(err.value)


def test_a_shared_token_counts_callers_by_peer_not_by_token():
    auth = Auth("team-token")
    assert auth.client_identity("Bearer team-token", "ipv4:10.0.0.1") != auth.client_identity("Bearer team-token", "ipv4:10.0.0.2")
    assert auth.client("Bearer team-token", "ipv4:10.0.0.1").admin


def test_quickdraft_token_add_list_remove(tmp_path, capsys):
    """The CLI prints a new token once, stores only its digest (file 0600),
    lists users without tokens, and removes them; a bad user id is exit 2."""
    from quickdraft.cli import main

    path = tmp_path / "tokens.toml"
    assert main(["token", "add", "alice", "--file", str(path), "--max-streams", "4", "--admin"]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("qd_") and token not in path.read_text() and digest(token) in path.read_text()
    assert path.stat().st_mode & 0o077 == 0
    assert Auth(tokens_file=path).client(f"Bearer {token}", "ipv4:10.0.0.1") == Client("user:alice", "alice", 4, True)
    assert main(["token", "list", "--file", str(path)]) == 0
    listed = capsys.readouterr().out
    assert "alice" in listed and "max_streams=4" in listed and token not in listed
    assert main(["token", "add", "bad id", "--file", str(path)]) == 2
    assert "user id" in capsys.readouterr().err
    assert main(["token", "remove", "alice", "--file", str(path)]) == 0
    assert TokensFile.read(path).users == {}
    assert main(["token", "remove", "alice", "--file", str(path)]) == 2


def test_sighup_reloads_the_tokens_file_of_a_running_server(tmp_path):
    """`quickdraft serve` re-reads security.auth_tokens_file on SIGHUP: a user
    added to the file after the start is let in without a restart."""
    import os
    import signal

    from quickdraft.server.app import QuickdraftServer
    from quickdraft.server.config import load_config
    from tests.test_service import FakeEngine

    path, _ = tokens_file(tmp_path, alice={})
    cfg = load_config(env={}, overrides={"server.port": 0, "telemetry.metrics_port": 0, "security.auth_tokens_file": str(path)})

    async def factory(cfg, mode, live=False):
        return FakeEngine(mode, live)

    server = QuickdraftServer(cfg, engine_factory=factory)

    async def run() -> bool:
        serving = asyncio.create_task(server.serve_forever())
        for _ in range(200):
            await asyncio.sleep(0.05)
            if server.engines.state == "serving":
                break
        tf = TokensFile.read(path)
        carol = tf.add("carol")
        tf.write(path)
        before = server.auth.allows(f"Bearer {carol}")
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if server.auth.allows(f"Bearer {carol}"):
                break
        after = server.auth.client(f"Bearer {carol}", "ipv4:127.0.0.1").user
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(serving, 30) == 0
        return before, after

    assert asyncio.run(run()) == (False, "carol")


# --- configuration: remote binds, TLS, tokens --------------------------------------------------


def test_a_remote_bind_needs_tls_and_auth_or_the_loud_opt_out(tmp_path, monkeypatch):
    monkeypatch.delenv("QUICKDRAFT_AUTH_TOKEN", raising=False)
    base = {"server.host": "0.0.0.0", "server.allow_remote": "true"}
    with pytest.raises(ConfigError) as err:
        load_config(env={}, overrides=base).validate(check_files=False, check_vllm=False)
    assert "TLS" in str(err.value) and "auth" in str(err.value) and "security.allow_insecure_remote" in str(err.value)
    load_config(env={}, overrides={**base, "security.allow_insecure_remote": "true"}).validate(check_files=False, check_vllm=False)


def test_a_tls_key_that_does_not_match_is_a_config_error_naming_both_files(tmp_path):
    from tests.integration.test_security import _cert, _pem
    from cryptography.hazmat.primitives.asymmetric import ec

    k1, k2 = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "cert.pem").write_bytes(_pem(_cert("localhost", k1, "localhost", k1, server=True)))
    (tmp_path / "key.pem").write_bytes(_pem(k2))
    cfg = load_config(env={}, overrides={"security.tls_cert_file": str(tmp_path / "cert.pem"), "security.tls_key_file": str(tmp_path / "key.pem")})
    with pytest.raises(ConfigError) as err:
        cfg.validate(check_files=False, check_vllm=False)
    assert "tls_cert_file" in str(err.value) and "tls_key_file" in str(err.value) and "port" not in str(err.value)


def test_one_shared_token_and_a_tokens_file_exclude_each_other(tmp_path):
    path, _ = tokens_file(tmp_path, alice={})
    shared = tmp_path / "token"
    shared.write_text("t")
    cfg = load_config(env={}, overrides={"security.auth_tokens_file": str(path), "security.auth_token_file": str(shared)})
    with pytest.raises(ConfigError) as err:
        cfg.validate(check_files=False, check_vllm=False)
    assert "exclude each other" in str(err.value)


# --- engine manager: memory and retirement ------------------------------------------------------


@pytest.mark.parametrize("util, drain", [(0.9, True), (0.5, True), (0.45, False), (0.3, False)])
def test_on_a_gpu_a_second_engine_is_built_beside_the_first_only_when_both_fit(util, drain):
    cfg = load_config(env={}, overrides={"engine.device": "cuda", "engine.gpu_memory_utilization": str(util), "controller.standby_engines": "2"})
    manager = EngineManager(cfg)
    assert manager.needs_drain_for_rebuild() is drain
    assert manager.standby_capacity == (0 if drain else 2)


@pytest.mark.parametrize("retire_timeout_s, stopped_mid_stream", [(0.05, True), (30.0, False)])
def test_a_retired_engine_runs_its_streams_for_server_retire_timeout_s(retire_timeout_s, stopped_mid_stream):
    """After a rebuild switch the old engine is stopped when its last stream
    ends, or once server.retire_timeout_s has passed (default 600 s)."""

    async def run():
        engines = []

        async def factory(cfg, spec, live=False):
            engines.append(FakeEngine(spec, steps=[("x", 1)] * 10, delay=0.05))
            return engines[-1]

        cfg = load_config(env={}, overrides={"server.retire_timeout_s": str(retire_timeout_s)})
        manager = EngineManager(cfg, engine_factory=factory)
        service = CompletionService(cfg, manager, Telemetry("embedded"))
        await manager.start(SpecConfig(True, 3))
        stream = asyncio.create_task(collect_all(service))
        await asyncio.sleep(0.1)
        assert await manager.switch(SpecConfig(True, 5))
        await asyncio.sleep(0.2)
        dead_mid_stream = engines[0].dead
        msgs = await stream
        await asyncio.sleep(0.1)
        return engines, msgs, dead_mid_stream

    engines, msgs, dead_mid_stream = asyncio.run(run())
    assert dead_mid_stream is stopped_mid_stream
    assert engines[0].dead and not engines[1].dead


async def collect_all(service):
    return [m async for m in service.complete(pb.CompleteRequest(prefix="x"), "c")]


def test_retire_timeout_defaults_to_ten_minutes():
    assert load_config(env={}).server.retire_timeout_s == 600.0


# --- nothing in what callers see names a local path ---------------------------------------------


def test_server_info_names_models_without_their_paths(tmp_path):
    local = tmp_path / "models" / "target"
    local.mkdir(parents=True)
    assert public_model_name(str(local)) == "models/target"
    assert public_model_name("Qwen/Qwen3-Coder-30B-A3B-Instruct") == "Qwen/Qwen3-Coder-30B-A3B-Instruct"

    async def run():
        async def factory(cfg, spec, live=False):
            return FakeEngine(spec, drafter=str(local))

        cfg = load_config(env={})
        manager = EngineManager(cfg, engine_factory=factory)
        service = CompletionService(cfg, manager, Telemetry("embedded"))
        await manager.start(SpecConfig(True, 3))
        return service.server_info()

    info = asyncio.run(run())
    assert not info.model.startswith("/") and str(tmp_path) not in info.speculative.drafter, (info.model, info.speculative.drafter)


def test_server_info_reads_the_hardware_and_vllm_version_once_per_process(monkeypatch):
    """GetServerInfo runs on the event loop: /proc/cpuinfo and package metadata
    are read at the first call only."""
    from quickdraft.server import engine

    reads = []
    monkeypatch.setattr(engine, "cpu_model", lambda: reads.append("cpuinfo") or "a CPU")
    engine.hardware_description.cache_clear()
    engine.vllm_version.cache_clear()
    try:
        first = [engine.hardware_description(), engine.vllm_version()]
        assert [engine.hardware_description(), engine.vllm_version()] == first
        assert reads.count("cpuinfo") <= 1
        assert engine.hardware_description.cache_info().hits == 1 and engine.vllm_version.cache_info().hits == 1
    finally:
        engine.hardware_description.cache_clear()
        engine.vllm_version.cache_clear()
