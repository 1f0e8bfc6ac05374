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

from quickdraft.lsp_bridge.settings import Settings


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--server",
        default=Settings.server,
        help="quickdraft gRPC server, HOST:PORT (default %(default)s); editors may override it",
    )
    parser.add_argument("--tcp", metavar="HOST:PORT", type=_host_port, help="listen on TCP instead of stdio")
    parser.add_argument("--auth-token-file", default="", help="file with a bearer token for the server")
    parser.add_argument("--tls", action="store_true", help="connect to the server with TLS")
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
        debounce_ms=args.debounce_ms,
    )
    server = create_server(settings)
    if args.tcp:
        host, port = args.tcp
        server.start_tcp(host, port)
    else:
        server.start_io()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = configure_parser(argparse.ArgumentParser(prog="quickdraft lsp", description=__doc__.split("\n")[0]))
    return run(parser.parse_args(argv))
