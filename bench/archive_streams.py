"""What reading a streamed answer back costs the archive writer, per event, for each wire format.

The writer folds every streamed answer into the message it archives. Real answers stream hundreds of
events (a Claude answer a delta every few tokens, its tool call's input in pieces), where the fake
upstream of bench/overhead.py streams 20: this is the part of the writer's work that grows with the
answer. For answers of about 30, 300 and 3,000 events, in-process, the best of five:
- Messages: the relay's round fed each event (wire/messages_archive.read_stream);
- chat completions: the chunks folded into one message (sse.assemble);
- Responses: the last response.completed read (wire/responses_archive.final_response).

Run: python bench/archive_streams.py [SNAPSHOT] (SNAPSHOT: a folder holding an earlier `proxy/` package
to measure instead, e.g. `mkdir /tmp/before && git archive HEAD~1 proxy | tar -x -C /tmp/before`)
"""

from __future__ import annotations

import functools
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if __name__ == "__main__" and len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])

import orjson

from proxy.sse import assemble
from proxy.wire.messages_archive import read_stream
from proxy.wire.responses_archive import final_response

NETWORK_READ = 1400  # bytes a chunk, as reads from a socket deliver them


def named(obj: dict[str, Any]) -> bytes:
    return b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def chunked(events: list[bytes]) -> list[bytes]:
    whole = b"".join(events)
    return [whole[at:at + NETWORK_READ] for at in range(0, len(whole), NETWORK_READ)]


def tool_input(pieces: int) -> list[str]:
    text = orjson.dumps({"command": "python -m pytest -x tests/test_parser.py -k 'unicode or escapes'",
                         "description": "run the parser tests " * max(1, pieces // 8)}).decode()
    size = max(1, len(text) // pieces)
    return [text[at:at + size] for at in range(0, len(text), size)]


def messages_stream(deltas: int) -> list[bytes]:
    events = [named({"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1200, "output_tokens": 1}}}),
        named({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        named({"type": "ping"})]
    events += [named({"type": "content_block_delta", "index": 0,
                      "delta": {"type": "text_delta", "text": f" word{n}, \"quoted\"\n"}})
               for n in range(deltas * 5 // 6)]
    events += [named({"type": "content_block_stop", "index": 0}),
               named({"type": "content_block_start", "index": 1, "content_block": {
                   "type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}})]
    events += [named({"type": "content_block_delta", "index": 1,
                      "delta": {"type": "input_json_delta", "partial_json": piece}})
               for piece in tool_input(deltas // 6)]
    events += [named({"type": "content_block_stop", "index": 1}),
               named({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                      "usage": {"output_tokens": deltas * 3}}), named({"type": "message_stop"})]
    return events


def chat_stream(deltas: int) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return b"data: " + orjson.dumps({
            "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}) + b"\n\n"
    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": f" word{n}, \"quoted\"\n"}) for n in range(deltas * 5 // 6)]
    events += [chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                      "function": {"name": "bash", "arguments": ""}}]})]
    events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
               for piece in tool_input(deltas // 6)]
    return [*events, chunk({}, "tool_calls"), b"data: [DONE]\n\n"]


def responses_stream(deltas: int) -> list[bytes]:
    texts = [f" word{n}, \"quoted\"\n" for n in range(deltas)]
    item = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "annotations": [], "text": "".join(texts)}]}
    events = [named({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress",
                                                               "output": []}})]
    events += [named({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                      "content_index": 0, "delta": text}) for text in texts]
    events += [named({"type": "response.output_item.done", "output_index": 0, "item": item}),
               named({"type": "response.completed", "response": {
                   "id": "resp_1", "status": "completed", "output": [item],
                   "usage": {"input_tokens": 1200, "output_tokens": deltas * 3}}})]
    return events


FORMATS: dict[str, tuple[Callable[[int], list[bytes]], Callable[[list[bytes]], Any]]] = {
    "Messages (read_stream)": (messages_stream, read_stream),
    "chat completions (assemble)": (chat_stream, assemble),
    "Responses (final_response)": (responses_stream, final_response),
}


def main() -> None:
    print("| format | events | KB | µs a stream | µs an event |")
    print("|---|---:|---:|---:|---:|")
    for name, (make, read) in FORMATS.items():
        for deltas in (30, 300, 3000):
            events = make(deltas)
            chunks = chunked(events)
            number = max(1, 3000 // deltas)
            best = min(timeit.repeat(functools.partial(read, chunks), number=number, repeat=5)) / number
            size = sum(map(len, chunks)) / 1024
            each = best / len(events) * 1e6
            print(f"| {name} | {len(events)} | {size:.1f} | {best * 1e6:.0f} | {each:.2f} |")


if __name__ == "__main__":
    main()
