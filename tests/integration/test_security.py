"""Security over real gRPC on loopback: bearer-token auth (file or environment),
TLS and mutual TLS, loopback-only binding, message-size and per-client limits,
and source code kept out of logs, spans and metric labels on error paths.

Auth, TLS and limits run on real ``QuickdraftServer``s (interceptor,
credentials, admission and servicer as in production) with a fake engine that
streams one token per 20 ms, so they need no vLLM engine start. Certificates
are made at test time with ``cryptography`` (declared in the test extra). The source-code test runs on the
shared real server (marked ``engine``).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from quickdraft.client import CompletionClient, RetryPolicy
from quickdraft.server.config import ConfigError, load_config
from quickdraft.server.engine import EngineSnapshot
from quickdraft.server.presets import embedded_dir
from quickdraft.server.prompt_tokens import PromptTokenizer
from quickdraft.v1 import completion_pb2 as pb
from quickdraft.v1.completion_pb2_grpc import CompletionStub
from tests.integration.conftest import LoopThread
from tests.integration.test_serve import LONG, wait_until

NO_RETRY = RetryPolicy(max_attempts=1)
TOKEN = "s3cr3t-team-token-0123456789abcdef"
SERVICE = "quickdraft.v1.Completion"


# --- a fake engine behind a real server ---------------------------------------------------


class FakeEngine:
    """What CompletionService needs from an engine: streams one "x" per 20 ms up to max_tokens."""

    def __init__(self, cfg, spec, live=False):
        from transformers import AutoTokenizer

        self.spec = spec
        self.live = False  # runs one setting for its life
        self.switches = 0
        self.tokenizer = AutoTokenizer.from_pretrained(str(embedded_dir() / "target"))
        self.prompt_tokens = PromptTokenizer(self.tokenizer)
        self.stop_token_ids = [0]
        self.snapshot = EngineSnapshot()
        self.dead = False
        self.unfinished: set[str] = set()

    @classmethod
    async def start(cls, cfg, spec, live=False):
        return cls(cfg, spec, live)

    def can_switch_to(self, spec):
        return spec == self.spec

    def describe(self):
        return self.spec.label()

    async def generate(self, request_id, prompt_ids, sampling):
        self.unfinished.add(request_id)
        try:
            for i in range(sampling.max_tokens):
                await asyncio.sleep(0.02)
                last = i == sampling.max_tokens - 1
                yield SimpleNamespace(outputs=[SimpleNamespace(text="x", token_ids=[1], finish_reason="length" if last else None, spec_decode_metrics=None)])
        finally:
            self.unfinished.discard(request_id)

    async def abort(self, request_id):
        self.unfinished.discard(request_id)

    def num_unfinished(self):
        return len(self.unfinished)

    def engine_core_pids(self):
        return []

    def shutdown(self):
        self.dead = True


class FakeServer:
    def __init__(self, cfg):
        from quickdraft.server.app import QuickdraftServer

        self.cfg = cfg
        self.loop = LoopThread()

        async def boot():
            server = QuickdraftServer(cfg, engine_factory=FakeEngine.start)
            await server.start()
            await server.wait_ready(120)
            return server

        self.server = self.loop.run(boot(), timeout=180)

    @property
    def port(self) -> int:
        return self.server.port

    def stop(self):
        self.loop.run(self.server.shutdown(1.0), timeout=60)
        self.loop.stop()


def fake_config(**settings):
    cfg = load_config(env={})
    cfg.server.port = 0
    cfg.telemetry.metrics_port = 0
    cfg.http.enabled = False
    cfg.speculation.enabled = False
    for dotted, value in settings.items():
        section, key = dotted.split("__")
        setattr(getattr(cfg, section), key, value)
    cfg.validate(check_files=False, check_vllm=False)
    return cfg


# --- certificates ------------------------------------------------------------------------


def _pem(obj) -> bytes:
    from cryptography.hazmat.primitives import serialization

    if hasattr(obj, "private_bytes"):
        return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return obj.public_bytes(serialization.Encoding.PEM)


def _cert(subject: str, key, issuer_name: str, issuer_key, *, ca: bool = False, server: bool = False, client: bool = False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    b = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False, key_encipherment=False,
                                          data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    if client:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A throwaway CA with a server and a client certificate, and a rogue CA with its own client."""
    from cryptography.hazmat.primitives.asymmetric import ec  # a test dependency (pyproject's test extra): never a skip
    d = tmp_path_factory.mktemp("pki")
    out = {}
    for ca_name in ("ca", "rogue"):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _cert(f"quickdraft test {ca_name}", ca_key, f"quickdraft test {ca_name}", ca_key, ca=True)
        client_key = ec.generate_private_key(ec.SECP256R1())
        client_cert = _cert(f"editor ({ca_name})", client_key, f"quickdraft test {ca_name}", ca_key, client=True)
        out[ca_name] = _pem(ca_cert)
        out[f"{ca_name}_client_key"], out[f"{ca_name}_client_cert"] = _pem(client_key), _pem(client_cert)
        if ca_name == "ca":
            server_key = ec.generate_private_key(ec.SECP256R1())
            out["server_key"], out["server_cert"] = _pem(server_key), _pem(_cert("localhost", server_key, "quickdraft test ca", ca_key, server=True))
    for name, data in out.items():
        (d / f"{name}.pem").write_bytes(data)
    out["dir"] = d
    return out


