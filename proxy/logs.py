"""What the proxy says in its log: the format (text or JSON lines), the start-up banner, one line a exchange.

Everything goes through the stdlib logging; `setup` returns the dictConfig that uvicorn is given too, so
its own lines come out in the same format.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import logging.config
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from proxy.config import Config

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has; anything else on a record came from `extra=` and is a field.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message", "asctime", "taskName",
    "color_message",  # uvicorn's coloured duplicate of the message
    "litellm_redacted",  # litellm's redaction filter stamps records it has scrubbed
}


class Structured:
    """A message whose text line differs from its JSON `message` (in JSON the fields say the rest)."""

    def __init__(self, headline: str, text: str) -> None:
        self.headline = headline
        self.text = text

    def __str__(self) -> str:
        return self.text


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, then the record's `extra` fields."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.msg.headline if isinstance(record.msg, Structured) else record.getMessage()
        created = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        out: dict[str, Any] = {"time": created.isoformat(timespec="milliseconds"),
                               "level": record.levelname, "logger": record.name, "message": message}
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and key not in out:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        # default=str: a field of an unexpected type is shown, never a reason to lose the line.
        return json.dumps(out, default=str, ensure_ascii=False)


def logging_config(level: str, log_format: LogFormat) -> dict[str, Any]:
    """One stderr handler on the root logger; uvicorn's loggers hand their records to it."""
    formatter: dict[str, Any] = {"()": JsonFormatter} if log_format == "json" else {"format": TEXT_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,  # ctxproxy's module-level loggers exist before this runs
        "formatters": {"ctxproxy": formatter},
        "handlers": {"ctxproxy": {"class": "logging.StreamHandler", "formatter": "ctxproxy",
                                  "stream": "ext://sys.stderr"}},
        "root": {"level": level.upper(), "handlers": ["ctxproxy"]},
        "loggers": {name: {"handlers": [], "propagate": True, "level": level.upper()}
                    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")},
    }


def setup(level: str, log_format: LogFormat) -> dict[str, Any]:
    """Configure logging now and return the config for `uvicorn.run(log_config=...)`."""
    config = logging_config(level, log_format)
    logging.config.dictConfig(config)
    return config


# --- one line a exchange -------------------------------------------------------------------------------

EXCHANGE_FIELDS = ("session", "policy", "model", "route", "status", "gate", "tokens_in", "tokens_out",
                   "tokens_cached", "summaries", "masked", "evictions", "internal_rounds", "recalls",
                   "upstream_ms", "added_ms", "cost_usd", "saved_usd")
_MAX_TEXT = 200  # a field is an id or a number; a long string is content passed by mistake
_BARE = re.compile(r"[\w.:/@+-]+")
exchange_log = logging.getLogger("ctxproxy.exchange")


def _field(value: Any) -> str | int | float | bool | None:
    """The value if it is a short scalar, else None (dropped): no structure, no content."""
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if len(value) <= _MAX_TEXT else value[:_MAX_TEXT] + "…"
    return None


def _text(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".")
    # Quoted when it could be misread: a space, an `=` or a newline must not forge another field or line.
    return value if _BARE.fullmatch(value) else json.dumps(value, ensure_ascii=False)


def log_exchange(fields: Mapping[str, Any]) -> None:
    """Log one exchange at INFO on "ctxproxy.exchange": only the allow-listed fields, never content."""
    if not exchange_log.isEnabledFor(logging.INFO):
        return
    kept = {key: value for key in EXCHANGE_FIELDS if key in fields
            and (value := _field(fields[key])) is not None}
    line = " ".join(f"{key}={_text(value)}" for key, value in kept.items())
    exchange_log.info(Structured("exchange", f"exchange {line}".rstrip()), extra=kept)


# --- the start-up banner -------------------------------------------------------------------------------

banner_log = logging.getLogger("ctxproxy.serve")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost, or "" (all interfaces)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _url_host(host: str) -> str:
    """The host as it goes in a URL one can open: all interfaces are reachable on loopback."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else _bracket(host)


def _safe_url(url: str) -> str:
    """The URL without user:password or query: some providers take a key there."""
    try:
        parts = urlsplit(url)
        netloc = _bracket(parts.hostname or "") + (f":{parts.port}" if parts.port is not None else "")
    except ValueError:
        return "(not a valid URL)"
    return parts._replace(netloc=netloc, query="").geturl() if parts.hostname else url


def banner_fields(config: Config, *, host: str, port: int, version: str, policies: Sequence[str],
                  policies_dir: Path | None) -> dict[str, Any]:
    token = config.admin_token()
    env = config.admin.token_env
    if env is None:
        admin = "off (admin.token_env is not set)"
    elif token is None:
        admin = f"off (${env} is empty or unset)"
    else:
        admin = f"on (token from ${env}; " + (
            "remote clients allowed)" if config.admin.allow_remote else "loopback clients only)")
    ui = f"http://{_url_host(host)}:{port}/ctxproxy/ui"
    return {
        "version": version,
        "listen": f"http://{_bracket(host)}:{port}",
        "upstream": _safe_url(config.upstream.base_url),
        "anthropic_upstream": _safe_url(config.upstream.anthropic_base_url),
        "policies": list(policies),
        "policies_dir": str(policies_dir.resolve()) if policies_dir else None,
        "data_dir": str(config.data_dir.resolve()),
        "archive": describe_archive(config),
        "admin_api": admin,
        "ui": ui,
        "ui_access": "admin token required" if token else "loopback only",
    }


def describe_archive(config: Config) -> str:
    if config.archive.url:
        from proxy.store.postgres import redacted

        return f"PostgreSQL {redacted(config.archive.url)} (shared by replicas; spool in the data folder)"
    return f"SQLite {config.data_dir.resolve() / 'archive.db'} (one process)"


def log_banner(config: Config, *, host: str, port: int, version: str, policies: Sequence[str],
               policies_dir: Path | None) -> None:
    """Once at start: what this proxy is, where it listens and forwards, what it loaded. Never a secret."""
    f = banner_fields(config, host=host, port=port, version=version, policies=policies,
                      policies_dir=policies_dir)
    headline = f"ctxproxy {version} listening on {f['listen']}"
    text = "\n".join((
        headline,
        f"  upstream     {f['upstream']} (OpenAI-compatible), {f['anthropic_upstream']} (Anthropic)",
        f"  policies     {', '.join(f['policies'])} from {f['policies_dir'] or 'nowhere: built-in default'}",
        f"  data folder  {f['data_dir']}",
        f"  archive      {f['archive']}",
        f"  admin API    {f['admin_api']}",
        f"  UI           {f['ui']} ({f['ui_access']})",
    ))
    banner_log.info(Structured(headline, text), extra=f)
    if not is_loopback(host):
        key = config.upstream.api_key_env
        banner_log.warning(
            "listening on %s, not a loopback address: anyone who can reach port %d can send requests "
            "through this proxy%s", host or "all interfaces", port,
            f" (with the upstream key from ${key})" if key and config.upstream_api_key() else "")
