"""Archive items as rows, inside the writer's transaction: an exchange's message chains (content-addressed,
each distinct message stored once), its `exchanges` row with the parsed answer, and side-table rows.

Agents resend the whole history every turn, so the ids of the prefix a session sent last time are reused
from `ChainCache`: an LRU by session bounded in bytes, so a hundred long sessions cannot make the writer
hold hundreds of megabytes of old histories. A session that fell out of the cache is hashed in full
again, which gives the same ids: eviction costs time, never correctness."""

from __future__ import annotations

import logging
import sqlite3
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from proxy.accounting import Pricing, account
from proxy.archive_codec import cell, dumps, safe_text
from proxy.archive_db import insert_message, message_id
from proxy.archive_params import same_params
from proxy.archive_parse import ParsedResponse, integer, parse_response, raw_response

if TYPE_CHECKING:
    from proxy.archive import ExchangeRecord, TableRow

log = logging.getLogger("ctxproxy.archive")

CHAIN_CACHE_BYTES = 32 * 1024 * 1024  # default byte budget of the writer's last-chain-per-session cache
PARSED_PER_SERIALIZED = 2  # parsed messages / their JSON bytes: 1.2-3.8x on the shared traces, ~1.5 typical
CHAIN_CACHE_SESSIONS = 2000  # and at most this many entries, however small
PARAMS_SESSIONS = 2000  # sessions whose last request params (the objects) and their row id are remembered
PARAMS_BYTES = 8 * 1024 * 1024  # and about this many bytes of them as objects (ChainCache: twice their JSON)
ERROR_CHARS = 65536  # an error answer's text kept in exchanges.error
_SEEN_LIMIT = 500_000

ACTIVITY = ("round", "upstream_headers_ms", "overhead_ms", "client_cached_tokens", "forwarded_cached_tokens",
            "summaries", "masked", "evicted_results", "evictions", "internal_rounds", "recalls", "reads")
CONTENT_COLUMNS = ("params", "response_raw", "usage", "error")  # never handed on for logs and metrics

ChainKey = tuple[str, str, str]  # tenant, session id, "request" | "forwarded"


