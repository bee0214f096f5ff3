"""The log: text or JSON lines, the start-up banner, one line a exchange that never carries content."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy import logs
from proxy.cli import main, version
from proxy.config import Config, load_config
from proxy.errors import ConfigError
from proxy.logs import TEXT_FORMAT, JsonFormatter, log_banner, log_exchange

TEXT = logging.Formatter(TEXT_FORMAT)
JSON = JsonFormatter()
TOKEN = "tok-SECRET-3141"


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """`logs.setup` reconfigures the process's logging; put back what pytest and other tests rely on."""
    names = ["", "uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"]
    saved = [(logging.getLogger(n), logging.getLogger(n).handlers[:], logging.getLogger(n).level,
              logging.getLogger(n).propagate) for n in names]
    try:
        yield
    finally:
        for logger, handlers, level, propagate in saved:
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


def test_json_formatter_one_valid_object_a_line_with_extra_fields():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSON)
    logger = logging.getLogger("ctxproxy.test-json")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        logger.warning("two\nlines for %s", "you", extra={"session": "s-1", "tokens_in": 12,
                                                            "path": Path("/x")})
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["message"] == "two\nlines for you"
    assert (first["level"], first["logger"]) == ("WARNING", "ctxproxy.test-json")
    assert (first["session"], first["tokens_in"], first["path"]) == ("s-1", 12, "/x")
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    assert not {"args", "msg", "levelno", "pathname"} & first.keys()  # record internals are not fields
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exc_info"]


FULL = {"saved_usd": 0.5, "cost_usd": 0.0123, "added_ms": 3.25, "upstream_ms": 812, "recalls": 0,
        "internal_rounds": 1, "evictions": 2, "masked": 4, "summaries": 3, "tokens_cached": 900,
        "tokens_out": 40, "tokens_in": 1200, "gate": "prune", "status": 200, "route": "chat",
        "model": "gpt-4o", "policy": "coding-agent", "session": "sess-1"}


def exchange_records(caplog, fields) -> list[logging.LogRecord]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ctxproxy.exchange"):
        log_exchange(fields)
    return [r for r in caplog.records if r.name == "ctxproxy.exchange"]


def test_exchange_text_line_has_a_fixed_field_order(caplog):
    [record] = exchange_records(caplog, FULL)  # given in reverse order
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "exchange session=sess-1 policy=coding-agent model=gpt-4o route=chat status=200 gate=prune "
        "tokens_in=1200 tokens_out=40 tokens_cached=900 summaries=3 masked=4 evictions=2 "
        "internal_rounds=1 recalls=0 upstream_ms=812 added_ms=3.25 cost_usd=0.0123 saved_usd=0.5")
    assert TEXT.format(record).endswith(" INFO ctxproxy.exchange: " + record.getMessage())

    [partial] = exchange_records(caplog, {"session": "s", "status": 502})
    assert partial.getMessage() == "exchange session=s status=502"  # missing fields are left out


def test_exchange_json_has_every_field_as_a_key(caplog):
    [record] = exchange_records(caplog, FULL)
    line = JSON.format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "exchange"
    assert {key: out[key] for key in FULL} == FULL


def test_exchange_never_logs_what_is_not_allow_listed(caplog):
    leaky = {"session": "s-9\n", "model": "m\nexchange session=forged", "route": "chat",
             "messages": [{"role": "user", "content": "SECRET-1"}], "content": "SECRET-2",
             "prompt": "SECRET-3", "policy": {"text": "SECRET-4"}, "gate": ["SECRET-5"],
             "tokens_in": float("nan"), "status": b"SECRET-6"}
    [record] = exchange_records(caplog, leaky)
    text, line = TEXT.format(record), JSON.format(record)
    for rendered in (text, line):
        assert "SECRET" not in rendered
    dropped = {"messages", "content", "prompt", "policy", "gate", "tokens_in", "status"}
    assert not dropped & vars(record).keys()
    # A value that could forge a field or a line is quoted, so the text log stays one line a exchange.
    assert text.count("\n") == 0 and 'model="m\\nexchange session=forged"' in text
    assert 'session="s-9\\n"' in text
    assert json.loads(line)["model"] == "m\nexchange session=forged"


def test_exchange_truncates_long_strings(caplog):
    [record] = exchange_records(caplog, {"session": "x" * 5000})
    assert len(record.session) <= 201


