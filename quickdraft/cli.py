"""The ``quickdraft`` command: serve, complete, pin, stats, token, model, lsp, tune, bench."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from quickdraft.server.config import QuickdraftConfig


# Flags that are shorthands for --set of one setting.
_SHORTHANDS = (("preset", "model.preset"), ("host", "server.host"), ("port", "server.port"),
               ("metrics_port", "telemetry.metrics_port"), ("http_port", "http.port"),
               ("replicas", "replicas.count"))  # --replicas: server/replicas/ (docs/scaling.md)


def serve_config(args: argparse.Namespace) -> QuickdraftConfig:
    """The configuration `quickdraft serve` runs with: --config, the
    QUICKDRAFT_* environment, then --set and the shorthand flags. Raises
    ConfigError naming the setting; does not validate."""
    from quickdraft.server.config import ConfigError, load_config

    overrides: dict[str, object] = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise ConfigError(f"--set expects path=value, e.g. controller.hysteresis.warm_margin=0.05; got {item!r}")
        overrides[key.strip()] = value
    for flag, key in _SHORTHANDS:
        value = getattr(args, flag)
        if value is not None:
            overrides[key] = value
    if args.http:
        overrides["http.enabled"] = True
    if args.controller:
        overrides["controller.enabled"] = True
    return load_config(args.config, overrides=overrides)


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from quickdraft.server.config import ConfigError

    try:
        cfg = serve_config(args)
        cfg.validate()
    except ConfigError as e:
        print(f"quickdraft serve: configuration error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.server.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if cfg.replicas.count:  # --replicas N: engine replicas on Ray Serve (server/replicas/)
        try:
            import ray.serve  # noqa: F401

            from quickdraft.server.replicas.ingress import ReplicaServer
        except ImportError as e:
            print(f"quickdraft serve: --replicas needs Ray Serve ({e}); install it: pip install -e '.[replicas]'", file=sys.stderr)
            return 2
        try:
            server = ReplicaServer(cfg)
        except ConfigError as e:
            print(f"quickdraft serve: configuration error: {e}", file=sys.stderr)
            return 2
        return asyncio.run(server.serve_forever())
    from quickdraft.server.app import QuickdraftServer

    return asyncio.run(QuickdraftServer(cfg).serve_forever())


def _split_location(spec: str) -> tuple[str, str]:
    """FILE:LINE:COL (1-based, column in characters) -> (prefix, suffix)."""
    path, line, col = spec.rsplit(":", 2)
    text = Path(path).read_text()
    lines = text.splitlines(keepends=True)
    ln, cn = int(line), int(col)
    if not 1 <= ln <= len(lines) + 1:
        raise ValueError(f"{spec}: line {ln} is outside 1..{len(lines) + 1}")
    offset = sum(len(x) for x in lines[: ln - 1])
    current = lines[ln - 1] if ln <= len(lines) else ""
    if not 1 <= cn <= len(current.rstrip("\n")) + 1:
        raise ValueError(f"{spec}: column {cn} is outside 1..{len(current.rstrip(chr(10))) + 1}")
    offset += cn - 1
    return text[:offset], text[offset:]


def _complete(args: argparse.Namespace) -> int:
    import grpc

    from quickdraft.client import CompletionClient

    if args.location == "-":
        # As at the end of a file: an empty suffix asks fill-in-the-middle there, which FIM-trained models
        # answer far better than a bare prefix (docs/lsp.md, "Prefix-only requests").
        prefix, suffix = sys.stdin.read(), ""
        path = ""
    else:
        try:
            prefix, suffix = _split_location(args.location)
        except (ValueError, OSError) as e:
            print(f"quickdraft complete: {e}", file=sys.stderr)
            return 2
        path = args.location.rsplit(":", 2)[0]
    token = Path(args.token_file).read_text().strip() if args.token_file else os.environ.get("QUICKDRAFT_AUTH_TOKEN")
    fields = dict(prefix=prefix, suffix=suffix, file_path=path, max_tokens=args.max_tokens, latency_class=args.latency_class,
                  strict_prompt=args.strict_prompt)
    if args.temperature is not None:
        fields["temperature"] = args.temperature
    with CompletionClient(args.server, token=token, timeout=args.timeout) as client:
        try:
            stream = client.complete(**fields)
            pieces = []
            for text in stream:
                pieces.append(text)
                if not args.json:
                    sys.stdout.write(text)
                    sys.stdout.flush()
        except grpc.RpcError as e:
            print(f"\nquickdraft complete: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    if args.json:
        from google.protobuf.json_format import MessageToDict

        print(json.dumps({"text": "".join(pieces), **MessageToDict(stream.final, preserving_proto_field_name=True)}, indent=2))
    else:
        sys.stdout.write("\n")
        note = prompt_fit_note(stream.final.prompt_fit)
        if note:
            print(f"quickdraft complete: {note}", file=sys.stderr)
    return 0


def prompt_fit_note(fit) -> str:
    """What the server cut to fit the prompt, in words; "" when nothing."""
    if not fit.truncated:
        return ""
    parts = [f"{n} {what}" for n, what in ((fit.prefix_chars_cut, "characters before the cursor"),
                                          (fit.suffix_chars_cut, "characters after it"),
                                          (fit.context_files_dropped, "context files")) if n]
    return f"the prompt was over the server's budget; it kept the text nearest the cursor and cut {', '.join(parts) or 'nothing'}"


def _pin(args: argparse.Namespace) -> int:
    import grpc

    from quickdraft.client import CompletionClient

    token = Path(args.token_file).read_text().strip() if args.token_file else os.environ.get("QUICKDRAFT_AUTH_TOKEN")
    config = "" if args.release else args.config
    if not config and not args.release:
        print("quickdraft pin: give a config (e.g. p5, ar3, off) or --release", file=sys.stderr)
        return 2
    with CompletionClient(args.server, token=token) as client:
        try:
            reply = client.pin_speculation(config, allow_rebuild=args.allow_rebuild)
        except grpc.RpcError as e:
            print(f"quickdraft pin: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    state = "pinned" if reply.pinned else "not pinned"
    print(f"{reply.config.label} ({state}; {reply.applied}, {reply.switch_ms:.1f} ms)")
    return 0


def format_stats(stats) -> str:
    """An OutcomeStats as a table for people: one row per language, latency
    class and speculative config, then the total."""
    import time

    header = ("language", "class", "config", "shown", "accepted", "partial", "rejected", "acceptance", "chars/shown", "on screen",
              "wasted: cancelled", "never shown")
    rows = [header]
    for g in [*stats.groups, stats.total]:
        rows.append((g.language or "total", g.latency_class, g.speculative_config, str(g.shown), str(g.accepted), str(g.partially_accepted),
                     str(g.rejected), f"{g.acceptance_rate:.1%}", f"{g.accepted_chars_per_shown:.1f}", f"{g.mean_shown_ms / 1000:.1f} s",
                     str(g.wasted_tokens_cancelled), str(g.wasted_tokens_never_shown)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stats.since_unix_time)) if stats.since_unix_time else "?"
    notes = (f"since {since}; {stats.reporting_sessions} editor sessions reporting; never shown: finished, not reported shown within "
             f"{stats.never_shown_grace_s:g} s (sessions that report only); {stats.unknown_request_ids} outcomes for unknown requests")
    return "\n".join([*lines, notes])


def _stats(args: argparse.Namespace) -> int:
    import grpc

    from quickdraft.client import CompletionClient

    token = Path(args.token_file).read_text().strip() if args.token_file else os.environ.get("QUICKDRAFT_AUTH_TOKEN")
    with CompletionClient(args.server, token=token) as client:
        try:
            stats = client.outcome_stats()
        except grpc.RpcError as e:
            print(f"quickdraft stats: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    if args.json:
        from google.protobuf.json_format import MessageToDict

        print(json.dumps(MessageToDict(stats, preserving_proto_field_name=True, always_print_fields_with_no_presence=True), indent=2))
    else:
        print(format_stats(stats))
    return 0


def _token(args: argparse.Namespace) -> int:
    """Manage security.auth_tokens_file: tokens are printed once, stored as digests."""
    from quickdraft.server.auth import TokensFile
    from quickdraft.server.config import ConfigError

    path = Path(args.file).expanduser()
    try:
        tokens = TokensFile.read(path) if path.exists() else TokensFile()
        if args.action == "add":
            if not args.user:
                raise ConfigError("give the user id: quickdraft token add USER")
            token = tokens.add(args.user, args.max_streams, True if args.admin else None)
            tokens.write(path)
            print(f"# user {args.user} in {path}; the token is shown once, give it to the user (their editor's token file):", file=sys.stderr)
            print(token)
            print("# the server reads the file on start and on SIGHUP (kill -HUP <pid>)", file=sys.stderr)
        elif args.action == "remove":
            if tokens.users.pop(args.user or "", None) is None:
                raise ConfigError(f"no user {args.user!r} in {path}")
            tokens.write(path)
            print(f"removed {args.user}; send the server SIGHUP to apply", file=sys.stderr)
        else:
            for u in tokens.users.values():
                limit = u.max_streams if u.max_streams is not None else "default"
                print(f"{u.name}\ttokens={len(u.digests)}\tmax_streams={limit}{chr(9) + 'admin' if u.admin else ''}")
    except ConfigError as e:
        print(f"quickdraft token: {e}", file=sys.stderr)
        return 2
    return 0


def _model(args: argparse.Namespace) -> int:
    """Models built here from installed packages (server/model_cache.py): list, build, verify, path."""
    from quickdraft.server import model_cache as mc

    names = [args.name] if args.name else list(mc.MODELS)
    if args.name and args.name not in mc.MODELS:
        print(f"quickdraft model: unknown model {args.name!r}; choose one of {', '.join(mc.MODELS)}", file=sys.stderr)
        return 2
    if args.action == "list":
        for n in names:
            state = "built" if mc.is_built(n) else "not built"
            print(f"{n}\t{state}\t{mc.model_dir(n)}\t{mc.MODELS[n].description}")
        return 0
    if not args.name:
        print(f"quickdraft model {args.action}: name the model ({', '.join(mc.MODELS)})", file=sys.stderr)
        return 2
    if args.action == "path":
        print(mc.model_dir(args.name))
        return 0
    if args.action == "verify":
        problems = mc.verify(mc.model_dir(args.name))
        for p in problems:
            print(f"quickdraft model verify: {p}", file=sys.stderr)
        if not problems:
            print(f"{args.name}: every file matches {mc.MANIFEST}")
        return 1 if problems else 0
    try:
        path = mc.build(args.name, force=args.force, progress=not args.no_progress)
    except mc.ModelBuildError as e:
        print(f"quickdraft model build: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quickdraft", description="Code completions with speculative decoding, for editors.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="start the gRPC server (embedded model by default)")
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument("--preset", help="embedded, smollm2-135m-base, qwen3-coder-30b-p-eagle, gpt-oss-20b-p-eagle, gpt-oss-120b-p-eagle, custom")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="gRPC port (default 50051)")
    p.add_argument("--metrics-port", type=int, help="Prometheus port (default 9464, 0 = off)")
    p.add_argument("--http", action="store_true", help="also serve the OpenAI-compatible HTTP API")
    p.add_argument("--http-port", type=int, help="HTTP API port (default 8000)")
    p.add_argument("--controller", action="store_true", help="let the adaptive controller pick K and the drafting mode")
    p.add_argument("--replicas", type=int, help="N engine replicas on Ray Serve, routed by session (docs/scaling.md; default 0: one engine, no Ray)")
    p.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="any setting by its dotted path (docs/configuration.md), e.g. controller.hysteresis.warm_margin=0.05; repeatable")
    p.set_defaults(func=_serve)

    p = sub.add_parser("complete", help="stream a completion at FILE:LINE:COL (or '-' for stdin) to the terminal")
    p.add_argument("location", help="FILE:LINE:COL (1-based) or - to read the prefix from stdin (as at the end of a file)")
    p.add_argument("--server", default="127.0.0.1:50051")
    p.add_argument("--max-tokens", type=int, default=0)
    p.add_argument("--temperature", type=float)
    p.add_argument("--latency-class", default="inline", choices=["inline", "chat", "batch"])
    p.add_argument("--timeout", type=float, default=30.0, help="deadline in seconds")
    p.add_argument("--token-file", help="file with the server's bearer token (default: $QUICKDRAFT_AUTH_TOKEN)")
    p.add_argument("--json", action="store_true", help="print text, timings and speculative figures as JSON")
    p.add_argument("--strict-prompt", action="store_true", help="refuse a file over the server's prompt budget instead of letting it cut it")
    p.set_defaults(func=_complete)

    p = sub.add_parser("pin", help="fix the server's speculative config (the controller stops choosing) until --release")
    p.add_argument("config", nargs="?", default="", help="off, p5 (P-EAGLE K=5), ar3 (EAGLE-3 K=3), or a schedule: 'parallel 1:K7 2+:K3'")
    p.add_argument("--release", action="store_true", help="release the pin; the controller chooses again")
    p.add_argument("--allow-rebuild", action="store_true", help="build another engine when the serving one cannot switch live")
    p.add_argument("--server", default="127.0.0.1:50051")
    p.add_argument("--token-file", help="file with the server's bearer token (default: $QUICKDRAFT_AUTH_TOKEN)")
    p.set_defaults(func=_pin)

    p = sub.add_parser("stats", help="what users kept: acceptance rate, accepted characters per shown suggestion, wasted tokens, "
                                     "by language and speculative config")
    p.add_argument("--server", default="127.0.0.1:50051")
    p.add_argument("--token-file", help="file with the server's bearer token (default: $QUICKDRAFT_AUTH_TOKEN)")
    p.add_argument("--json", action="store_true", help="print the OutcomeStats message as JSON")
    p.set_defaults(func=_stats)

    p = sub.add_parser("token", help="per-user tokens for security.auth_tokens_file: add (prints a new token once), remove, list")
    p.add_argument("action", choices=["add", "remove", "list"])
    p.add_argument("user", nargs="?", help="user id: letters, digits, . _ @ -")
    p.add_argument("--file", default="~/.config/quickdraft/tokens.toml", help="the tokens file (default: %(default)s)")
    p.add_argument("--max-streams", type=int, help="this user's stream limit (default: limits.max_streams_per_client)")
    p.add_argument("--admin", action="store_true", help="may call PinSpeculation")
    p.set_defaults(func=_token)

    p = sub.add_parser("model", help="models built on this machine from installed packages, no download (list, build, verify, path)")
    p.add_argument("action", choices=["list", "build", "verify", "path"])
    p.add_argument("name", nargs="?", help="e.g. smollm2-135m-base (quickdraft model list)")
    p.add_argument("--force", action="store_true", help="build again even if the cache has it")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_model)

    from quickdraft.lsp_bridge import cli as lsp_cli
    from quickdraft.bench import tune

    lsp_cli.add_subparser(sub)
    tune.add_subparser(sub)

    try:
        from quickdraft.bench import cli as bench_cli

        bench_cli.add_subparsers(sub)
    except ImportError:
        pass
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