def tls_client(pki, port: int, *, cert: str | None = "ca", token: str | None = TOKEN, trust: str = "ca") -> CompletionClient:
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki[trust],
        private_key=pki[f"{cert}_client_key"] if cert else None,
        certificate_chain=pki[f"{cert}_client_cert"] if cert else None,
    )
    return CompletionClient(f"127.0.0.1:{port}", credentials=creds, token=token, timeout=20, retry=NO_RETRY)


def code_of(fn) -> grpc.StatusCode | None:
    try:
        fn()
        return None
    except grpc.RpcError as e:
        return e.code()


# --- mutual TLS + token from a file --------------------------------------------------------


@pytest.fixture(scope="module")
def mtls_server(pki):
    token_file = pki["dir"] / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    cfg = fake_config(
        security__tls_cert_file=str(pki["dir"] / "server_cert.pem"),
        security__tls_key_file=str(pki["dir"] / "server_key.pem"),
        security__tls_client_ca_file=str(pki["dir"] / "ca.pem"),
        security__auth_token_file=str(token_file),
        limits__max_streams_per_client=3,
        limits__max_concurrent_streams=4,
        limits__max_request_bytes=128 * 1024,
        server__max_message_bytes=256 * 1024,
    )
    s = FakeServer(cfg)
    yield s
    s.stop()


def test_mtls_client_with_cert_and_token_is_served(pki, mtls_server):
    with tls_client(pki, mtls_server.port) as c:
        r = c.complete_text(prefix="def f():\n    ", max_tokens=3)
        assert r.text == "xxx" and r.final.completion_tokens == 3
        assert c.server_info().preset == "embedded"


@pytest.mark.parametrize("token", [None, "", "wrong", TOKEN[:-1], TOKEN + "x", TOKEN.upper()])
def test_missing_or_wrong_token_is_unauthenticated(pki, mtls_server, token):
    with tls_client(pki, mtls_server.port, token=token or None) as c:
        for call in (lambda: c.complete_text(prefix="x", max_tokens=1), c.server_info, c.controller_state):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "bearer token" in err.value.details()


def test_token_without_bearer_prefix_is_unauthenticated(pki, mtls_server):
    creds = grpc.ssl_channel_credentials(pki["ca"], pki["ca_client_key"], pki["ca_client_cert"])
    with grpc.secure_channel(f"127.0.0.1:{mtls_server.port}", creds) as ch:
        with pytest.raises(grpc.RpcError) as err:
            CompletionStub(ch).GetServerInfo(pb.GetServerInfoRequest(), metadata=[("authorization", TOKEN)], timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_health_stays_open_without_a_token(pki, mtls_server):
    creds = grpc.ssl_channel_credentials(pki["ca"], pki["ca_client_key"], pki["ca_client_cert"])
    with grpc.secure_channel(f"127.0.0.1:{mtls_server.port}", creds) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10).status
    assert status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("client", ["no certificate", "certificate from another CA", "plaintext"])
