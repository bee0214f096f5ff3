"""The archive database: opening it (0600, WAL, current schema), content-addressed message rows
(id = hash of parent id + message bytes) and the chunked full-text index with its scope tokens."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from proxy import migrations
from proxy.archive_codec import safe_text
from proxy.archive_traffic import is_proxy_message, message_text
from proxy.sqlite_lib import Database

CHUNK_CHARS = 4096  # searchable text is indexed in chunks of about this many characters
searchable_text = message_text  # the old name


def open_database(path: Path, busy_timeout: float = 30.0) -> Database:
    """Open (creating 0600 if needed) the archive with WAL and the current schema."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=busy_timeout)
    db = Database(conn)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    migrations.apply(db)
    return db


def message_id(parent_id: str, body: bytes) -> str:
    return hashlib.sha256(parent_id.encode("utf-8", "surrogatepass") + b"\0" + body).hexdigest()[:32]


def scope_token(kind: str, value: str) -> str:
    """One alphanumeric token per tenant / session / policy, indexed next to the text."""
    return kind + hashlib.sha1(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@functools.lru_cache(maxsize=4096)  # three hashes a message, the same few values all day
def scope_of(tenant: str, session_id: str, policy: str) -> str:
    # Project = tenant + policy as one token: intersecting two large doclists would cost more.
    return " ".join((scope_token("tn", tenant), scope_token("ss", session_id), project_token(tenant, policy)))


def project_token(tenant: str, policy: str) -> str:
    return scope_token("tp", tenant + "\0" + policy)


def message_call_id(message: Any) -> str | None:
    """The tool call a message answers (tool) or makes first (assistant), for recall's call_id."""
    if not isinstance(message, dict):
        return None
    if message.get("tool_call_id"):
        return safe_text(str(message["tool_call_id"]))
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls and isinstance(calls[0], dict) and calls[0].get("id"):
        return safe_text(str(calls[0]["id"]))
    return None


def chunk_text(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """Cut `text` into pieces of at most `size` characters, at line ends where there are any (else at
    spaces, else anywhere), so search work per hit stays bounded however long a document is."""
    if len(text) <= size:
        return [text] if text else []
    chunks, start, end_of_text = [], 0, len(text)
    while start < end_of_text:
        end = start + size
        if end >= end_of_text:
            chunks.append(text[start:])
            break
        cut = text.rfind("\n", start + size // 2, end)
        if cut < 0:
            cut = text.rfind(" ", start + size // 2, end)
        cut = end if cut < 0 else cut + 1
        chunks.append(text[start:cut])
        start = cut
    return chunks


# text and scope live in the chunk index (message_chunks_fts) only.
_MESSAGE_INSERT = ("INSERT OR IGNORE INTO messages (id, parent_id, tenant, session_id, policy, role, body, "
                   "created_at, call_id, size, proxy) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_CHUNK_INSERT = "INSERT INTO message_chunks_fts (message_id, scope, text) VALUES (?, ?, ?)"
_CHUNK_LINES = "INSERT OR REPLACE INTO message_chunk_lines (message_id, first_chunk, starts) VALUES (?, ?, ?)"


def insert_message(conn: sqlite3.Connection, node: str, parent: str | None, message: Any, body: bytes,
                   *, tenant: str, session_id: str, policy: str, created_at: str,
                   searchable: bool = True) -> bool:
    """Store one message (once: ignored when its id exists) and index its text in chunks.

    Not `searchable` (a rewritten copy forwarded upstream, an answer the proxy gave itself), or the
    proxy's own traffic (archive_traffic): stored with messages.proxy = 1 and not indexed, so recall
    and read-back never return it."""
    role = message.get("role") if isinstance(message, dict) else None
    proxy = not searchable or is_proxy_message(message)
    inserted = conn.execute(_MESSAGE_INSERT, (
        node, parent, safe_text(tenant), safe_text(session_id), safe_text(policy), safe_text(role),
        body.decode("utf-8"), created_at, message_call_id(message), len(body), int(proxy))).rowcount
    if inserted and not proxy:
        chunks = chunk_text(safe_text(message_text(message)) or "")
        scope = scope_of(tenant, session_id, policy)
        conn.executemany(_CHUNK_INSERT, [(node, scope, chunk) for chunk in chunks])
        if len(chunks) > 1:
            # The line each chunk starts on, so a hit deep in a long result names its line number.
            # Chunks get consecutive rowids: the writer is the only one inserting.
            last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
            starts, line = [], 1
            for chunk in chunks:
                starts.append(line)
                line += chunk.count("\n")
            conn.execute(_CHUNK_LINES, (node, last - len(chunks) + 1, json.dumps(starts)))
    return bool(inserted)
