"""``quickdraft lsp``: start the language server (stdio by default).

Wire into the ``quickdraft`` console script with::

    from quickdraft.lsp_bridge import cli as lsp_cli
    lsp_cli.add_subparser(subparsers)   # adds "lsp", sets func=lsp_cli.run
    ...
    args = parser.parse_args(); args.func(args)

``python -m quickdraft.lsp_bridge`` runs the same thing standalone.
"""

from __future__ import annotations

import argparse
import logging
import sys

from quickdraft.client.request import is_loopback_host
from quickdraft.lsp_bridge.settings import Settings


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _loopback_host_port(value: str) -> tuple[str, int]:
    host, port = _host_port(value)
    # Whoever reaches the port drives the bridge (no authentication): it reads
    # workspace files into prompts and uses this user's token. Loopback only.
    if not is_loopback_host(host):
        raise argparse.ArgumentTypeError(
            f"{host} is not a loopback address: the language server has no authentication, "
            "so --tcp only listens on 127.0.0.1, ::1 or localhost (use stdio, the default, or an SSH tunnel for remote editors)"
        )
    return host, port


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--server",
        default=Settings.server,
        help="quickdraft gRPC server, HOST:PORT (default %(default)s); the editor's initializationOptions may override it, except over --tcp",
    )
    parser.add_argument(
        "--tcp",
        metavar="HOST:PORT",
        type=_loopback_host_port,
        help="listen on TCP instead of stdio: loopback only, and any local user can connect, so not on shared machines",
    )
    parser.add_argument("--auth-token-file", default="", help="file with a bearer token for the server")
    parser.add_argument("--tls", action="store_true", help="connect to the server with TLS")
    parser.add_argument("--tls-root-cert-file", default="", help="PEM root certificates for --tls (default: system roots)")
    parser.add_argument("--debounce-ms", type=int, default=Settings.debounce_ms, help="pause before asking the model (default %(default)s)")
    parser.add_argument("--log-file", help="write logs here (default: stderr)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def add_subparser(subparsers) -> argparse.ArgumentParser:
    """Add the ``lsp`` command to an argparse subparsers object."""
    parser = subparsers.add_parser("lsp", help="language server for editors (LSP over stdio or TCP)")
    configure_parser(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    # stdout carries the protocol in stdio mode: logs go to stderr or a file.
    handler = logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(args.log_level)
    # pygls logs every message body at INFO; keep that for DEBUG.
    logging.getLogger("pygls").setLevel(max(logging.WARNING, root.level) if args.log_level != "DEBUG" else logging.DEBUG)

    from quickdraft.lsp_bridge.server import create_server

    settings = Settings(
        server=args.server,
        auth_token_file=args.auth_token_file,
        tls=args.tls,
        tls_root_cert_file=args.tls_root_cert_file,
        debounce_ms=args.debounce_ms,
    )
    # Over TCP the client is whoever connects, not the editor that started us:
    # only the command line sets where code and the token go.
    server = create_server(settings, editor_sets_connection=not args.tcp)
    if args.tcp:
        host, port = args.tcp
        server.start_tcp(host, port)
    else:
        server.start_io()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = configure_parser(argparse.ArgumentParser(prog="quickdraft lsp", description=__doc__.split("\n")[0]))
    return run(parser.parse_args(argv))
