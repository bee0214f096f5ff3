"""Archive schema, as append-only sqlite-utils migrations: never edit one, add the next."""

from __future__ import annotations

from sqlite_utils import Database, Migrations

migrations = Migrations("ctxproxy")


@migrations()
def m001_messages_and_exchanges(db: Database) -> None:
    # Each distinct message once: id = hash(parent id + message bytes), so a conversation resent
    # every turn shares its whole prefix with the previous request.
    db["messages"].create(
        {"id": str, "parent_id": str, "tenant": str, "session_id": str, "role": str, "text": str,
         "body": str,
         "created_at": str},
        pk="id",
    )
    db["messages"].create_index(["parent_id"])
    db["messages"].enable_fts(["text"], fts_version="FTS5", create_triggers=True, tokenize="porter")
    db["exchanges"].create(
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
    db["exchanges"].create_index(["session_id", "created_at"])
    db["exchanges"].create_index(["tenant", "created_at"])


def apply(db: Database) -> None:
    migrations.apply(db)


@migrations()
def m002_tool_results_and_tickets(db: Database) -> None:
    # Verbatim originals of replaced tool results, and the replacement each got (sticky across restarts).
    db["tool_results"].create(
        {"tenant": str, "session_id": str, "handle": str, "call_id": str, "content_hash": str,
         "tool_name": str, "content": str, "replacement": str, "kind": str, "created_at": str},
        pk=("tenant", "session_id", "handle"),
    )
    db["tool_results"].create_index(["tenant", "handle"])
    # A refusal leaves a decompose-required ticket pointing at its checkpoint.
    db["tickets"].create(
        {"id": str, "created_at": str, "tenant": str, "session_id": str, "kind": str, "severity": str,
         "checkpoint_id": str, "estimated_tokens": int, "max_input_tokens": int, "message": str},
        pk="id",
    )


@migrations()
def m003_policy_scope_and_windows(db: Database) -> None:
    # recall searches this session first, then the project: the policy a message was first sent under.
    db["messages"].add_column("policy", str)
    db["messages"].create_index(["tenant", "session_id"])
    # The sliding window's sticky cut and auto-summary per session, so a restart keeps them.
    db["session_windows"].create(
        {"tenant": str, "session_id": str, "cut": int, "last_evicted": str, "headlines": str, "block": str,
         "updated_at": str},
        pk=("tenant", "session_id"),
    )


@migrations()
def m004_fts_scope(db: Database) -> None:
    # Scope tokens (tenant, session, policy) inside the full-text index let FTS5 intersect a query with
    # one tenant's or session's documents before ranking, instead of ranking the whole archive.
    db["messages"].add_column("scope", str)
    db["messages"].disable_fts()
    db["messages"].enable_fts(["text", "scope"], fts_version="FTS5", create_triggers=True,
                              tokenize="porter", replace=True)


@migrations()
def m005_pins(db: Database) -> None:
    # Runtime pins per project (policy); tenant "*" means every API key of the project.
    db["pins"].create({"id": str, "tenant": str, "policy": str, "name": str, "content": str, "tokens": int,
                       "created_at": str}, pk="id")
    db["pins"].create_index(["policy", "tenant"])


@migrations()
def m006_session_memory(db: Database) -> None:
    # Working memory (entities) and folded memory (episodes, semantic) per session, as versioned JSON.
    db["session_memory"].create({"tenant": str, "session_id": str, "kind": str, "data": str,
                                 "updated_at": str}, pk=("tenant", "session_id", "kind"))


@migrations()
def m008_pins_session(db: Database) -> None:
    # Pins made by /pin under `commands.pins: session` belong to one session; NULL: project-wide.
    db["pins"].add_column("session_id", str)
    db["pins"].create_index(["policy", "tenant", "session_id"])


@migrations()
def m007_chunked_search_and_raw_responses(db: Database) -> None:
    # Searchable text is indexed in ~4 KB chunks keyed to their message, so ranking and snippets cost a
    # chunk's work per hit however long the document (snippet() over a 20 MB tool result took a
    # minute). The writer inserts the chunks itself: no triggers. The text lives in the chunk index
    # only; messages.body keeps each message exactly, messages.text and .scope are no longer filled.
    # messages.size (bytes of body) and call_id let recall skip reading huge bodies.
    # exchanges.response_raw / parse_error keep an answer that could not be parsed, and why.
    from proxy.archive import chunk_text, loads, message_call_id

    db["messages"].disable_fts()  # messages_fts and its triggers (which would fire on the updates below)
    db.execute("CREATE VIRTUAL TABLE message_chunks_fts USING fts5("
               "message_id UNINDEXED, scope, text, tokenize='porter')")
    db["messages"].add_column("call_id", str)
    db["messages"].add_column("size", int)
    last = -1
    while True:
        rows = db.execute("SELECT rowid, id, scope, text, body FROM messages WHERE rowid > ? "
                          "ORDER BY rowid LIMIT 2000", [last]).fetchall()
        if not rows:
            break
        chunks, updates = [], []
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
    db["exchanges"].add_column("response_raw", bytes)
    db["exchanges"].add_column("parse_error", str)
