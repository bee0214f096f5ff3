"""Archive schema, as append-only sqlite-utils migrations: never edit one, add the next."""

from __future__ import annotations

from proxy.sqlite_lib import Database, Migrations

migrations = Migrations("ctxproxy")


@migrations()
def m001_messages_and_exchanges(db: Database) -> None:
    # Each distinct message once: id = hash(parent id + message bytes), so a conversation resent
    # every turn shares its whole prefix with the previous request.
    db.table("messages").create(
        {"id": str, "parent_id": str, "tenant": str, "session_id": str, "role": str, "text": str,
         "body": str,
         "created_at": str},
        pk="id",
    )
    db.table("messages").create_index(["parent_id"])
    db.table("messages").enable_fts(["text"], fts_version="FTS5", create_triggers=True, tokenize="porter")
    db.table("exchanges").create(
        {
            "id": str, "created_at": str, "session_id": str, "session_source": str, "tenant": str,
            "policy": str, "route": str, "model": str, "stream": int, "status": int,
            "latency_ms": float, "upstream_ms": float, "tokens_before": int, "tokens_after": int,
            "gate": str, "request_leaf": str, "forwarded_leaf": str, "params": str,
            "response_message_id": str, "response_id": str, "finish_reason": str,
            "prompt_tokens": int, "completion_tokens": int, "cached_tokens": int, "error": str,
        },
        pk="id",
    )
    db.table("exchanges").create_index(["session_id", "created_at"])
    db.table("exchanges").create_index(["tenant", "created_at"])


def apply(db: Database) -> None:
    migrations.apply(db)


@migrations()
def m002_tool_results_and_tickets(db: Database) -> None:
    # Verbatim originals of replaced tool results, and the replacement each got (sticky across restarts).
    db.table("tool_results").create(
        {"tenant": str, "session_id": str, "handle": str, "call_id": str, "content_hash": str,
         "tool_name": str, "content": str, "replacement": str, "kind": str, "created_at": str},
        pk=("tenant", "session_id", "handle"),
    )
    db.table("tool_results").create_index(["tenant", "handle"])
    # A refusal leaves a decompose-required ticket pointing at its checkpoint.
    db.table("tickets").create(
        {"id": str, "created_at": str, "tenant": str, "session_id": str, "kind": str, "severity": str,
         "checkpoint_id": str, "estimated_tokens": int, "max_input_tokens": int, "message": str},
        pk="id",
    )


@migrations()
def m003_policy_scope_and_windows(db: Database) -> None:
    # recall searches this session first, then the project: the policy a message was first sent under.
    db.table("messages").add_column("policy", str)
    db.table("messages").create_index(["tenant", "session_id"])
    # The sliding window's sticky cut and auto-summary per session, so a restart keeps them.
    db.table("session_windows").create(
        {"tenant": str, "session_id": str, "cut": int, "last_evicted": str, "headlines": str, "block": str,
         "updated_at": str},
        pk=("tenant", "session_id"),
    )


@migrations()
def m004_fts_scope(db: Database) -> None:
    # Scope tokens (tenant, session, policy) inside the full-text index let FTS5 intersect a query with
    # one tenant's or session's documents before ranking, instead of ranking the whole archive.
    db.table("messages").add_column("scope", str)
    db.table("messages").disable_fts()
    db.table("messages").enable_fts(["text", "scope"], fts_version="FTS5", create_triggers=True,
                              tokenize="porter", replace=True)


@migrations()
def m005_pins(db: Database) -> None:
    # Runtime pins per project (policy); tenant "*" means every API key of the project.
    db.table("pins").create({"id": str, "tenant": str, "policy": str, "name": str, "content": str,
                             "tokens": int, "created_at": str}, pk="id")
    db.table("pins").create_index(["policy", "tenant"])


@migrations()
def m006_session_memory(db: Database) -> None:
    # Working memory (entities) and folded memory (episodes, semantic) per session, as versioned JSON.
    db.table("session_memory").create({"tenant": str, "session_id": str, "kind": str, "data": str,
                                 "updated_at": str}, pk=("tenant", "session_id", "kind"))


@migrations()
def m008_pins_session(db: Database) -> None:
    # Pins made by /pin under `commands.pins: session` belong to one session; NULL: project-wide.
    db.table("pins").add_column("session_id", str)
    db.table("pins").create_index(["policy", "tenant", "session_id"])