def test_mtls_refuses_clients_without_a_trusted_certificate(pki, mtls_server, client):
    if client == "plaintext":
        c = CompletionClient(f"127.0.0.1:{mtls_server.port}", token=TOKEN, timeout=10, retry=NO_RETRY)
    else:
        c = tls_client(pki, mtls_server.port, cert=None if client == "no certificate" else "rogue")
    with c:
        code = code_of(lambda: c.complete_text(prefix="x", max_tokens=1))
    assert code == grpc.StatusCode.UNAVAILABLE, code  # the handshake fails: no RPC reaches the server


def test_client_that_does_not_trust_the_server_ca_refuses_it(pki, mtls_server):
    with tls_client(pki, mtls_server.port, trust="rogue") as c:
        assert code_of(lambda: c.complete_text(prefix="x", max_tokens=1)) == grpc.StatusCode.UNAVAILABLE


def test_per_client_stream_limit_is_resource_exhausted_naming_it(pki, mtls_server):
    """max_streams_per_client = 3: the 4th concurrent stream of the same client is refused; after one ends, it is admitted."""
    with tls_client(pki, mtls_server.port) as c:
        streams = [c.complete(prefix="x", max_tokens=500, timeout=60) for _ in range(3)]
        its = [iter(s) for s in streams]
        for it in its:
            next(it)  # each stream is open
        with pytest.raises(grpc.RpcError) as err:
            c.complete_text(prefix="x", max_tokens=1)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_streams_per_client (3)" in err.value.details()
        streams[0].cancel()
        assert wait_until(lambda: mtls_server.server.service.admission.open == 2, timeout=10)
        assert c.complete_text(prefix="x", max_tokens=1).final.completion_tokens == 1
        for s in streams[1:]:
            s.cancel()
    assert wait_until(lambda: mtls_server.server.service.admission.open == 0, timeout=10)


def test_message_size_limits(pki, mtls_server):
    """Over limits.max_request_bytes: INVALID_ARGUMENT naming it; over server.max_message_bytes:
    RESOURCE_EXHAUSTED from gRPC, naming the byte limit; the server keeps serving."""
    with tls_client(pki, mtls_server.port) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.complete_text(prefix="a" * (200 * 1024), max_tokens=1)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "limits.max_request_bytes" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            c.complete_text(prefix="a" * (300 * 1024), max_tokens=1)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and str(256 * 1024) in err.value.details(), err.value.details()
        assert c.complete_text(prefix="x", max_tokens=1).final.completion_tokens == 1


# --- TLS only, token from the environment, health behind auth -------------------------------


@pytest.fixture(scope="module")
def tls_env_server(pki):
    mp = pytest.MonkeyPatch()
    mp.setenv("QUICKDRAFT_AUTH_TOKEN", TOKEN)
    cfg = fake_config(
        security__tls_cert_file=str(pki["dir"] / "server_cert.pem"),
        security__tls_key_file=str(pki["dir"] / "server_key.pem"),
        security__health_requires_auth=True,
        limits__max_concurrent_streams=2,
    )
    try:
        s = FakeServer(cfg)
    finally:
        mp.undo()  # the token was read at start
    yield s
    s.stop()


def test_tls_client_with_the_ca_and_env_token_is_served(pki, tls_env_server):
    with tls_client(pki, tls_env_server.port, cert=None) as c:
        assert c.complete_text(prefix="x", max_tokens=2).text == "xx"
    with tls_client(pki, tls_env_server.port, cert=None, token="nope") as c:
        assert code_of(lambda: c.complete_text(prefix="x", max_tokens=1)) == grpc.StatusCode.UNAUTHENTICATED


def test_plaintext_client_cannot_talk_to_a_tls_server(pki, tls_env_server):
    with CompletionClient(f"127.0.0.1:{tls_env_server.port}", token=TOKEN, timeout=10, retry=NO_RETRY) as c:
        assert code_of(c.server_info) == grpc.StatusCode.UNAVAILABLE


def test_health_behind_auth_when_configured(pki, tls_env_server):
    creds = grpc.ssl_channel_credentials(pki["ca"])
    with grpc.secure_channel(f"127.0.0.1:{tls_env_server.port}", creds) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        req = health_pb2.HealthCheckRequest(service=SERVICE)
        assert code_of(lambda: stub.Check(req, timeout=10)) == grpc.StatusCode.UNAUTHENTICATED
        ok = stub.Check(req, timeout=10, metadata=[("authorization", f"Bearer {TOKEN}")])
    assert ok.status == health_pb2.HealthCheckResponse.SERVING


