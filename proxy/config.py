"""Server configuration: a YAML file validated by pydantic, then loaded once at start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from proxy.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8787, ge=0, le=65535)
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)  # a client that stops sending its body gets a 408
    state_cache_bytes: int = Field(64 * 1024 * 1024, gt=0)  # in-process session state; the archive has all
    # Recent large request bodies, so a resent history is parsed only past what is new (0: off).
    resent_cache_bytes: int = Field(64 * 1024 * 1024, ge=0)
    # Policy files and pins changed outside this process (an edit, `ctxproxy pin add`, another replica) are
    # seen within this many seconds: a stat and a query a second, not a request (0: on every request).
    reload_check_s: float = Field(1.0, ge=0)
    # An idle client connection is kept open this long: longer than clients keep theirs (httpx 5 s, Node 4 s,
    # reqwest 90 s), so the client closes it first. One the server closes just as the client sends on it
    # fails that request (uvicorn's 5 s is httpx's too: a reset now and then, retried or not by the SDK).
    keep_alive_s: int = Field(120, gt=0)
    log_level: str = "info"
    log_format: Literal["text", "json"] = "text"  # json: one object a line, for log collectors


class UpstreamConfig(_Strict):
    base_url: str = "https://api.openai.com/v1"
    api_key_env: str | None = None
    # Anthropic's Messages API (and its other routes): the base without /v1, as ANTHROPIC_BASE_URL.
    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_api_key_env: str | None = None  # sent as x-api-key when the client sends no key
    timeout_s: float = Field(600.0, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    # Answers are buffered (and archived) up to this size; beyond it they are relayed unbuffered and the
    # archive keeps a marked prefix. A model's whole output is well under 1 MB; what is buffered here
    # stays as the process's memory high-water mark (measured: +5 MB at 1 MiB, +108 MB at 32 MiB).
    max_response_bytes: int = Field(4 * 1024 * 1024, gt=0)
    max_connections: int = Field(100, gt=0)
    # 0: a new connection per call. Else idle connections are kept (5 s) for reuse, up to max_connections:
    # the client (aiohttp) has no separate cap, so any other value means "keep alive".
    max_keepalive_connections: int = Field(20, ge=0)
    # Cookie, X-Forwarded-*, Forwarded and X-Real-IP are not sent upstream unless named here.
    forward_headers: list[str] = []


class AdminConfig(_Strict):
    token_env: str | None = None  # env var holding the admin API token; unset: the admin API is off
    allow_remote: bool = False  # answer non-loopback clients too


class TelemetryConfig(_Strict):
    """OpenTelemetry traces over OTLP/HTTP (proxy/telemetry.py); off unless otlp_endpoint is set."""

    otlp_endpoint: str | None = Field(None, pattern=r"^https?://\S+$")  # http://host:4318 (+ /v1/traces)
    service_name: str = "ctxproxy"
    headers: dict[str, str] = {}  # sent to the collector (also OTEL_EXPORTER_OTLP_HEADERS)
    timeout_s: float = Field(10.0, gt=0)  # per export, retries included


class ArchiveConfig(_Strict):
    """Where the archive lives: SQLite in data_dir (one process), or PostgreSQL shared by replicas."""

    # postgresql://user@host:5432/dbname; the password from PGPASSWORD or ~/.pgpass, never in the file
    url: str | None = None
    pool_size: int = Field(20, ge=2, le=500)  # connections per replica (sessions rewritten at once, reads)

    @field_validator("url")
    @classmethod
    def _postgres_only(cls, url: str | None) -> str | None:
        from proxy.store.postgres import check_url

        try:
            return check_url(url) if url else None
        except ConfigError as exc:
            raise ValueError(exc.message.removeprefix("archive.url: ")) from None


class ModelPrices(_Strict):
    """USD per million tokens for one model (litellm's bundled map is used for models not listed)."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float | None = Field(None, ge=0)  # null: billed as input
    cache_write: float | None = Field(None, ge=0)


class Config(_Strict):
    server: ServerConfig = ServerConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    admin: AdminConfig = AdminConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    archive: ArchiveConfig = ArchiveConfig()
    data_dir: Path = Path("./data")
    policies_dir: Path | None = None
    pricing: dict[str, ModelPrices] = {}  # per model, over litellm's bundled cost map

    def prices(self) -> dict[str, dict[str, float | None]]:
        return {model: prices.model_dump() for model, prices in self.pricing.items()}

    def admin_token(self) -> str | None:
        return os.environ.get(self.admin.token_env) or None if self.admin.token_env else None

    def upstream_api_key(self, anthropic: bool = False) -> str | None:
        """The fallback key for clients that send none, read from the named environment variable."""
        name = self.upstream.anthropic_api_key_env if anthropic else self.upstream.api_key_env
        return (os.environ.get(name) or None) if name else None


def describe_validation_error(source: str, error: ValidationError) -> str:
    """One line per problem: `file: dotted.key: reason`."""
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        reason = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
        lines.append(f"{source}: {key}: {reason}")
    return "\n".join(lines)


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_config(path: Path | None) -> Config:
    """Load and validate a config file; relative paths in it are taken from the file's folder."""
    if path is None:
        return Config()
    data = read_yaml_mapping(path)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(str(path), exc)) from None
    base = path.resolve().parent
    updates: dict[str, Any] = {}
    if not config.data_dir.is_absolute():
        updates["data_dir"] = base / config.data_dir
    if config.policies_dir is not None and not config.policies_dir.is_absolute():
        updates["policies_dir"] = base / config.policies_dir
    return config.model_copy(update=updates) if updates else config
