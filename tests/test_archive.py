"""The archive: dedup, reconstruction, failure recording, file mode, no secrets."""

from __future__ import annotations

import os
import stat

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy import archive_rows
from proxy.archive import ArchiveWriter, ExchangeRecord, utc_now
from proxy.reader import ArchiveReader
from proxy.store import postgres_schema
from tests.conftest import BOTH_BACKENDS
from tests.servers import Step


@BOTH_BACKENDS
def test_twenty_turn_conversation_stores_each_message_once(proxy, fake_upstream):
    client = proxy.client()
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(20):
        messages.append({"role": "user", "content": f"question {turn}"})
        answer = client.chat.completions.create(model="gpt-4o", messages=messages).choices[0].message
        messages.append({"role": "assistant", "content": answer.content})
    proxy.flush()
    # 1 system + 20 user + 20 assistant answers: the answers recorded from responses are the same
    # nodes the client resends, so nothing is stored twice (20 requests x ~20 messages = ~400 sent).
    assert next(proxy.query("select count(*) as n from messages"))["n"] == 41
    assert next(proxy.query("select count(*) as n from exchanges"))["n"] == 20
    reader = proxy.reader()
    sessions = reader.sessions()
    assert len(sessions) == 1 and sessions[0]["turns"] == 20
    assert reader.conversation(sessions[0]["session_id"]) == messages


@BOTH_BACKENDS
def test_exchange_rows_carry_usage_tokens_and_session(proxy, fake_upstream):
    client = proxy.client()
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                   extra_headers={"x-ctxproxy-session": "my-session"})
    proxy.flush()
    row = next(proxy.query("select * from exchanges"))
    assert row["session_id"] == "my-session" and row["session_source"] == "header"
    assert row["status"] == 200 and row["stream"] == 0 and row["gate"] == "pass"
    assert row["prompt_tokens"] == 11 and row["cached_tokens"] == 5
    assert row["tokens_before"] > 0 and row["response_id"] == "chatcmpl-fake"
    assert row["latency_ms"] >= row["upstream_ms"] > 0


@BOTH_BACKENDS
def test_streamed_answer_is_recorded_as_one_message(proxy, fake_upstream):
    stream = proxy.client().chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "stream please"}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "echo: stream please"
    proxy.flush()
    reader = proxy.reader()
    [session] = reader.sessions()
    conversation = reader.conversation(session["session_id"])
    assert conversation[-1] == {"role": "assistant", "content": "echo: stream please"}


@BOTH_BACKENDS
def test_failed_exchange_is_still_recorded(proxy, fake_upstream):
    fake_upstream.then(Step(kind="error", status=503, body=b'{"error":{"message":"overloaded"}}'))
    response = httpx.post(f"{proxy.url}/v1/chat/completions",
                          json={"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 503
    proxy.flush()
    row = next(proxy.query("select status, error, request_leaf from exchanges"))
    assert row["status"] == 503 and "overloaded" in row["error"]
    assert row["request_leaf"]


@BOTH_BACKENDS
def test_archive_is_private_and_holds_no_api_key(proxy, fake_upstream):
    secret = "sk-live-SECRET-0123456789"
    proxy.client(api_key=secret).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    proxy.flush()
    if proxy.backend == "sqlite":
        assert stat.S_IMODE(os.stat(proxy.data_dir / "archive.db").st_mode) == 0o600
    for candidate in (p for p in proxy.data_dir.rglob("*") if p.is_file()):  # the spool too
        assert secret.encode() not in candidate.read_bytes()
        assert b"SECRET-0123456789" not in candidate.read_bytes()
    if proxy.backend == "postgresql":  # every row of every table, as PostgreSQL prints it
        for table in (*postgres_schema.PRIMARY_KEYS, "message_chunks"):
            for row in proxy.query(f"select t::text as r from {table} t"):
                assert "SECRET-0123456789" not in row["r"]
                assert b"SECRET-0123456789".hex() not in row["r"], table  # bytea prints as hex


@BOTH_BACKENDS
def test_search_finds_archived_text(proxy, fake_upstream):
    proxy.client().chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "the deploy failed with ERR_QUOTA_42"}])
    proxy.flush()
    reader = proxy.reader()
    hits = reader.search("ERR_QUOTA_42 deploy")
    assert hits and "[ERR_QUOTA_42]" in hits[0]["snippet"]
    assert reader.search('"unbalanced AND (') == []  # user text is never FTS syntax


# ------------------------------------------------------------------- property: exact reconstruction

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
extra_field = st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in ("role", "content")),
                              json_scalar, max_size=2)
message = st.builds(lambda role, content, extra: {"role": role, "content": content, **extra},
                    st.sampled_from(["system", "user", "assistant", "tool"]),
                    st.one_of(st.text(max_size=200), st.none()), extra_field)
request = st.fixed_dictionaries({"model": st.sampled_from(["gpt-4o", "claude-3-5-sonnet"]),
                                 "messages": st.lists(message, min_size=1, max_size=12)},
                                optional={"temperature": st.floats(0, 2), "x_unknown": json_scalar})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies=st.lists(request, min_size=1, max_size=4))