def test_global_stream_limit_is_resource_exhausted_naming_it(pki, tls_env_server):
    with tls_client(pki, tls_env_server.port, cert=None) as c:
        streams = [c.complete(prefix="x", max_tokens=500, timeout=60) for _ in range(2)]
        for s in streams:
            next(iter(s))
        with pytest.raises(grpc.RpcError) as err:
            c.complete_text(prefix="x", max_tokens=1)
        for s in streams:
            s.cancel()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_concurrent_streams (2)" in err.value.details()
    assert wait_until(lambda: tls_env_server.server.service.admission.open == 0, timeout=10)


# --- no auth: per-client limits cannot be dodged with made-up tokens ---------------------------


@pytest.fixture(scope="module")
def plain_server():
    s = FakeServer(fake_config(limits__max_streams_per_client=2))
    yield s
    s.stop()


def test_made_up_tokens_do_not_escape_the_per_client_limit(plain_server):
    """Without auth the client is its peer address, whatever it puts in 'authorization'."""
    clients = [CompletionClient(f"127.0.0.1:{plain_server.port}", token=f"made-up-{i}", timeout=30, retry=NO_RETRY) for i in range(3)]
    try:
        streams = [c.complete(prefix="x", max_tokens=500) for c in clients[:2]]
        for s in streams:
            next(iter(s))
        with pytest.raises(grpc.RpcError) as err:
            clients[2].complete_text(prefix="x", max_tokens=1)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_streams_per_client (2)" in err.value.details()
        for s in streams:
            s.cancel()
    finally:
        for c in clients:
            c.close()
    assert wait_until(lambda: plain_server.server.service.admission.open == 0, timeout=10)


# --- health Watch: behind the token, and bounded ---------------------------------------------


def test_health_watch_needs_the_token_and_is_bounded(pki):
    cfg = fake_config(
        security__tls_cert_file=str(pki["dir"] / "server_cert.pem"),
        security__tls_key_file=str(pki["dir"] / "server_key.pem"),
        limits__max_health_watchers=2,
    )
    mp = pytest.MonkeyPatch()
    mp.setenv("QUICKDRAFT_AUTH_TOKEN", TOKEN)
    try:
        s = FakeServer(cfg)
    finally:
        mp.undo()
    try:
        with grpc.secure_channel(f"127.0.0.1:{s.port}", grpc.ssl_channel_credentials(pki["ca"])) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            req = health_pb2.HealthCheckRequest(service=SERVICE)
            assert stub.Check(req, timeout=10).status == health_pb2.HealthCheckResponse.SERVING  # Check stays open
            with pytest.raises(grpc.RpcError) as err:
                next(stub.Watch(req, timeout=10))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            md = [("authorization", f"Bearer {TOKEN}")]
            watches = [stub.Watch(req, timeout=30, metadata=md) for _ in range(2)]
            for w in watches:
                assert next(w).status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as err:
                next(stub.Watch(req, timeout=10, metadata=md))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limits.max_health_watchers (2)" in err.value.details()
            watches[0].cancel()
            assert wait_until(lambda: s.server.grpc.health.watchers == 1, timeout=10)
            third = stub.Watch(req, timeout=30, metadata=md)
            assert next(third).status == health_pb2.HealthCheckResponse.SERVING
            third.cancel()
            watches[1].cancel()
    finally:
        s.stop()


# --- a token per user -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def users_server(tmp_path_factory):
    from quickdraft.server.auth import TokensFile

    tf = TokensFile()
    tokens = {"alice": tf.add("alice", max_streams=2), "bob": tf.add("bob"), "ops": tf.add("ops", admin=True)}
    path = tmp_path_factory.mktemp("users") / "tokens.toml"
    tf.write(path)
    s = FakeServer(fake_config(security__auth_tokens_file=str(path), limits__max_streams_per_client=3))
    s.tokens, s.path = tokens, path
    yield s
    s.stop()


