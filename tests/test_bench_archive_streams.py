"""bench/archive_streams.py measures the reading of answers it builds right: each format's reader gets
the whole text and the tool call's input back from them."""

from __future__ import annotations

import orjson

from bench import archive_streams as bench


def test_each_format_reads_back_the_answer_the_bench_streams() -> None:
    text = "".join(f" word{n}, \"quoted\"\n" for n in range(25))
    arguments = orjson.loads("".join(bench.tool_input(5)))
    round_ = bench.read_stream(bench.chunked(bench.messages_stream(30)))
    assert round_.text == text and round_.malformed is None and round_.stop_reason == "tool_use"
    assert [orjson.loads(call["function"]["arguments"]) for call in round_.calls] == [arguments]
    folded = bench.assemble(bench.chunked(bench.chat_stream(30)))
    message = folded.message()
    assert message["content"] == text and not folded.problems
    assert orjson.loads(message["tool_calls"][0]["function"]["arguments"]) == arguments
    response = bench.final_response(bench.chunked(bench.responses_stream(30)))
    assert response is not None
    whole = "".join(f" word{n}, \"quoted\"\n" for n in range(30))
    assert response["output"][0]["content"][0]["text"] == whole
