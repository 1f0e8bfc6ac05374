"""uvicorn embedded in quickdraft's event loop, so one engine and one
admission count serve gRPC and HTTP alike."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

import uvicorn
from fastapi import FastAPI

from quickdraft.server.config import QuickdraftConfig
from quickdraft.server.config.http import trusted_proxy_networks
from quickdraft.server.config.validation import check_tls_files

log = logging.getLogger("quickdraft.http")


class _EmbeddedUvicorn(uvicorn.Server):
    """quickdraft owns SIGTERM/SIGINT (graceful drain of both protocols), so uvicorn must not take them."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def _bind(host: str, port: int) -> socket.socket:
    """Bind here rather than in uvicorn: a taken port is a clear OSError, and port 0's pick is known at once."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise OSError(f"could not bind the HTTP API to {host}:{port} ({e.strerror}); pick another port with --http-port or http.port") from None
    return sock


class HttpServer:
    """Serves ``app`` on cfg.http.host:cfg.http.port (0: a free port, then read
    ``.port``), with the server's TLS settings and shutdown grace."""

    def __init__(self, cfg: QuickdraftConfig, app: FastAPI):
        self.cfg = cfg
        self.app = app
        self.port = 0
        self._server: _EmbeddedUvicorn | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> int:
        cfg = self.cfg
        # Settings that would fail inside uvicorn are ConfigErrors here, before binding.
        proxies = trusted_proxy_networks(cfg.http)
        check_tls_files(cfg.security)
        sock = _bind(cfg.http.host, cfg.http.port)
        self.port = sock.getsockname()[1]
        sec = cfg.security
        config = uvicorn.Config(
            self.app,
            loop="none",
            lifespan="off",
            ws="none",
            log_config=None,
            access_log=False,
            server_header=False,
            # uvicorn believes X-Forwarded-For from loopback by default: any local
            # user could then pose as another client and take its stream quota.
            # Only the proxies named in http.trusted_proxies are believed.
            proxy_headers=bool(proxies),
            forwarded_allow_ips=proxies,
            # In-flight streams get the same grace as gRPC's on shutdown (0: none).
            timeout_graceful_shutdown=cfg.server.grace_period_s,  # type: ignore[arg-type]
            ssl_certfile=sec.tls_cert_file,
            ssl_keyfile=sec.tls_key_file,
            ssl_ca_certs=sec.tls_client_ca_file,
            ssl_cert_reqs=ssl.CERT_REQUIRED if sec.tls_client_ca_file else ssl.CERT_NONE,
        )
        self._server = _EmbeddedUvicorn(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http-api")
        while not self._server.started:
            if self._task.done():
                sock.close()  # uvicorn leaves the socket it was given open
                self._task.result()  # raises what stopped it
                raise RuntimeError("the HTTP API stopped while starting")
            await asyncio.sleep(0.01)
        scheme = "https" if sec.tls_cert_file else "http"
        log.info("OpenAI-compatible HTTP API on %s://%s:%d/v1", scheme, cfg.http.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        except Exception:  # noqa: BLE001 - stopping anyway
            log.exception("HTTP API stopped with an error")
        self._server = None