def test_each_user_has_its_own_quota_and_is_named_in_logs_never_by_token(users_server, caplog):
    port, tokens = users_server.port, users_server.tokens
    seen = []
    users_server.server.service.observers.callbacks.append(lambda record, spec: seen.append(record.user))
    alice = CompletionClient(f"127.0.0.1:{port}", token=tokens["alice"], timeout=30, retry=NO_RETRY)
    bob = CompletionClient(f"127.0.0.1:{port}", token=tokens["bob"], timeout=30, retry=NO_RETRY)
    try:
        streams = [alice.complete(prefix="x", max_tokens=500) for _ in range(2)]
        for st in streams:
            next(iter(st))
        with pytest.raises(grpc.RpcError) as err:
            alice.complete_text(prefix="x", max_tokens=1)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "this user's max_streams (2)" in err.value.details()
        # The same machine, another user: a quota of its own (a shared token used to share one).
        with caplog.at_level("INFO", logger="quickdraft.requests"):
            assert bob.complete_text(prefix="x", max_tokens=2).text == "xx"
        for st in streams:
            st.cancel()
    finally:
        alice.close()
        bob.close()
    assert "bob" in seen
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "user=bob" in logged and tokens["bob"] not in logged
    assert wait_until(lambda: users_server.server.service.admission.open == 0, timeout=10)


def test_an_unknown_token_is_unauthenticated_and_a_reload_lets_a_new_user_in(users_server):
    from quickdraft.server.auth import TokensFile

    tf = TokensFile.read(users_server.path)
    dave = tf.add("dave")
    with CompletionClient(f"127.0.0.1:{users_server.port}", token=dave, timeout=10, retry=NO_RETRY) as c:
        assert code_of(c.server_info) == grpc.StatusCode.UNAUTHENTICATED
        tf.write(users_server.path)
        users_server.server.reload_users()  # what SIGHUP calls
        assert c.server_info().preset == "embedded"


def test_pinning_the_config_needs_an_admin_user(users_server):
    with CompletionClient(f"127.0.0.1:{users_server.port}", token=users_server.tokens["bob"], timeout=10, retry=NO_RETRY) as c:
        with pytest.raises(grpc.RpcError) as err:
            c.pin_speculation("off")
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "admin" in err.value.details()
    with CompletionClient(f"127.0.0.1:{users_server.port}", token=users_server.tokens["ops"], timeout=10, retry=NO_RETRY) as c:
        assert c.pin_speculation("").applied == "released"


def test_server_info_names_no_local_path(users_server):
    with CompletionClient(f"127.0.0.1:{users_server.port}", token=users_server.tokens["bob"], timeout=10, retry=NO_RETRY) as c:
        info = c.server_info()
    assert not info.model.startswith("/") and str(Path.home()) not in info.model and "/work/" not in info.model, info.model


def test_a_bad_tls_key_is_reported_as_such_not_as_a_port_in_use(pki):
    from quickdraft.server.app import QuickdraftServer

    cfg = fake_config()
    cfg.security.tls_cert_file = str(pki["dir"] / "server_cert.pem")
    cfg.security.tls_key_file = str(pki["dir"] / "rogue_client_key.pem")  # another key
    server = QuickdraftServer(cfg, engine_factory=FakeEngine.start)
    with pytest.raises(ConfigError) as err:
        asyncio.run(server.grpc.start())
    assert "tls_key_file" in str(err.value) and "port" not in str(err.value)


# --- binding and secrets on the command line -------------------------------------------------


@pytest.mark.parametrize("setting", ["server.host", "http.host", "telemetry.metrics_host"])
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.invalid"])
def test_non_loopback_bind_needs_allow_remote(setting, host):
    cfg = load_config(env={}, overrides={setting: host})
    with pytest.raises(ConfigError) as err:
        cfg.validate(check_files=False, check_vllm=False)
    assert "server.allow_remote" in str(err.value) and setting in str(err.value)
    remote = {setting: host, "server.allow_remote": "true", "http.enabled": "true"}
    if setting == "telemetry.metrics_host":  # metrics carry no code or tokens
        load_config(env={}, overrides=remote).validate(check_files=False, check_vllm=False)
        return
    with pytest.raises(ConfigError) as err:  # code and tokens would cross the network in the clear
        load_config(env={}, overrides=remote).validate(check_files=False, check_vllm=False)
    assert setting in str(err.value) and "security.allow_insecure_remote" in str(err.value)
    load_config(env={}, overrides={**remote, "security.allow_insecure_remote": "true"}).validate(check_files=False, check_vllm=False)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_binds_need_nothing(host):
    load_config(env={}, overrides={"server.host": host}).validate(check_files=False, check_vllm=False)