class ChainCache:
    """Per (tenant, session, kind): the message list last stored and its ids (or, kind "params", a request's
    params and their row id), least recently used first.

    Sizes are estimates given by the caller (the writer uses the serialized item's length); the sum stays
    at most `budget_bytes`, and an entry larger than the whole budget is not kept at all."""

    def __init__(self, budget_bytes: int = CHAIN_CACHE_BYTES,
                 max_entries: int = CHAIN_CACHE_SESSIONS) -> None:
        self.budget_bytes = budget_bytes
        self.max_entries = max_entries
        self.size = 0
        self._entries: OrderedDict[ChainKey, tuple[list[Any], list[str], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: ChainKey) -> tuple[list[Any], list[str]]:
        entry = self._entries.get(key)
        if entry is None:
            return [], []
        self._entries.move_to_end(key)
        return entry[0], entry[1]

    def put(self, key: ChainKey, messages: list[Any], ids: list[str], size: int) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.size -= old[2]
        # Parsed messages take more room than their serialized size in Python objects.
        size = max(int(size), 1) * PARSED_PER_SERIALIZED
        if size > self.budget_bytes or self.max_entries <= 0:
            return
        self._entries[key] = (messages, ids, size)
        self.size += size
        while self.size > self.budget_bytes or len(self._entries) > self.max_entries:
            _, (_, _, evicted) = self._entries.popitem(last=False)
            self.size -= evicted

    def clear(self) -> None:
        self._entries.clear()
        self.size = 0


def quote(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


class RowWriter:
    """Writes decoded items on `conn`, inside a transaction the caller opens and commits. After a
    rollback the caller must call `forget` (ids remembered as written were rolled back too)."""

    def __init__(self, conn: sqlite3.Connection, chain_budget_bytes: int = CHAIN_CACHE_BYTES,
                 pricing: Pricing | None = None) -> None:
        self._conn = conn
        self._seen: set[str] = set()
        self.chains = ChainCache(chain_budget_bytes)
        self.stale = False  # replaying set-aside records: never overwrite a row written since
        self.pricing = pricing or Pricing()
        self.written: list[dict[str, Any]] = []  # exchange rows of the open transaction (no content)
        self.last_params = ChainCache(PARAMS_BYTES, PARAMS_SESSIONS)
        self._statements: dict[tuple[str, str, tuple[str, ...]], str] = {}

    def forget(self) -> None:
        self._seen.clear()
        self.chains.clear()
        self.last_params.clear()
        self.written.clear()

    def begin(self, items: list[ExchangeRecord | TableRow]) -> None:
        """A transaction of these items starts (one writer per database here: nothing to do)."""

    def table_row(self, item: TableRow) -> None:
        self._row("INSERT OR REPLACE" if item.replace and not self.stale else "INSERT OR IGNORE",
                  item.table, item.row)

    def _row(self, verb: str, table: str, row: dict[str, Any]) -> None:
        """One row; the statement is built once per (verb, table, columns) and reused."""
        key = (verb, table, tuple(row))
        statement = self._statements.get(key)
        if statement is None:
            statement = self._statements[key] = (
                f"{verb} INTO {quote(table)} ({', '.join(quote(k) for k in row)}) "
                f"VALUES ({', '.join('?' * len(row))})")
        self._conn.execute(statement, [cell(v) for v in row.values()])

    def exchange(self, record: ExchangeRecord, size: int) -> None:
        """The exchange's chains and row; `size` (its serialized length) sizes its chain-cache entries."""
        request_leaf = self._store_chain(record.request_messages or [], record, size)
        forwarded_leaf = request_leaf
        if record.forwarded_messages is not None:
            forwarded_leaf = self._store_chain(record.forwarded_messages, record, size, "forwarded")
        row: dict[str, Any] = {
            "id": record.id, "created_at": record.created_at, "session_id": record.session_id,
            "session_source": record.session_source, "tenant": record.tenant, "policy": record.policy,
            "route": record.route, "model": record.model, "stream": int(bool(record.stream)),
            "status": record.status, "latency_ms": round(float(record.latency_ms or 0), 3),
            "upstream_ms": round(float(record.upstream_ms or 0), 3), "tokens_before": record.tokens_before,
            "tokens_after": record.tokens_after, "gate": record.gate, "request_leaf": request_leaf,
            "forwarded_leaf": forwarded_leaf, "params_id": self._params_id(record), "error": record.error,
            "response_truncated": int(bool(record.response_truncated)),
            **{name: getattr(record, name) for name in ACTIVITY},
        }
        raw = raw_response(record)
        if 200 <= (integer(record.status) or 0) < 300:
            row.update(self._response_fields(record, request_leaf, raw))
        elif raw:
            if not record.error:
                row["error"] = raw[:ERROR_CHARS].decode("utf-8", "replace")
            if len(raw) > ERROR_CHARS:
                row["response_raw"] = raw
        prices = self.pricing.for_model(record.model)
        row.update(account(row, prices))
        if prices is not None and row.get("cost_source"):
            row["prices"] = dumps(prices.as_dict()).decode()
        written = row.copy()  # (a copy in C, then four pops: a filtering loop costs ~50 steps a row)
        for name in CONTENT_COLUMNS:
            written.pop(name, None)
        self.written.append(written)
        self._row("INSERT OR IGNORE" if self.stale else "INSERT OR REPLACE", "exchanges", row)

    def _params_id(self, record: ExchangeRecord) -> str:
        """The `request_params` row of the record's params, written when new: a session sends the same
        ones every turn (the very objects as last time: neither serialized nor hashed again)."""
        params, tenant = record.params, record.tenant
        key = (tenant, record.session_id, "params")
        last, ids = self.last_params.get(key)
        body = None
        if last and same_params(last[0], params):
            node = ids[0]
        else:
            body = dumps(params)
            node = message_id(f"params:{tenant}", body)
            self.last_params.put(key, [params], [node], len(body))
        if node not in self._seen:
            self._row("INSERT OR IGNORE", "request_params", {
                "id": node, "tenant": tenant, "body": (body or dumps(params)).decode(),
                "created_at": record.created_at})
            self._remember(node)
        return node

    def _store_chain(self, messages: list[Any], record: ExchangeRecord, size: int,
                     kind: str = "request") -> str:
        # Reuse the ids of the prefix this session sent last time (a dict comparison is far cheaper than
        # serializing and hashing it again).
        messages = messages if isinstance(messages, list) else [messages]
        key = (record.tenant, record.session_id, kind)
        previous, previous_ids = self.chains.get(key)
        shared = _shared_prefix(previous, messages)
        ids = previous_ids[:shared]
        parent = ids[-1] if ids else f"tenant:{record.tenant}"
        for message in messages[shared:]:
            body = dumps(message)
            node = message_id(parent, body)
            if node not in self._seen:
                # What was forwarded is the client's messages rewritten (summaries, blocks, internal calls
                # and their results): kept, but only the client's own chain is searched.
                self._insert(node, parent, message, body, record, searchable=kind == "request")
                self._remember(node)
            parent = node
            ids.append(node)
        self.chains.put(key, messages, ids, size)
        return parent

    def _insert(self, node: str, parent: str, message: Any, body: bytes, record: ExchangeRecord,
                searchable: bool = True) -> None:
        insert_message(self._conn, node, safe_text(parent), message, body, tenant=record.tenant,
                       session_id=record.session_id, policy=record.policy, created_at=record.created_at,
                       searchable=searchable)

    def _remember(self, node: str) -> None:
        if len(self._seen) >= _SEEN_LIMIT:
            self._seen.clear()
        self._seen.add(node)

    def _response_fields(self, record: ExchangeRecord, request_leaf: str, raw: bytes) -> dict[str, Any]:
        try:
            parsed = record.answer or parse_response(record)
        except Exception as exc:  # a reader's own bug: the exchange is archived all the same, its answer raw
            log.exception("archive: exchange %s: its answer could not be read", record.id)
            parsed = ParsedResponse(problems=[f"the answer could not be read ({type(exc).__name__})"])
        fields_: dict[str, Any] = {"response_id": parsed.response_id, "finish_reason": parsed.finish_reason}
        if parsed.message is not None:
            body = dumps(parsed.message)
            node = message_id(request_leaf, body)
            # The proxy's own answers (slash commands) would make recall find its earlier results.
            self._insert(node, request_leaf, parsed.message, body, record,
                         searchable=record.gate not in ("command", "internal"))
            fields_["response_message_id"] = node
        usage = parsed.usage or {}
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        fields_.update(prompt_tokens=integer(usage.get("prompt_tokens")),
                       completion_tokens=integer(usage.get("completion_tokens")),
                       cached_tokens=integer(details.get("cached_tokens")),
                       cache_write_tokens=integer(details.get("cache_write_tokens")),
                       usage=dumps(parsed.raw_usage or usage).decode() if usage else None)
        if parsed.problems:
            fields_["parse_error"] = "; ".join(parsed.problems)[:4000]
            fields_["response_raw"] = raw
        return fields_


def _shared_prefix(previous: list[Any], messages: list[Any]) -> int:
    """How many leading messages are equal. A session's next request repeats all of its previous one:
    one list comparison in C (the same objects are passed over by identity) tells. Else (a client that
    edits its newest messages: Anthropic clients move their cache marker) the place they part is
    bisected with comparisons of the part not yet known equal, all in C."""
    low, high = 0, min(len(previous), len(messages))
    if previous[:high] == messages[:high]:
        return high
    high -= 1  # (the first `low` are equal; they part at or before `high`)
    while low < high:
        middle = (low + high + 1) // 2
        if previous[low:middle] == messages[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low
