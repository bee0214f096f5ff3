"""Answers over upstream.max_response_bytes reach the client whole, are never held whole, and the archive
keeps a marked prefix of them."""

from __future__ import annotations

import orjson

from tests.servers import Step, completion, huge_stream

CAP = 100_000
BIG = 1_000_000


def archived_rows(proxy) -> list[dict]:
    proxy.flush()
    return list(proxy.query("select status, stream, response_truncated, response_raw, parse_error, error "
                            "from exchanges order by rowid"))


def test_a_non_streamed_answer_over_the_cap_is_relayed_whole_and_archived_as_a_marked_prefix(
        make_proxy, fake_upstream):
    proxy = make_proxy({"upstream": {"max_response_bytes": CAP}})
    answer = orjson.dumps(completion("y" * BIG))
    fake_upstream.then(Step(kind="raw", body=answer, headers={"content-type": "application/json"}))
    hello = [{"role": "user", "content": "hi"}]
    result = proxy.client().chat.completions.create(model="gpt-4o", messages=hello)
    assert result.choices[0].message.content == "y" * BIG  # the client got all of it
    [row] = archived_rows(proxy)
    assert row["status"] == 200 and row["response_truncated"] == 1
    assert bytes(row["response_raw"]) == answer[:CAP]  # exactly the prefix, marked


def test_a_stream_over_the_cap_is_relayed_whole_and_archived_as_a_marked_prefix(make_proxy, fake_upstream):
    proxy = make_proxy({"upstream": {"max_response_bytes": CAP}})
    fake_upstream.then(Step(kind="stream", chunks=huge_stream(BIG)))
    stream = proxy.client().chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == "x" * BIG
    [row] = archived_rows(proxy)
    assert row["stream"] == 1 and row["response_truncated"] == 1
    assert len(bytes(row["response_raw"])) == CAP


def test_answers_under_the_cap_are_archived_whole_and_unmarked(make_proxy, fake_upstream):
    proxy = make_proxy({"upstream": {"max_response_bytes": CAP}})
    fake_upstream.then(Step(content="short"))
    proxy.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    [row] = archived_rows(proxy)
    assert row["response_truncated"] == 0 and row["parse_error"] is None and row["error"] is None


def test_over_the_cap_on_the_internal_tools_path_is_relayed_untouched(make_proxy, fake_upstream):
    from tests.test_rounds import TOOLS, history  # a summarized result: the proxy's tools are offered

    proxy = make_proxy({"upstream": {"max_response_bytes": CAP}})
    answer = orjson.dumps(completion("z" * BIG))
    fake_upstream.then(Step(kind="raw", body=answer, headers={"content-type": "application/json"}))
    result = proxy.client().chat.completions.create(model="gpt-4o", messages=history(), tools=TOOLS)
    assert result.choices[0].message.content == "z" * BIG
    assert "read_tool_result" in fake_upstream.chat_requests[0].body.decode()  # it was the rounds path
    [row] = archived_rows(proxy)
    assert row["response_truncated"] == 1 and "max_response_bytes" in row["error"]
