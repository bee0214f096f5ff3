"""A real, temporary archive of one replayed conversation, written the way the server writes it, so that
`recall` in the retention benchmark answers from the same tables and index as in production."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import orjson

from proxy.archive import ArchiveWriter, ExchangeRecord, utc_now
from proxy.reader import ArchiveReader
from proxy.session import Session

TENANT = "retention"


class archived:  # a context manager used like a function
    """A real temporary archive holding the exchanges before the measured request, written as the server
    writes them (request chain, forwarded chain when rewritten, the model's answer); yields a reader."""

    def __init__(self, history: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]],
                 messages: list[dict[str, Any]], session: Session, policy: str, model: str) -> None:
        self.history, self.messages, self.session = history, messages, session
        self.policy, self.model = policy, model
        self.folder = Path(tempfile.mkdtemp(prefix="ctxproxy-retention-", dir=_scratch()))
        self.reader: ArchiveReader | None = None

    def __enter__(self) -> ArchiveReader:
        path = self.folder / "archive.db"
        shutil.copyfile(archive_template(), path)  # an empty archive with the schema: migrated once
        writer = ArchiveWriter(path)
        try:
            writer.submit_many(self.records())
            writer.flush()
        finally:
            writer.close()
        self.reader = ArchiveReader(path)
        return self.reader

    def records(self) -> list[ExchangeRecord]:
        found = []
        for prefix, forwarded in self.history:
            answer = self.messages[len(prefix)]  # the assistant message this request produced
            record = ExchangeRecord(
                id=uuid.uuid4().hex, created_at=utc_now(), session_id=self.session.id,
                session_source=self.session.source, tenant=TENANT, policy=self.policy,
                route="chat/completions", model=self.model, stream=False, request_messages=prefix, params={},
                forwarded_messages=forwarded if forwarded is not None and forwarded is not prefix else None,
                status=200 if forwarded is not None else 400,
                gate="pass" if forwarded is not None else "refuse")
            if forwarded is not None:
                choice = {"index": 0, "message": answer, "finish_reason": "stop"}
                record.response_body = orjson.dumps({"id": record.id, "object": "chat.completion",
                                                     "choices": [choice]})
            found.append(record)
        return found

    def __exit__(self, *_: object) -> None:
        if self.reader is not None:
            self.reader.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _scratch() -> str | None:
    """Archives are written and thrown away by the thousand: in memory-backed /dev/shm when there is one."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


_TEMPLATE: list[Path] = []


def use_template(path: Path) -> None:
    """Use an empty archive made by another process (pool workers do not run atexit handlers)."""
    _TEMPLATE[:] = [path]


def archive_template() -> Path:
    if not _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="ctxproxy-retention-template-", dir=_scratch()))
        atexit.register(shutil.rmtree, folder, True)
        ArchiveWriter(folder / "archive.db").close()
        _TEMPLATE.append(folder / "archive.db")
    return _TEMPLATE[0]
