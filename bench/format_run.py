"""The benchmarks in another wire format: Anthropic Messages or OpenAI Responses.

Each request of a chat trace is sent as a client of that format would send it (bench/to_messages.py: a
Claude client; bench/to_responses.py: a stateless Responses client such as Codex), decoded by the proxy's
codec for the format, rewritten by the same pipeline with the same policy (one session state per
conversation, as the chat run) and encoded back onto the native body, exactly as the server does it
(`proxy.app.rewrite`). The figures are measured on the NEUTRAL conversation the pipeline produced, with the
same model (tokenizer, window) as the chat run, so they compare with the chat run's; raw figures are those
of the decoded request (its neutral messages and its native tools list). Every encoded body is checked
against the format's API rules (the converter module's `violations`): `codec_violations` counts the
requests whose body breaks one, and must be 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench import to_messages, to_responses
from bench.retention_run import Proxy, Sent, Setting, Tally
from proxy import pipeline
from proxy.app import rewrite
from proxy.errors import ContextLengthExceeded
from proxy.policy import LoadedPolicy
from proxy.replay import (
    Cache,
    Totals,
    _check_recoverable,
    bare_model,
    read_conversations,
    request_points,
)
from proxy.session import Session
from proxy.state import StateStore
from proxy.tokens import TokenCounter
from proxy.wire import Decoded
from proxy.wire import messages as messages_codec
from proxy.wire import responses as responses_codec

SAMPLES = 3
log = logging.getLogger("ctxproxy")


@dataclass(frozen=True)
class ClientFormat:
    """A wire format as the benchmarks send it: the converter from a chat conversation, the proxy's
    decoder for it, and the checker of its API's rules."""

    name: str  # "messages" | "responses"; the retention strategy is ctxproxy:<policy>/<name>
    convert: Callable[..., dict[str, Any]]  # (prefix, tools, *, called_in, model?) -> native body
    decode: Callable[[bytes], Decoded]
    violations: Callable[[dict[str, Any]], list[str]]
    chat_model: bool  # the body names the chat run's model (else the converter's default)

    @property
    def suffix(self) -> str:
        return f"/{self.name}"


MESSAGES = ClientFormat("messages", to_messages.to_messages, messages_codec.decode, to_messages.violations,
                        chat_model=False)
RESPONSES = ClientFormat("responses", to_responses.to_responses, responses_codec.decode,
                         to_responses.violations, chat_model=True)
FORMATS = {f.name: f for f in (MESSAGES, RESPONSES)}


class Client:
    """One trace conversation as a client of `fmt` sends it: each request prefix, converted. The tools list
    is converted from the whole conversation, so it is the same on every request."""

    def __init__(self, conversation: dict[str, Any], fmt: ClientFormat, model: str) -> None:
        self.messages = conversation.get("messages") or []
        self.tools = conversation.get("tools") or None
        self.fmt = fmt
        self.options: dict[str, Any] = {"model": model} if fmt.chat_model else {}

    def body(self, prefix: list[dict[str, Any]]) -> bytes:
        return orjson.dumps(self.fmt.convert(prefix, self.tools, called_in=self.messages, **self.options))


class _Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class Forwarded:
    decoded: Decoded
    outcome: pipeline.Outcome | None  # None: the gate refused
    broken: list[str]  # what the format's API would reject in the encoded body
    ms: float  # the server's work on the request: decode, pipeline, encode


def forward(raw: bytes, model: str, context: pipeline.PipelineContext, fmt: ClientFormat) -> Forwarded:
    """Decode, pipeline and encode as the server runs them, and the encoded body's violations of the
    API's rules. A codec that sends the client's own request when its rewrite breaks a rule it checks
    itself has a bug too (what went upstream is not what the figures measure): counted as a violation."""
    started = time.perf_counter()
    decoded = fmt.decode(raw)
    logged = _Logged()
    log.addHandler(logged)
    try:
        outcome, content, _ = rewrite(pipeline.Conversation(model, decoded.messages, decoded.tools), context,
                                      decoded)
    except ContextLengthExceeded:
        return Forwarded(decoded, None, [], (time.perf_counter() - started) * 1000)
    finally:
        log.removeHandler(logged)
    ms = (time.perf_counter() - started) * 1000
    broken = fmt.violations(orjson.loads(content))
    if outcome.unrewritten or (outcome.changed and content is raw):
        broken.append("the rewrite was dropped: " + ("; ".join(logged.lines) or "the client's body went"))
    return Forwarded(decoded, outcome, broken, ms)


# ------------------------------------------------------------------------------- bench/replay.py

@dataclass
class FormatTotals(Totals):
    codec_checked: int = 0  # encoded bodies checked
    codec_violations: int = 0  # of those, bodies the format's API would reject
    violation_samples: list[str] = field(default_factory=list)

    def add(self, other: Totals) -> None:
        super().add(other)
        if isinstance(other, FormatTotals):
            self.codec_checked += other.codec_checked
            self.codec_violations += other.codec_violations
            self.violation_samples = (self.violation_samples + other.violation_samples)[:SAMPLES]

    def report(self) -> dict[str, Any]:
        return super().report() | {"codec_checked": self.codec_checked,
                                   "codec_violations": self.codec_violations,
                                   "violation_samples": self.violation_samples}


