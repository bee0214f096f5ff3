"""Wire formats. The layers work on one neutral conversation (OpenAI-chat-shaped messages); each wire
format is one codec that decodes a native request into it and applies the pipeline's decisions back onto
the native body, leaving every other byte as the client sent it.

A codec has two halves: a `WireFormat` (stateless: parsing, answers, errors, stream ends) and, per request,
a `Decoded` (the neutral conversation plus where each neutral message lives in the native body).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from proxy.errors import CtxProxyError

if TYPE_CHECKING:
    from proxy.faults import StreamWatch
    from proxy.rounds import RoundsContext
    from proxy.upstream_response import UpstreamResponse

Message = dict[str, Any]


@dataclass
class Turn:
    """What one model answer says, read in neutral terms (rounds decide on this)."""

    text: str | None
    calls: list[dict[str, Any]]  # chat-shaped tool calls, every one the model made, in order
    assistant: Message  # the neutral assistant message of this answer (native form registered)


@dataclass
class Decoded:
    """One request in neutral terms. `encode` puts a rewritten conversation back into the native body."""

    body: dict[str, Any]  # the native body as parsed
    model: str
    stream: bool
    messages: list[Message]  # neutral
    tools: list[Any] | None  # neutral (the client's tools; a codec may keep them native)
    session_body: dict[str, Any]  # what the session resolver reads (metadata, user, neutral messages)
    encode: Callable[[list[Message], list[Message], list[Any] | None], bytes]  # (forwarded, original, tools)
    register: Callable[[Message, Any], None] = lambda neutral, native: None  # a round's message, native form
    params: dict[str, Any] = field(default_factory=dict)  # archived beside the messages
    native_context: bool = False  # the request asks the provider to manage context (policy window.native)
    take_over_context: Callable[[], None] = lambda: None  # ours manages it: the request's own ask is dropped
    native_state: bool = False  # the provider holds the history (previous_response_id): nothing to rewrite
    raw: bytes = b""  # the client's bytes: what `encode` returns when nothing changed (or it must not)


class WireFormat(Protocol):
    """The stateless half of a codec."""

    name: str  # "chat" | "messages"
    route: str  # the archive's and metrics' name of the route
    upstream_path: str  # the path the upstream is called with
    answer_kind: str  # what an answer is called in errors ("chat completion")

    @property
    def done_markers(self) -> tuple[bytes, ...]: ...  # an event with one ends a stream (held till archived)

    def fresh_bytes(self, raw: bytes) -> int: ...  # about how much a decode of `raw` works through

    def decode(self, raw: bytes) -> Decoded: ...

    def read_answer(self, payload: bytes) -> tuple[dict[str, Any] | None, str]: ...

    def turn(self, data: dict[str, Any], decoded: Decoded) -> Turn: ...

    def keep_calls(self, data: dict[str, Any], client_calls: list[dict[str, Any]],
                   note: str | None) -> None: ...

    def usage(self, data: dict[str, Any]) -> dict[str, Any] | None: ...

    def set_usage(self, data: dict[str, Any], usage: dict[str, Any]) -> None: ...

    def merge_rounds(self, data: dict[str, Any], earlier: list[dict[str, Any]]) -> None: ...

    def error_body(self, error: CtxProxyError) -> bytes: ...

    def error_event(self, message: str, code: str, kind: str = "upstream_error") -> bytes: ...

    def command_answer(self, text: str, model: str) -> bytes: ...

    def command_stream(self, text: str, model: str) -> list[bytes]: ...

    def watch(self) -> StreamWatch: ...

    def window(self, headers: Mapping[str, str]) -> int | None: ...  # a window the request's headers select

    def stream_rounds(self, rc: RoundsContext, first: UpstreamResponse) -> AsyncIterator[bytes]: ...
