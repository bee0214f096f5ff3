"""What each upstream call cost, what the same request unmodified would have cost, and the difference.

One definition, used by the archive, `ctxproxy report`, the dashboard, the exchange log and /metrics:

- spent: the call as it went upstream, from the provider's own usage (prompt tokens, cache reads, cache
  writes, output tokens) when it reports them (`cost_source` "provider"); from our token estimate of what
  was forwarded, with no cache, when it does not ("estimated"). Internal rounds (the proxy answering
  read_tool_result or recall) and the proxy's own model calls are spent like any other call.
- baseline: the client's request as it sent it, on the first call of an exchange only (a client makes one
  call; our extra rounds are ours). Its prompt is our estimate of the client's tokens scaled by the
  provider's count of what we forwarded over our estimate of it (so both sides are in the provider's
  tokenizer); its cache hit is the prefix it shares with the client's previous request of the session (the
  provider caches prefixes, from 1,024 tokens on); its cache writes are in the same share as the call's
  own; its output is the call's output. A request forwarded exactly as sent is its own baseline.
- saved = baseline - spent, per call, frozen when it is archived (prices of that day), so a total only
  changes when calls are added. It is negative where the proxy cost more than it saved.

Prices are litellm's bundled cost map, overridden per model by `pricing` in the config (USD per million
tokens). A model with no price is "unpriced": tokens are still counted, dollars are not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.model_map import model_prices

PER_MILLION = 1_000_000
CACHE_MIN_TOKENS = 1024  # providers cache prefixes from about this long


@dataclass(frozen=True)
class Prices:
    """USD per token. A missing cache price falls back to the input price (no discount assumed)."""

    input: float
    output: float
    cache_read: float
    cache_write: float
    source: str  # "litellm" | "config"

    def as_dict(self) -> dict[str, Any]:
        return {"input": self.input, "output": self.output, "cache_read": self.cache_read,
                "cache_write": self.cache_write, "source": self.source}


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


class Pricing:
    """Prices by model: the config's overrides (per million tokens) first, then litellm's map."""

    def __init__(self, overrides: Mapping[str, Mapping[str, float | None]] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self._cache: dict[str, Prices | None] = {}

    def for_model(self, model: str | None) -> Prices | None:
        if not model:
            return None
        if model not in self._cache:
            self._cache[model] = self._lookup(model)
        return self._cache[model]

    def _lookup(self, model: str) -> Prices | None:
        override = self.overrides.get(model) or self.overrides.get(model.split("/", 1)[-1])
        if override is not None:
            per_token = {k: (v / PER_MILLION if v is not None else None) for k, v in override.items()}
            source, found = "config", per_token
        else:
            source, found = "litellm", model_prices(model) or {}
        if found.get("input") is None:
            return None
        base = _number(found.get("input"), 0.0)
        return Prices(input=base, output=_number(found.get("output"), base),
                      cache_read=_number(found.get("cache_read"), base),
                      cache_write=_number(found.get("cache_write"), base), source=source)


@dataclass(frozen=True)
class Usage:
    prompt: float  # every input token, cache reads and writes included
    cached: float
    written: float
    completion: float

    def cost(self, prices: Prices) -> float:
        fresh = max(0.0, self.prompt - self.cached - self.written)
        return (fresh * prices.input + self.cached * prices.cache_read + self.written * prices.cache_write
                + self.completion * prices.output)


def account(row: Mapping[str, Any], prices: Prices | None) -> dict[str, Any]:
    """The accounting columns of one archived call, from its row (usage columns already parsed)."""
    if not 200 <= _int(row.get("status")) < 300:
        return {"cost_source": None}  # a failed call is not billed (and not counted as saved)
    forwarded, client = _int(row.get("tokens_after")), _int(row.get("tokens_before"))
    provider = row.get("prompt_tokens") is not None
    if provider:
        spent = Usage(_int(row.get("prompt_tokens")), _int(row.get("cached_tokens")),
                      _int(row.get("cache_write_tokens")), _int(row.get("completion_tokens")))
    else:
        cached = min(forwarded, _int(row.get("forwarded_cached_tokens")))
        spent = Usage(forwarded, cached, 0, _int(row.get("completion_tokens")))
    columns: dict[str, Any] = {"cost_source": "provider" if provider else "estimated"}
    baseline: Usage | None = None  # only the first call of a client's request has one
    first = not _int(row.get("round")) and client > 0
    if first and client == forwarded and row.get("request_leaf") \
            and row.get("request_leaf") == row.get("forwarded_leaf"):
        baseline = spent  # forwarded as the client sent it: the baseline is the call itself
    elif first:
        scale = spent.prompt / forwarded if provider and forwarded and spent.prompt else 1.0
        prompt = client * scale
        shared = _int(row.get("client_cached_tokens"))
        hit = min(prompt, shared * scale) if shared >= CACHE_MIN_TOKENS else 0.0
        uncached = max(0.0, spent.prompt - spent.cached)
        write_share = spent.written / uncached if uncached else 0.0
        baseline = Usage(prompt, hit, (prompt - hit) * write_share, spent.completion)
    columns["baseline_tokens"] = round(baseline.prompt) if baseline else 0
    columns["baseline_cached_tokens"] = round(baseline.cached) if baseline else 0
    if prices is None:
        columns["cost_source"] = "unpriced"
        return columns
    cost = spent.cost(prices)
    base = baseline.cost(prices) if baseline else 0.0
    columns.update(cost_usd=cost, baseline_usd=base, saved_usd=base - cost)
    return columns


def prefix_hit(previous: tuple[int, Any, int] | None, messages: list[Any]) -> int:
    """Tokens of the previous request when it is a prefix of `messages` (its length and last message
    match, cache markers aside: agents resend the whole history), else 0; under the providers' minimum
    it is not cached. `previous`'s last message may be a replica's digest of it, unmarked."""
    if previous is None:
        return 0
    count, last, tokens = previous
    if not 0 < count <= len(messages) or unmarked(messages[count - 1]) != unmarked(last):
        return 0
    return tokens if tokens >= CACHE_MIN_TOKENS else 0


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def unmarked(message: Any) -> Any:
    """`message` without its cache markers: clients of Anthropic models move theirs to the newest message
    every turn (on the chat route, in content parts; the Messages codec keeps them apart), which edits the
    one before it in nothing a layer reads and leaves the provider's cached prefix as it was."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    parts = content if isinstance(content, list) else []
    marked = "cache_control" in message or any(isinstance(p, dict) and "cache_control" in p for p in parts)
    if not marked:
        return message
    plain = {k: v for k, v in message.items() if k != "cache_control"}
    if parts:
        plain["content"] = [{k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, dict) else p
                            for p in parts]
    return plain