def test_default_bind_is_loopback():
    assert load_config(env={}).server.host == "127.0.0.1"


def test_cli_refuses_remote_bind_and_has_no_token_flag():
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "quickdraft", "serve", "--host", "0.0.0.0", "--port", "0"], capture_output=True, text=True, timeout=120, cwd=repo)
    assert r.returncode == 2 and "server.allow_remote" in r.stderr, r.stderr
    from quickdraft.cli import build_parser

    serve = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "serve")[1]
    flags = [s for action in serve._actions for s in action.option_strings]
    assert not [f for f in flags if "token" in f or "secret" in f or "password" in f], flags


# --- source code never in logs, spans or metric labels (real engine) ------------------------


@pytest.mark.engine
def test_source_code_stays_out_of_logs_spans_and_metrics_on_error_paths(server, caplog):
    """A unique marker sent as code in requests that are refused, cut short,
    cancelled or fail must not appear in any log record, span or metric."""
    marker = "QDMARKER_err_c0ffee_never_log"
    caplog.set_level("DEBUG")
    code = f"# {marker}\ndef {marker}():\n    return '{marker}'\n"
    outcomes = {}
    with CompletionClient(server.address, timeout=60, retry=NO_RETRY) as c:
        cases = {
            "bad temperature": dict(prefix=code, temperature=float("nan")),
            "too long": dict(prefix=code * 400),
            "empty stop": dict(prefix=code, stop=[""]),
            "bad context path": dict(prefix=code, context_files=[("a\nb", code)]),
            "raw with suffix": dict(prefix=code, suffix=code, raw_prompt=True),
            # No suffix: a fill-in-the-middle request is answered in a few tokens, before any deadline.
            "deadline": dict(prefix=code + LONG, max_tokens=400, timeout=0.3),
            "ok with context": dict(prefix=code, suffix=code, context_files=[("lib.py", code)], file_path="m.py", max_tokens=4),
            "stop sequence": dict(prefix=code, stop=[marker[:20]], max_tokens=4),
        }
        for name, fields in cases.items():
            timeout = fields.pop("timeout", None)
            outcomes[name] = code_of(lambda: c.complete_text(timeout=timeout, **fields))
        stream = c.complete(prefix=code + LONG, max_tokens=400)
        next(iter(stream))
        stream.cancel()
    # Invalid UTF-8 right after the marker.
    with grpc.insecure_channel(server.address) as ch:
        raw = ch.unary_stream(f"/{SERVICE}/Complete", request_serializer=lambda b: b, response_deserializer=lambda b: b)
        body = marker.encode() + b"\xed\xa0\x80"
        outcomes["invalid utf-8"] = code_of(lambda: list(raw(b"\x12" + bytes([len(body)]) + body, timeout=10)))
    assert outcomes["bad temperature"] == grpc.StatusCode.INVALID_ARGUMENT
    assert outcomes["deadline"] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert outcomes["ok with context"] is None and outcomes["stop sequence"] is None
    assert outcomes["invalid utf-8"] == grpc.StatusCode.INVALID_ARGUMENT
    assert wait_until(lambda: server.engine.num_unfinished() == 0, timeout=30)

    assert marker not in caplog.text
    for record in caplog.records:
        assert marker not in record.getMessage() and marker not in str(record.args)
    assert any("finish=cancelled" in r.getMessage() for r in caplog.records), "the cancelled request's log line is missing"
    for span in server.spans.get_finished_spans():
        assert marker not in json.dumps({k: str(v) for k, v in (span.attributes or {}).items()}) and marker not in span.name
        assert all(marker not in str(e.attributes) for e in span.events)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.cfg.telemetry.metrics_port}/metrics", timeout=10).read().decode()
    assert marker not in metrics and "quickdraft_requests_rejected" in metrics