def replay_conversation(conversation: dict[str, Any], policy: LoadedPolicy, tokens: TokenCounter,
                        model_override: str | None = None, fmt: ClientFormat = MESSAGES) -> FormatTotals:
    """proxy.replay.replay_conversation in another wire format (same accounting, same helpers); its
    pipeline_ms is the whole per-request work of the format: decode, pipeline, encode."""
    model = model_override or bare_model(str(conversation.get("model") or "gpt-4o"))
    client = Client(conversation, fmt, model)
    store = StateStore()
    session = Session(str(conversation.get("id") or "replay"), "replay")
    context = pipeline.PipelineContext(policy, session, "replay", tokens, store)
    totals = FormatTotals(conversations=1)
    raw_cache, forwarded_cache = Cache(tokens, model), Cache(tokens, model)
    checked: set[str] = set()
    for prefix in request_points(client.messages):
        totals.requests += 1
        sent = forward(client.body(prefix), model, context, fmt)
        decoded, outcome, broken = sent.decoded, sent.outcome, sent.broken
        totals.pipeline_ms.append(sent.ms)
        if outcome is None:
            totals.refused += 1
            totals.gates["refuse"] += 1
            forwarded_cache.previous = None
            raw_cache.cached(decoded.messages, decoded.tools)
            continue
        raw = tokens.request(decoded.messages, decoded.tools, model)
        raw_cached = raw_cache.cached(decoded.messages, decoded.tools)
        totals.account(decoded.messages, raw, raw_cached, outcome,
                       forwarded_cache.cached(outcome.messages, outcome.tools))
        totals.codec_checked += 1
        if broken:
            totals.codec_violations += 1
            if len(totals.violation_samples) < SAMPLES:
                totals.violation_samples.append(f"{conversation.get('id')}: {'; '.join(broken[:3])}")
        _check_recoverable(store, session.id, checked, totals)
    return totals


def replay_files(paths: list[Path], policy: LoadedPolicy, *, model: str | None = None,
                 limit: int | None = None, fmt: ClientFormat = MESSAGES) -> dict[str, Any]:
    """proxy.replay.replay_files in another wire format."""
    tokens = TokenCounter()
    per_file: dict[str, Any] = {}
    overall = FormatTotals(conversations=0)
    for path in paths:
        totals = FormatTotals(conversations=0)
        for conversation in read_conversations(path, limit):
            totals.add(replay_conversation(conversation, policy, tokens, model, fmt))
        per_file[path.name] = totals.report()
        overall.add(totals)
    return {"policy": policy.name, "format": fmt.name, "files": per_file, "overall": overall.report()}


# ---------------------------------------------------------------------------- bench/retention.py

class FormatProxy(Proxy):
    """The retention benchmark's ctxproxy strategy with every request sent in another wire format.
    Reachability (read_tool_result, recall) is measured as for chat, on its own store and archive."""

    def __init__(self, loaded: LoadedPolicy, conversation: dict[str, Any], setting: Setting,
                 tokens: TokenCounter, fmt: ClientFormat = MESSAGES) -> None:
        super().__init__(loaded, conversation, setting, tokens)
        self.name = f"ctxproxy:{loaded.name}{fmt.suffix}"
        self.fmt = fmt
        self.client = Client(conversation, fmt, setting.model)
        self.tokens = tokens
        self.raw_cache = Cache(tokens, setting.model)
        self.checked = self.broken = 0
        self.samples: list[str] = []
        self.conversation_id = str(conversation.get("id"))

    def request(self, prefix: list[dict[str, Any]]) -> Sent | None:
        model = self.setting.model
        sent = forward(self.client.body(prefix), model, self.context, self.fmt)
        decoded, outcome, broken = sent.decoded, sent.outcome, sent.broken
        raw = (self.tokens.request(decoded.messages, decoded.tools, model),
               self.raw_cache.cached(decoded.messages, decoded.tools))
        if outcome is None:
            self.history.append((prefix, None))
            return None
        self.checked += 1
        if broken:
            self.broken += 1
            if len(self.samples) < SAMPLES:
                self.samples.append(f"{self.conversation_id}: {'; '.join(broken[:3])}")
        self.history.append((prefix, outcome.messages))
        return Sent(outcome.messages, outcome.tools, outcome.tokens_after, client=decoded.messages, raw=raw)

    def finish(self, last: Sent | None, left: set[str], tally: Tally) -> set[str]:
        tally.codec_checked += self.checked
        tally.codec_violations += self.broken
        tally.violation_samples = (tally.violation_samples + self.samples)[:SAMPLES]
        return super().finish(last, left, tally)