@pytest.fixture
def admin_config(tmp_path, monkeypatch) -> Config:
    monkeypatch.setenv("CTXPROXY_TEST_ADMIN", TOKEN)
    return Config.model_validate({
        "data_dir": str(tmp_path / "data"), "admin": {"token_env": "CTXPROXY_TEST_ADMIN"},
        "upstream": {"base_url": "https://user:pw-SECRET@llm.example:8443/v1?key=SECRET-q",
                     "anthropic_base_url": "https://api.anthropic.com"}})


def banner_records(caplog, config: Config, host: str) -> list[logging.LogRecord]:
    with caplog.at_level(logging.INFO, logger="ctxproxy.serve"):
        log_banner(config, host=host, port=8899, version="9.9.9", policies=["coding-agent", "default"],
                   policies_dir=Path("/srv/policies"))
    return [r for r in caplog.records if r.name == "ctxproxy.serve"]


def test_banner_says_what_runs_and_never_the_token(caplog, admin_config, tmp_path):
    [record] = banner_records(caplog, admin_config, "127.0.0.1")  # loopback: no warning
    text, line = TEXT.format(record), JSON.format(record)
    for rendered in (text, line):
        assert TOKEN not in rendered and "SECRET" not in rendered
    assert "ctxproxy 9.9.9 listening on http://127.0.0.1:8899" in text
    assert "coding-agent, default from /srv/policies" in text
    assert "https://llm.example:8443/v1 (OpenAI-compatible)" in text
    assert "https://api.anthropic.com (Anthropic)" in text
    assert str((tmp_path / "data").resolve()) in text
    assert "on (token from $CTXPROXY_TEST_ADMIN; loopback clients only)" in text
    assert "http://127.0.0.1:8899/ctxproxy/ui (admin token required)" in text
    out = json.loads(line)
    assert out["policies"] == ["coding-agent", "default"] and out["version"] == "9.9.9"
    assert out["data_dir"] == str((tmp_path / "data").resolve())


def test_banner_without_a_token_and_on_all_interfaces_warns(caplog, tmp_path, monkeypatch):
    monkeypatch.delenv("CTXPROXY_TEST_ADMIN", raising=False)
    config = Config.model_validate({"data_dir": str(tmp_path),
                                    "admin": {"token_env": "CTXPROXY_TEST_ADMIN"}})
    info, warning = banner_records(caplog, config, "0.0.0.0")
    assert "admin API    off ($CTXPROXY_TEST_ADMIN is empty or unset)" in info.getMessage()
    assert "http://127.0.0.1:8899/ctxproxy/ui (loopback only)" in info.getMessage()
    assert warning.levelno == logging.WARNING and "0.0.0.0, not a loopback address" in warning.getMessage()
    caplog.clear()
    assert len(banner_records(caplog, Config(), "::1")) == 1
    assert logs.is_loopback("localhost") and not logs.is_loopback("example.com")


def test_log_format_is_validated(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  log_format: xml\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert f"{path}: server.log_format: Input should be 'text' or 'json'" in raised.value.message
    path.write_text("server:\n  log_format: json\n")
    assert load_config(path).server.log_format == "json"


def test_serve_flag_overrides_the_config_and_uvicorn_logs_the_same_way(tmp_path, monkeypatch, capsys):
    import litellm  # noqa: F401  (what the server imports: its filter stamps uvicorn.error's records)
    import uvicorn

    import proxy.app
    import proxy.malloc

    ran: dict = {}
    built: dict = {}
    monkeypatch.setattr(proxy.app, "build_app", lambda config, **kwargs: built.update(kwargs) or "app")
    monkeypatch.setattr(proxy.malloc, "tune", lambda: None)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: ran.update(kwargs))
    config = tmp_path / "c.yaml"
    config.write_text("server: {log_format: text}\ndata_dir: data\n")
    with logging_restored():
        assert main(["serve", "--config", str(config), "--log-format", "json", "--port", "8899"]) == 0
        logging.getLogger("uvicorn.error").info("Application startup complete.")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(lines) == 2, lines
    banner, uvicorn_line = lines
    assert banner["logger"] == "ctxproxy.serve" and banner["version"] == version()
    assert banner["message"] == f"ctxproxy {version()} listening on http://127.0.0.1:8899"
    assert uvicorn_line["logger"] == "uvicorn.error"
    assert uvicorn_line["message"] == "Application startup complete."
    assert set(uvicorn_line) == {"time", "level", "logger", "message"}  # no library's record stamps
    assert ran["log_config"]["formatters"]["ctxproxy"] == {"()": JsonFormatter}
    assert built == {"settle_collector": True}  # the server's own process tunes the collector once up
