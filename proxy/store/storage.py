"""The storage a server or a CLI command uses, chosen by the config: SQLite in `<data_dir>/archive.db`
by default, PostgreSQL when `archive.url` names one. Callers see one interface: the writer (a queue
and a spool in front of the database, proxy/archive.py), the read side (`ArchiveQueries`) and pins."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from proxy.accounting import Pricing
from proxy.config import Config

if TYPE_CHECKING:
    from proxy.archive import ArchiveWriter
    from proxy.pins import PinStore
    from proxy.reader import SearchHits
    from proxy.store.ledger import SessionLedger
    from proxy.tokens import TokenCounter


class ArchiveQueries(Protocol):
    """The read side: ArchiveReader (SQLite) and PostgresReader answer the same questions the same way."""

    settle: Callable[[float], object] | None  # set by open_storage to the writer's flush

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """A read-only query written in the SQL both databases share, `?` placeholders."""
        ...

    def sessions(self, limit: int = 50) -> list[dict[str, Any]]: ...

    def chain(self, leaf: str | None) -> list[dict[str, Any]]: ...

    def exchanges(self, session_id: str) -> list[dict[str, Any]]: ...

    def conversation(self, session_id: str) -> list[dict[str, Any]]: ...

    def search(self, query: str, *, tenant: str | None = None, session_id: str | None = None,
               policy: str | None = None, exclude_session: str | None = None, limit: int = 10,
               deadline: float | None = None) -> SearchHits: ...

    def recall(self, tenant: str, session_id: str, policy: str, query: str, limit: int = 8, *,
               timeout: float | None = None) -> SearchHits: ...

    def wait_for_writer(self, limit_s: float | None = None) -> None: ...

    def session_window(self, tenant: str, session_id: str) -> dict[str, Any] | None: ...

    def tool_result_rows(self, tenant: str, session_id: str) -> list[dict[str, Any]]: ...

    def tool_result_by_handle(self, tenant: str, handle: str) -> dict[str, Any] | None: ...

    def archived_result(self, tenant: str, session_id: str | None, handle: str) -> dict[str, Any] | None: ...

    def session_memory(self, tenant: str, session_id: str, kind: str) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


@dataclass
class Storage:
    kind: str  # "sqlite" | "postgresql"
    name: str  # the archive's path, or its URL without a password
    writer: ArchiveWriter
    reader: ArchiveQueries
    pins: PinStore
    ledger: SessionLedger | None = None  # PostgreSQL: replicas agree on each session's state through it

    def health(self) -> str | None:
        """None when the database answers; else what is wrong (for /healthz)."""
        try:
            self.reader.rows("select 1 as ok")
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc).strip()[:200]}"
        return None

    def close(self) -> None:
        self.writer.close()
        self.reader.close()
        self.pins.close()
        if self.ledger is not None:
            self.ledger.close()


def is_postgres(config: Config) -> bool:
    return config.archive.url is not None


def describe(config: Config) -> str:
    from proxy.store.postgres import redacted

    return redacted(config.archive.url) if config.archive.url else str(config.data_dir / "archive.db")


def open_reader(config: Config) -> ArchiveQueries:
    if config.archive.url:
        from proxy.store.postgres_reader import PostgresReader

        return PostgresReader(config.archive.url, pool_size=config.archive.pool_size)
    from proxy.reader import ArchiveReader

    return ArchiveReader(config.data_dir / "archive.db")


def open_pins(config: Config, tokens: TokenCounter) -> PinStore:
    from proxy.pins import PinStore

    recheck_s = config.server.reload_check_s
    if config.archive.url:
        return PinStore(None, tokens, url=config.archive.url, recheck_s=recheck_s)
    return PinStore(config.data_dir / "archive.db", tokens, recheck_s=recheck_s)


def open_storage(config: Config, tokens: TokenCounter, *, pricing: Pricing | None = None,
                 on_exchange: Callable[[list[dict[str, Any]]], None] | None = None) -> Storage:
    """The writer first (it creates and migrates the database), then the readers."""
    from proxy.archive import ArchiveWriter

    target = None
    if config.archive.url:
        from proxy.store.postgres import PostgresTarget

        url = config.archive.url

        def target() -> PostgresTarget:
            return PostgresTarget(url)

    # The data dir holds the spool (and the lock) either way: each replica has its own.
    writer = ArchiveWriter(config.data_dir / "archive.db", pricing=pricing, on_exchange=on_exchange,
                           target=target)
    try:
        reader = open_reader(config)
        reader.settle = writer.flush
        pins = open_pins(config, tokens)
        ledger = None
        if config.archive.url:
            from proxy.store.ledger import PostgresLedger

            ledger = PostgresLedger(config.archive.url, config.archive.pool_size)
    except BaseException:
        writer.close()
        raise
    return Storage("postgresql" if config.archive.url else "sqlite", describe(config), writer, reader, pins,
                   ledger)
