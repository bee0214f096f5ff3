"""`ctxproxy` command line: a thin wrapper over plain functions."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import orjson

from proxy.config import Config, load_config
from proxy.errors import ConfigError, CtxProxyError


def _config(args: argparse.Namespace) -> Config:
    return load_config(Path(args.config) if getattr(args, "config", None) else None)


def cmd_serve(args: argparse.Namespace) -> int:
    # aiohttp makes two TLS contexts when imported (reading the system's CA files, ~0.1 s, with the GIL
    # released): imported beside the rest of the start-up, not before it.
    threading.Thread(target=importlib.import_module, args=("aiohttp",), name="ctxproxy-import",
                     daemon=True).start()
    from proxy.data_dir_lock import DataDirLock

    config = _config(args)
    # Another process on this data dir: one clean line now, not a traceback from the server's startup.
    DataDirLock.check(config.data_dir)

    import uvicorn

    from proxy import logs, malloc
    from proxy.app import build_app
    from proxy.policy import PolicyStore

    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    log_config = logs.setup(config.server.log_level, args.log_format or config.server.log_format)
    malloc.tune()  # large buffers go back to the OS when freed (see proxy/malloc.py)
    app = build_app(config, settle_collector=True)  # checks every policy first: the banner lists what loaded
    store = PolicyStore(config.policies_dir)
    logs.log_banner(config, host=host, port=port, version=version(), policies=store.names(),
                    policies_dir=store.folder)
    # (ws="none": no route speaks WebSocket, so its protocol module is not imported at start)
    uvicorn.run(app, host=host, port=port, log_level=config.server.log_level, loop="uvloop", ws="none",
                http="httptools", access_log=False, timeout_graceful_shutdown=30, log_config=log_config,
                timeout_keep_alive=config.server.keep_alive_s)
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from proxy import shipped

    for line in shipped.init(Path(args.dir)):
        print(line)
    print(f"run: ctxproxy serve --config {Path(args.dir) / 'config.yaml'}")
    return 0


def cmd_policy_check(args: argparse.Namespace) -> int:
    from proxy.policy import load_policy_file

    failed = 0
    for name in args.files:
        try:
            load_policy_file(Path(name))
        except ConfigError as exc:
            failed += 1
            print(exc.message, file=sys.stderr)
        else:
            print(f"{name}: ok")
    return 1 if failed else 0


def _reader(args: argparse.Namespace):
    from proxy.store.storage import open_reader

    return open_reader(_config(args))


def cmd_sessions(args: argparse.Namespace) -> int:
    with contextlib.closing(_reader(args)) as reader:  # (PostgreSQL: a pool, closed)
        rows = reader.sessions(limit=args.limit)
    if args.json:
        print(orjson.dumps(rows).decode())
        return 0
    print(f"{'session':<34} {'source':<22} {'turns':>5} {'tokens in':>10} {'forwarded':>10}  last activity")
    for row in rows:
        print(f"{row['session_id']:<34} {row['source'] or '':<22} {row['turns']:>5} "
              f"{row['tokens_before'] or 0:>10} {row['tokens_after'] or 0:>10}  {row['last_activity']}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Spent, baseline and saved dollars, tokens and what the proxy did: totals, or one row per group."""
    from proxy import report

    filters = report.Filters(session=args.session, policy=args.policy, model=args.model, since=args.since)
    by = args.by or ("none" if args.session else "policy")
    with contextlib.closing(_reader(args)) as reader:
        rows = [report.totals(reader, filters)] if by == "none" else report.grouped(reader, by, filters)
        if by != "none" and args.format == "table":
            rows.append({"key": "(all)", **report.totals(reader, filters)})
    print(report.render(rows, args.format, key=None if by == "none" else by))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    with contextlib.closing(_reader(args)) as reader:
        messages = reader.conversation(args.session)
    if not messages:
        print(f"no session {args.session!r} in the archive", file=sys.stderr)
        return 1
    if args.json:
        print(orjson.dumps(messages, option=orjson.OPT_INDENT_2).decode())
        return 0
    for message in messages:
        print(f"--- {message.get('role')}" + (f" ({message['tool_call_id']})" if message.get("tool_call_id")
                                              else ""))
        content = message.get("content")
        if content is not None:
            print(content if isinstance(content, str) else orjson.dumps(content).decode())
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            print(f"[tool call {call.get('id')}] {function.get('name')}({function.get('arguments')})")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    with contextlib.closing(_reader(args)) as reader:
        rows = reader.search(args.query, session_id=args.session, limit=args.limit)
    if args.json:
        print(orjson.dumps(rows).decode())
        return 0
    if not rows:
        print("no matches")
    for row in rows:
        print(f"{row['created_at']}  {row['session_id']}  {row['role']}\n    {row['snippet']}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from proxy.policy import LoadedPolicy, PolicyStore, load_policy_file
    from proxy.replay import format_table, replay_files

    logging.getLogger("ctxproxy").setLevel(logging.ERROR)  # per-request gate logs would drown the table
    if args.policy.endswith((".yaml", ".yml")):
        loaded = load_policy_file(Path(args.policy))
    else:
        config = _config(args)
        folder = config.policies_dir or (Path("policies") if Path("policies").is_dir() else None)
        loaded = PolicyStore(folder).get(args.policy)
    if args.max_input_tokens:
        budget = loaded.policy.budget.model_copy(update={"max_input_tokens": args.max_input_tokens})
        loaded = LoadedPolicy(loaded.name, loaded.policy.model_copy(update={"budget": budget}), loaded.path)
    paths = [Path(p) for p in args.files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"ctxproxy replay: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    result = replay_files(paths, loaded, model=args.model, limit=args.limit)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() if args.json else format_table(result))
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    from proxy.encoders import use_cache_dir
    from proxy.policy import PolicyStore
    from proxy.store.storage import open_pins
    from proxy.tokens import TokenCounter

    config = _config(args)
    use_cache_dir(config.data_dir / "cache")  # a pin is counted: the server's cached ranks load faster
    policy = PolicyStore(config.policies_dir).get(args.policy)
    if args.pin_command == "add" and (args.file is None) == (args.text is None):
        print("ctxproxy pin add: give a FILE or --text TEXT", file=sys.stderr)
        return 2
    with contextlib.closing(open_pins(config, TokenCounter())) as store:
        if args.pin_command == "add":
            content = Path(args.file).read_text(encoding="utf-8") if args.file else args.text
            pin = store.add(policy, content, name=Path(args.file).name if args.file else "note")
            print(f"{pin.id}  {pin.tokens} tokens pinned to policy {policy.name!r}")
        elif args.pin_command == "rm":
            store.remove(policy.name, args.id)
            print(f"removed {args.id}")
        else:
            for pin in store.list(policy.name):
                print(f"{pin.id}  {pin.name:<24} {pin.tokens:>7} tokens  {pin.content[:60]!r}")
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    from proxy.summarize.preview import explain, preview, read_input

    result = preview(read_input(args.file), args.tool, args.arguments)
    if args.json:
        print(orjson.dumps(result.as_dict()).decode())
    elif result.replaced:
        print(result.text)
    else:
        print(explain(result))
        print(result.text)
    return 0


def version() -> str:
    """ctxproxy's version: the distribution's too (pyproject.toml reads it from here). Not asked of
    importlib.metadata, which scans every installed distribution: ~0.1 s of each command's start."""
    from proxy import __version__

    return __version__


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="ctxproxy", description="Context-managing OpenAI-compatible proxy.")
    top.add_argument("--version", action="version", version=f"ctxproxy {version()}")
    sub = top.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="config YAML (see config.example.yaml)")
    serve.add_argument("--host", help="bind address (default from config, else 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default from config, else 8787)")
    serve.add_argument("--log-format", choices=("text", "json"), help="overrides server.log_format")
    serve.set_defaults(func=cmd_serve)

    init = sub.add_parser("init", help="write config.yaml and policies/ (the shipped ones) into a folder")
    init.add_argument("dir", nargs="?", default=".", help="the folder (default: the current one)")
    init.set_defaults(func=cmd_init)

    policy = sub.add_parser("policy", help="policy files")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_sub.add_parser("check", help="validate policy files")
    check.add_argument("files", nargs="+")
    check.set_defaults(func=cmd_policy_check)

    replay = sub.add_parser("replay", help="run recorded conversations through the pipeline offline")
    replay.add_argument("files", nargs="+", help="JSONL files, one conversation a line")
    replay.add_argument("--policy", default="default", help="policy name (from policies_dir) or a .yaml path")
    replay.add_argument("--config", help="config YAML (for policies_dir)")
    replay.add_argument("--model", help="tokenize and size the window as this model")
    replay.add_argument("--max-input-tokens", type=int, help="override budget.max_input_tokens")
    replay.add_argument("--limit", type=int, help="at most this many conversations per file")
    replay.add_argument("--json", action="store_true")
    replay.set_defaults(func=cmd_replay)

    summarize = sub.add_parser("summarize",
                               help="print the summary layer 1 would put in place of a tool result")
    summarize.add_argument("file", help="the tool result (- for stdin)")
    summarize.add_argument("--tool", help="the tool's name, as in the assistant's tool call")
    summarize.add_argument("--arguments", help="the call's JSON arguments (line ranges, patterns)")
    summarize.add_argument("--json", action="store_true",
                           help="{replaced, original_tokens, summary_tokens, text}")
    summarize.set_defaults(func=cmd_summarize)

    pin = sub.add_parser("pin", help="runtime pins of a project (policy), shown in every request")
    pin_sub = pin.add_subparsers(dest="pin_command", required=True)
    for name, helptext in (("add", "pin a file or a text"), ("list", "list pins"), ("rm", "remove a pin")):
        command = pin_sub.add_parser(name, help=helptext)
        command.add_argument("--config", help="config YAML (data_dir, policies_dir)")
        command.add_argument("--policy", default="default", help="the project's policy (default: default)")
        if name == "add":
            command.add_argument("file", nargs="?", help="a text file to pin")
            command.add_argument("--text", help="pin this text instead of a file")
        if name == "rm":
            command.add_argument("id")
        command.set_defaults(func=cmd_pin)

    report = sub.add_parser("report", help="dollars spent and saved, tokens and what the proxy did")
    report.add_argument("--config", help="config YAML (its data_dir holds the archive)")
    report.add_argument("--session", help="only this session")
    report.add_argument("--policy", help="only this policy (project)")
    report.add_argument("--model", help="only this model")
    report.add_argument("--since", help="from this ISO date/time, or back from now: 30m, 24h, 7d, 2w")
    report.add_argument("--by", choices=["none", "session", "policy", "model", "day", "hour", "route"],
                        help="one row per group (default: policy; none with --session)")
    report.add_argument("--format", choices=["table", "csv", "json"], default="table")
    report.set_defaults(func=cmd_report)

    for name, func, helptext in (("sessions", cmd_sessions, "list archived sessions"),
                                 ("show", cmd_show, "print a session's conversation"),
                                 ("search", cmd_search, "full-text search over the archive")):
        command = sub.add_parser(name, help=helptext)
        command.add_argument("--config", help="config YAML (its data_dir holds the archive)")
        command.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "show":
            command.add_argument("session")
        if name == "search":
            command.add_argument("query")
            command.add_argument("--session", help="only this session")
        if name in ("sessions", "search"):
            command.add_argument("--limit", type=int, default=20 if name == "search" else 50)
        command.set_defaults(func=func)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (CtxProxyError, FileNotFoundError) as exc:
        print(f"ctxproxy: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
        return 2
