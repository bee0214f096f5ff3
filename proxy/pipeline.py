"""The layers, in order: each takes the conversation and returns the rewritten one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.policy import LoadedPolicy
from proxy.session import Session
from proxy.tokens import TokenCounter


@dataclass
class Conversation:
    """What the layers may rewrite. The system prompt and the client's tools are never edited in place."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[Any] | None


@dataclass
class Outcome:
    messages: list[dict[str, Any]]
    tools: list[Any] | None
    changed: bool
    tokens_before: int
    tokens_after: int
    gate: str = "pass"


@dataclass
class PipelineContext:
    policy: LoadedPolicy
    session: Session
    tenant: str
    tokens: TokenCounter


def run(conversation: Conversation, context: PipelineContext) -> Outcome:
    before = context.tokens.request(conversation.messages, conversation.tools, conversation.model)
    return Outcome(conversation.messages, conversation.tools, changed=False,
                   tokens_before=before, tokens_after=before)