def test_archive_reconstructs_every_request_exactly(tmp_path_factory, bodies):
    path = tmp_path_factory.mktemp("archive") / "archive.db"
    writer = ArchiveWriter(path)
    records = []
    for index, body in enumerate(bodies):
        record = ExchangeRecord(
            id=f"ex{index}", created_at=utc_now(), session_id="s", session_source="header", tenant="t",
            policy="default", route="chat/completions", model=body["model"], stream=False,
            request_messages=body["messages"], params={k: v for k, v in body.items() if k != "messages"},
            status=200, response_body=b'{"choices":[{"message":{"role":"assistant","content":"ok"}}]}')
        writer.submit(record)
        records.append(record)
    writer.close()
    reader = ArchiveReader(path)
    for record, body in zip(records, bodies, strict=True):
        row = next(reader.db.query("select * from exchanges where id = ?", [record.id]))
        rebuilt = reader.params(row) | {"messages": reader.chain(row["request_leaf"])}
        assert rebuilt == body
        assert list(rebuilt["messages"]) == body["messages"]
    reader.close()


def _turn(session: str, turn: int, size: int) -> ExchangeRecord:
    messages = []
    for n in range(2 * turn + 1):
        role = "user" if n % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"{session} message {n} " + "lorem ipsum " * (size // 12)})
    return ExchangeRecord(
        id=f"{session}-{turn}", created_at=utc_now(), session_id=session, session_source="header", tenant="t",
        policy="default", route="chat/completions", model="gpt-4o", stream=False, request_messages=messages,
        params={}, forwarded_messages=messages[-3:] if int(session[1:]) % 2 else None, status=200,
        response_body=b'{"choices":[{"message":{"role":"assistant","content":"ok"}}]}')


def test_the_writers_chain_cache_stays_in_its_byte_budget_and_chains_stay_exact(tmp_path):
    budget = 512 * 1024  # a few sessions: each entry counts twice its serialized size (PARSED_PER_SERIALIZED)
    writer = ArchiveWriter(tmp_path / "archive.db", chain_cache_bytes=budget)
    records = []
    for turn in range(4):  # sessions take turns, so evicted ones come back and are hashed in full again
        for s in range(30):
            records.append(_turn(f"s{s}", turn, 8192))
            writer.submit(records[-1])
        assert writer.flush(60)
        assert 0 < writer.chains.size <= budget
        assert 0 < len(writer.chains) < 45  # 30 request + 15 forwarded chains: some were evicted
    assert ("t", "s29", "request") in writer.chains  # the most recent sessions stay cached
    assert ("t", "s0", "request") not in writer.chains
    writer.close()
    reader = ArchiveReader(tmp_path / "archive.db")
    for record in records:
        row = next(reader.db.query("select * from exchanges where id = ?", [record.id]))
        assert reader.chain(row["request_leaf"]) == record.request_messages
        assert reader.chain(row["forwarded_leaf"]) == (record.forwarded_messages or record.request_messages)
    # Evicted or not, each distinct message was stored once: 7 request messages and 4 answers.
    assert next(reader.db.query("select count(*) as n from messages where session_id = 's4'"))["n"] == 11
    reader.close()


def test_cached_sessions_still_reuse_their_prefix(tmp_path, monkeypatch):
    hashed: list[str] = []
    original = archive_rows.message_id
    monkeypatch.setattr(archive_rows, "message_id", lambda parent, body: hashed.append(parent) or
                        original(parent, body))
    writer = ArchiveWriter(tmp_path / "archive.db")
    writer.submit(_turn("s0", 3, 1000))  # 7 messages and the answer, and the request's params
    assert writer.flush(30)
    assert len(hashed) == 9
    writer.submit(_turn("s0", 4, 1000))  # the same 7, two new ones and the answer (the same params)
    assert writer.flush(30)
    assert len(hashed) == 12 and sum(parent.startswith("params:") for parent in hashed) == 1
    writer.close()


def test_a_quiet_writer_commits_a_few_exchanges_in_one_transaction_and_a_flush_does_not_wait(tmp_path):
    # A linger far longer than the test: only the flush can end it, so the three are committed together.
    writer = ArchiveWriter(tmp_path / "archive.db", linger_s=600)
    transactions: list[int] = []
    original = writer._target.transaction

    def counted(work, *, records, **kwargs):  # type: ignore[no-untyped-def]
        transactions.append(records)
        return original(work, records=records, **kwargs)

    writer._target.transaction = counted  # type: ignore[method-assign]
    for session in ("s1", "s2", "s3"):
        writer.submit(_turn(session, 1, 100))
    assert writer.flush(timeout=30)  # would time out if the flush waited out the linger
    assert transactions == [3]
    writer.close()
    reader = ArchiveReader(tmp_path / "archive.db")
    assert next(reader.db.query("select count(*) as n from exchanges"))["n"] == 3
    reader.close()
