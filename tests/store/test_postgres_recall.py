"""Recall on PostgreSQL ranks a bounded set of candidates in a project (postgres_recall.ranking): every
match of a term in fewer chunks than CANDIDATES, the newest matches of a more common one; a session's
own matches all. Here CANDIDATES is 3, so a word in a handful of messages is already "common"."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from proxy.archive import ArchiveWriter, ExchangeRecord
from proxy.store import postgres_recall
from proxy.store.postgres import PostgresTarget
from proxy.store.postgres_reader import PostgresReader
from tests.store.test_postgres_reader import user
from tests.test_read_back import TENANT, call, record


@pytest.fixture
def archive(tmp_path: Path, postgres_url: str, monkeypatch) -> Iterator[Callable[..., PostgresReader]]:
    """write(*records) -> a reader of the PostgreSQL archive they were written to (CANDIDATES 3)."""
    monkeypatch.setattr(postgres_recall, "CANDIDATES", 3)
    readers: list[PostgresReader] = []

    def write(*items: ExchangeRecord) -> PostgresReader:
        writer = ArchiveWriter(tmp_path / "archive.db", target=lambda: PostgresTarget(postgres_url))
        for item in items:
            writer.submit(item)
        writer.close()
        readers.append(PostgresReader(postgres_url))
        return readers[-1]

    yield write
    for reader in readers:
        reader.close()


def contents(hits: list[dict]) -> list[tuple[str, str]]:
    return [(hit["session_id"], hit["lines"][0][1]) for hit in hits]


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-statistics", "analyzed"])
def test_a_common_word_is_ranked_on_its_newest_matches_after_the_sessions_own(archive, monkeypatch,
                                                                              postgres_url, analyzed):
    reader = archive(user(1, "deploy the zygote service"),
                     *(user(n, f"deploy number {n}", session="s2") for n in range(2, 10)))
    if analyzed:  # the statistics call `deploy` and `number` common: the terms' own scans come first
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("analyze message_chunks")
            [common] = conn.execute("select most_common_elems::text::text[] from pg_stats "
                                    "where tablename = 'message_chunks' and attname = 'tsv'").fetchone()
        assert {"deploy", "number"} <= set(common)
    # The session's own (oldest) hit first, then the project's newest 3: the other 5 are not ranked.
    assert contents(reader.recall(TENANT, "s1", "default", "deploy", 8)) == [
        ("s1", "deploy the zygote service"),
        ("s2", "deploy number 7"), ("s2", "deploy number 8"), ("s2", "deploy number 9")]
    # A rarer term of the query brings its match whatever its age, ranked above the common term's.
    assert contents(reader.recall(TENANT, "s3", "default", "deploy zygote", 8)) == [
        ("s1", "deploy the zygote service"),
        ("s2", "deploy number 7"), ("s2", "deploy number 8"), ("s2", "deploy number 9")]
    assert contents(reader.recall(TENANT, "s3", "default", "number 4", 8)) == [
        ("s2", "deploy number 4"),
        ("s2", "deploy number 7"), ("s2", "deploy number 8"), ("s2", "deploy number 9")]
    # With more candidates than any term's matches, every match is ranked (as SQLite ranks them).
    monkeypatch.setattr(postgres_recall, "CANDIDATES", 8)
    assert len(reader.recall(TENANT, "s1", "default", "deploy", 8)) == 8


def test_one_huge_result_crowds_neither_its_session_nor_its_project(archive):
    """A long result whose chunks all hold the word: the session's own search ranks every match; a
    project's brings the word's newest chunks (all the log's) and its newest first chunks of messages."""
    log = "\n".join(f"step {i}: deploy of shard {i} done, nothing else to report here" for i in range(900))
    assert len(log) > 10 * 4096  # some 14 chunks, each holding `deploy`
    reader = archive(
        user(1, "deploy notes: ask before a deploy on friday"),
        user(2, "deploy window is monday"),
        record(3, [{"role": "user", "content": "go"},
                   {"role": "assistant", "content": None, "tool_calls": [call("call_log")]},
                   {"role": "tool", "tool_call_id": "call_log", "content": log}]))
    expected = [("tool", "call_log"), ("user", "deploy notes: ask before a deploy on friday"),
                ("user", "deploy window is monday")]
    hits = reader.recall(TENANT, "s1", "default", "deploy", 8)
    assert sorted((hit["role"], hit["handle"] if hit["role"] == "tool" else hit["lines"][0][1])
                  for hit in hits) == expected
    elsewhere = reader.recall(TENANT, "s2", "default", "deploy", 8)
    assert sorted((hit["role"], hit["lines"][0][1] if hit["role"] == "user" else "call_log")
                  for hit in elsewhere) == expected
