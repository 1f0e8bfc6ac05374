"""Security of the OpenAI-compatible HTTP front end on a real ``QuickdraftServer``
(gRPC and HTTP on loopback, the fake engine of test_security: no vLLM):
HTTPS from the server's TLS settings, a bad certificate or key reported as
such before anything binds, and a tokens-file user who is one client with one
quota on both protocols.

Certificates are made at test time with ``cryptography`` (the test extra).
"""

from __future__ import annotations

import socket
import ssl

import grpc
import httpx
import pytest

from quickdraft.client import CompletionClient
from quickdraft.server.config import ConfigError, load_config
from quickdraft.server.openai.http_server import HttpServer
from tests.integration.test_security import NO_RETRY, FakeServer, _cert, _pem, fake_config
from tests.integration.test_serve import wait_until

BODY = {"model": "embedded", "prompt": "x = ", "max_tokens": 2}


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    """A self-signed certificate for localhost and 127.0.0.1, its key, another key, and a file that is no PEM."""
    from cryptography.hazmat.primitives.asymmetric import ec  # a test dependency (pyproject's test extra): never a skip

    d = tmp_path_factory.mktemp("self-signed")
    key = ec.generate_private_key(ec.SECP256R1())
    (d / "cert.pem").write_bytes(_pem(_cert("localhost", key, "localhost", key, server=True)))
    (d / "key.pem").write_bytes(_pem(key))
    (d / "other_key.pem").write_bytes(_pem(ec.generate_private_key(ec.SECP256R1())))
    (d / "garbage.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    return d


@pytest.fixture(scope="module")
def https_server(self_signed, tmp_path_factory):
    """TLS and a tokens file: alice may hold one stream, bob the default."""
    from quickdraft.server.auth import TokensFile

    tf = TokensFile()
    tokens = {"alice": tf.add("alice", max_streams=1), "bob": tf.add("bob")}
    path = tmp_path_factory.mktemp("users") / "tokens.toml"
    tf.write(path)
    s = FakeServer(fake_config(http__enabled=True, http__port=0, limits__max_streams_per_client=4, security__auth_tokens_file=str(path),
                               security__tls_cert_file=str(self_signed / "cert.pem"), security__tls_key_file=str(self_signed / "key.pem")))
    s.tokens = tokens
    s.url = f"https://127.0.0.1:{s.server.http.port}"
    s.trust = ssl.create_default_context(cafile=str(self_signed / "cert.pem"))
    yield s
    s.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_https_serves_the_api_with_a_self_signed_certificate(https_server):
    s = https_server
    with httpx.Client(base_url=s.url, verify=s.trust, timeout=30) as c:
        r = c.post("/v1/completions", json=BODY, headers=bearer(s.tokens["bob"]))
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "xx", r.text
        assert r.extensions["network_stream"].get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        assert c.get("/v1/models", headers=bearer(s.tokens["bob"])).json()["data"][0]["id"] == "embedded"
        assert c.post("/v1/completions", json=BODY, headers=bearer("made-up")).status_code == 401


def test_https_refuses_plaintext_and_clients_that_do_not_trust_the_certificate(https_server):
    s = https_server
    port = s.server.http.port
    with pytest.raises(httpx.TransportError):  # no HTTP answer to plaintext: nothing was read as a request
        httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY, headers=bearer(s.tokens["bob"]), timeout=10)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.post(f"{s.url}/v1/completions", json=BODY, headers=bearer(s.tokens["bob"]), verify=ssl.create_default_context(), timeout=10)


def test_a_user_is_one_client_with_one_quota_on_grpc_and_http(https_server, self_signed, caplog):
    s = https_server
    creds = grpc.ssl_channel_credentials(root_certificates=(self_signed / "cert.pem").read_bytes())
    seen: list[str] = []
    s.server.service.observers.callbacks.append(lambda record, spec: seen.append(record.user))
    with CompletionClient(f"localhost:{s.port}", credentials=creds, token=s.tokens["alice"], timeout=30, retry=NO_RETRY) as alice_grpc, \
            httpx.Client(base_url=s.url, verify=s.trust, timeout=30) as c:
        stream = alice_grpc.complete(prefix="x", max_tokens=500)
        next(iter(stream))
        # alice's one stream is taken on gRPC: HTTP counts the same user.
        r = c.post("/v1/completions", json=BODY, headers=bearer(s.tokens["alice"]))
        assert r.status_code == 429 and "this user's max_streams (1)" in r.json()["error"]["message"], r.text
        with caplog.at_level("INFO", logger="quickdraft.requests"):
            r = c.post("/v1/completions", json=BODY, headers=bearer(s.tokens["bob"]))
        assert r.status_code == 200, r.text
        stream.cancel()
    assert wait_until(lambda: s.server.service.admission.open == 0, timeout=10)
    assert "bob" in seen
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    assert "user=bob" in logged and not any(t in logged for t in s.tokens.values())


def test_a_remote_http_bind_is_accepted_with_tls_and_auth(self_signed, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cr3t-team-token-0123456789abcdef")
    remote = {"http.enabled": "true", "http.host": "0.0.0.0", "server.allow_remote": "true"}
    with pytest.raises(ConfigError, match="http.host"):
        load_config(env={}, overrides={**remote, "security.auth_token_file": str(token)}).validate(check_files=False, check_vllm=False)
    load_config(env={}, overrides={**remote, "security.auth_token_file": str(token), "security.tls_cert_file": str(self_signed / "cert.pem"),
                                   "security.tls_key_file": str(self_signed / "key.pem")}).validate(check_files=False, check_vllm=False)


@pytest.mark.parametrize(
    "cert, key, names",
    [
        ("cert.pem", "other_key.pem", "tls_key_file"),  # a key, not the certificate's
        ("garbage.pem", "key.pem", "tls_cert_file"),
        ("cert.pem", "missing.pem", "tls_key_file"),
    ],
)
async def test_a_bad_certificate_or_key_is_a_clear_error_before_binding(self_signed, cert, key, names):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = load_config(env={})
    cfg.http.port = port
    cfg.security.tls_cert_file, cfg.security.tls_key_file = str(self_signed / cert), str(self_signed / key)
    with pytest.raises(ConfigError) as err:
        await HttpServer(cfg, app=None).start()  # type: ignore[arg-type]
    assert names in str(err.value) and "port" not in str(err.value), err.value
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nothing was left bound
