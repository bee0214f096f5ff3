"""What telemetry reads from an exchange's archive records once it ends: the answer's model, id, finish
reason and token usage, and a categorical error type — never content (proxy/telemetry.py)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from proxy.archive_parse import integer, parse_response

if TYPE_CHECKING:
    from proxy.archive import ExchangeRecord

_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')  # the first unescaped key: never inside a string
USAGE = {"gen_ai.usage.input_tokens": "prompt_tokens", "gen_ai.usage.output_tokens": "completion_tokens"}
CACHE = {"gen_ai.usage.cache_read.input_tokens": "cached_tokens",
         "gen_ai.usage.cache_creation.input_tokens": "cache_write_tokens"}


def answer_attributes(record: ExchangeRecord) -> dict[str, Any]:
    """Response model, id, finish reason and token usage of one upstream answer (none of its content)."""
    if not 200 <= record.status < 300 or not (record.response_body or record.response_chunks):
        return {}
    try:
        parsed = parse_response(record)
    except Exception:  # what the archive cannot read, telemetry does not report
        return {}
    usage = parsed.usage or {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    found: dict[str, Any] = {key: integer(usage.get(name)) for key, name in USAGE.items()}
    found |= {key: integer(details.get(name)) for key, name in CACHE.items()}
    found["gen_ai.response.id"] = parsed.response_id
    found["gen_ai.response.finish_reasons"] = [parsed.finish_reason] if parsed.finish_reason else None
    found["gen_ai.response.model"] = response_model(record)
    return present(found)


def response_model(record: ExchangeRecord) -> str | None:
    """The model the upstream names (every format names it before any content: the first 64 KB)."""
    head = record.response_chunks[:64] if record.stream and record.response_chunks else [record.response_body]
    found = _MODEL.search(b"".join(part or b"" for part in head)[:65536])
    return found.group(1).decode("utf-8", "replace") if found else None


def record_problem(record: ExchangeRecord) -> str | None:
    """An error.type for a record the proxy marked (its message may quote the upstream: never exported)."""
    if not record.error:
        return None
    return "client_disconnected" if record.error.startswith("client disconnected") else "_OTHER"



def present(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None and v != ""}