@migrations()
def m007_chunked_search_and_raw_responses(db: Database) -> None:
    # Searchable text is indexed in ~4 KB chunks keyed to their message, so ranking and snippets cost a
    # chunk's work per hit however long the document (snippet() over a 20 MB tool result took a
    # minute). The writer inserts the chunks itself: no triggers. The text lives in the chunk index
    # only; messages.body keeps each message exactly, messages.text and .scope are no longer filled.
    # messages.size (bytes of body) and call_id let recall skip reading huge bodies.
    # exchanges.response_raw / parse_error keep an answer that could not be parsed, and why.
    from proxy.archive import chunk_text, loads, message_call_id

    # messages_fts and its triggers (which would fire on the updates below)
    db.table("messages").disable_fts()
    db.execute("CREATE VIRTUAL TABLE message_chunks_fts USING fts5("
               "message_id UNINDEXED, scope, text, tokenize='porter')")
    db.table("messages").add_column("call_id", str)
    db.table("messages").add_column("size", int)
    last = -1
    while True:
        rows = db.execute("SELECT rowid, id, scope, text, body FROM messages WHERE rowid > ? "
                          "ORDER BY rowid LIMIT 2000", [last]).fetchall()
        if not rows:
            break
        chunks: list[tuple[str, str, str]] = []
        updates: list[tuple[int, str | None, int]] = []
        for rowid, node, scope, text, body in rows:
            last = rowid
            if text:
                chunks.extend((node, scope or "", piece) for piece in chunk_text(text))
            try:
                call_id = message_call_id(loads(body)) if body else None
            except ValueError:
                call_id = None
            updates.append((len((body or "").encode("utf-8", "surrogatepass")), call_id, rowid))
        db.conn.executemany("INSERT INTO message_chunks_fts (message_id, scope, text) VALUES (?, ?, ?)",
                            chunks)
        db.conn.executemany("UPDATE messages SET size = ?, call_id = ?, text = NULL, scope = NULL "
                            "WHERE rowid = ?", updates)
    db.table("exchanges").add_column("response_raw", bytes)
    db.table("exchanges").add_column("parse_error", str)


@migrations()
def m009_response_truncated(db: Database) -> None:
    # An answer over upstream.max_response_bytes is relayed whole but archived as a prefix: say so.
    db.table("exchanges").add_column("response_truncated", int)


@migrations()
def m010_own_traffic_and_read_back(db: Database) -> None:
    # messages.proxy: 1 for the proxy's own traffic and the rewritten copies forwarded upstream
    # (summaries, injected blocks, internal calls and their results), 0 for the conversation. Such rows
    # are neither indexed nor read back; rows from before this migration are NULL and are recognized by
    # content when searched (proxy.archive_traffic).
    db.table("messages").add_column("proxy", int)
    # read_tool_result falls back to the archive: a tool message by its call id, per tenant. The index
    # answers which rows hold a call's result without reading the rows (past a huge body).
    db.table("messages").create_index(["tenant", "call_id", "session_id", "role", "proxy"])
    # recall names the handle a hit's content was stored under (summaries, evicted results, observations).
    db.table("tool_results").create_index(["tenant", "session_id", "content_hash"])
    # The first line of each chunk of a multi-chunk message (JSON list; chunk rowids are consecutive from
    # first_chunk), so a hit deep in a long result names its line number without reading what precedes.
    db.execute("CREATE TABLE message_chunk_lines (message_id TEXT PRIMARY KEY, first_chunk INTEGER, "
               "starts TEXT)")


@migrations()
def m011_cache_writes_and_usage(db: Database) -> None:
    # Providers bill cache writes apart (Anthropic: cache_creation_input_tokens, split by TTL): the tokens
    # written, and the answer's usage object as the provider sent it.
    db.table("exchanges").add_column("cache_write_tokens", int)
    db.table("exchanges").add_column("usage", str)


@migrations()
def m012_accounting_and_activity(db: Database) -> None:
    # What each call cost and what the same request unmodified would have (proxy/accounting.py), what
    # the proxy did in the exchange, and where its time went (streams: headers apart from the last byte).
    exchanges = db.table("exchanges")
    for name, kind in (("round", int), ("upstream_headers_ms", float), ("overhead_ms", float),
                       ("client_cached_tokens", int), ("forwarded_cached_tokens", int), ("summaries", int),
                       ("masked", int), ("evicted_results", int), ("evictions", int),
                       ("internal_rounds", int), ("recalls", int), ("reads", int), ("cost_usd", float),
                       ("baseline_usd", float), ("saved_usd", float), ("cost_source", str),
                       ("baseline_tokens", int), ("baseline_cached_tokens", int), ("prices", str)):
        exchanges.add_column(name, kind)
    exchanges.create_index(["policy", "created_at"])
    exchanges.create_index(["created_at"])


@migrations()
def m013_request_params(db: Database) -> None:
    # What a request held besides its messages (tools, metadata, sampling settings), each distinct one
    # once per tenant: an agent resends the same ~15 KB of tools every turn (Claude Code's took 62 % of
    # the archive in exchanges.params). exchanges.params_id names the row; exchanges.params stays for rows
    # from before.
    db.table("request_params").create({"id": str, "tenant": str, "body": str, "created_at": str}, pk="id")
    db.table("exchanges").add_column("params_id", str)


@migrations()
def m014_no_parent_index(db: Database) -> None:
    # Nothing looks messages up by their parent (a chain is walked up, by id). The index cost every new
    # message a write at a random place (its key a hash): a message row with its full-text chunk went
    # from ~290 to ~220 µs without it, one message a transaction, as an agent's pace makes them.
    db.execute("DROP INDEX IF EXISTS idx_messages_parent_id")


@migrations()
def m015_no_session_index(db: Database) -> None:
    # Nothing looks messages up by tenant and session alone: read-back and recall's call lookups go by
    # (tenant, call_id, session_id, role, proxy), chains by id. Each new message paid a write into it.
    db.execute("DROP INDEX IF EXISTS idx_messages_tenant_session_id")
