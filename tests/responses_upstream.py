"""OpenAI Responses API shapes for the fake provider (`tests.servers.FakeUpstream` serves `/v1/responses`).

Builders for output items, a whole Response object, the SSE event sequence a streamed Response arrives in,
input items (for building requests) and the error bodies. Shapes follow the public API, the `openai` SDK's
types (`openai.types.responses`) and what Codex CLI sends and parses:

- Response: {id, object: "response", created_at, status, background, error, incomplete_details, instructions,
  max_output_tokens, max_tool_calls, model, output: [...], parallel_tool_calls, previous_response_id,
  prompt_cache_key, reasoning, safety_identifier, service_tier, store, temperature, text, tool_choice, tools,
  top_logprobs, top_p, truncation, usage: {input_tokens, input_tokens_details: {cached_tokens}, output_tokens,
  output_tokens_details: {reasoning_tokens}, total_tokens}, user, metadata}.
- Stream: response.created · response.in_progress (both with status "in_progress", output [], usage null) ·
  per output item, with its `output_index`: response.output_item.added (the item in progress, empty) →
  message: content_part.added → output_text.delta* → output_text.done → content_part.done ·
  function_call: function_call_arguments.delta (2+) → function_call_arguments.done ·
  custom_tool_call: custom_tool_call_input.delta (2+) → custom_tool_call_input.done ·
  reasoning: per summary part reasoning_summary_part.added → reasoning_summary_text.delta* →
  reasoning_summary_text.done → reasoning_summary_part.done · → response.output_item.done (the whole item) ·
  then response.completed (or .incomplete / .failed) carrying the whole Response. Every event is
  `event: <type>\\ndata: <json>\\n\\n` with a `sequence_number` counting from 0; there is no `[DONE]`.
- HTTP error: {"error": {"message", "type", "param", "code"}}. A mid-stream `error` event nests the same
  object: {"type": "error", "error": {...}, "sequence_number": n} (what the API sends; the SDK raises on it).
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson

DEFAULT_MODEL = "gpt-5"
CREATED_AT = 1700000000
TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete",
            "failed": "response.failed"}

# HTTP status OpenAI uses with each error type (`code` refines it: invalid_api_key, context_length_exceeded).
ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                "not_found_error": 404, "rate_limit_error": 429, "insufficient_quota": 429,
                "server_error": 500}


# --- output items ----------------------------------------------------------------------------------------

def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def message_item(text: str, *, id: str = "msg_fake", status: str = "completed") -> dict[str, Any]:
    """An assistant message with one output_text part."""
    return {"id": id, "type": "message", "status": status, "content": [output_text(text)],
            "role": "assistant"}


def function_call(call_id: str, name: str, arguments_json: str, *, id: str | None = None) -> dict[str, Any]:
    """A function tool call; `arguments_json` is the JSON *string* the API sends; `id` comes from call_id."""
    return {"id": id or f"fc_{call_id.removeprefix('call_')}", "type": "function_call", "status": "completed",
            "arguments": arguments_json, "call_id": call_id, "name": name}


def custom_tool_call(call_id: str, name: str, input: str, *, id: str | None = None) -> dict[str, Any]:
    """A freeform (type "custom") tool call, e.g. Codex's apply_patch; `input` is raw text, not JSON."""
    return {"id": id or f"ctc_{call_id.removeprefix('call_')}", "type": "custom_tool_call",
            "status": "completed", "call_id": call_id, "input": input, "name": name}


def reasoning(summary_text: str | list[str], encrypted_content: str | None = None, *,
              id: str = "rs_fake") -> dict[str, Any]:
    """A reasoning item: summary parts ("" or [] for none) and the opaque `encrypted_content`."""
    parts = [summary_text] if isinstance(summary_text, str) else list(summary_text)
    item: dict[str, Any] = {"id": id, "type": "reasoning",
                            "summary": [{"type": "summary_text", "text": t} for t in parts if t]}
    if encrypted_content is not None:
        item["encrypted_content"] = encrypted_content
    return item


# --- input items (requests) ------------------------------------------------------------------------------

def input_message(role: str, text: str) -> dict[str, Any]:
    """A request-side message item: user/developer text is input_text, assistant text output_text."""
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": part, "text": text}]}


def function_call_output(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def custom_tool_call_output(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "custom_tool_call_output", "call_id": call_id, "output": output}


# --- whole responses -------------------------------------------------------------------------------------

def usage_of(usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """Full usage object; `usage` overrides any key (partial *_details are merged), total recomputed."""
    out: dict[str, Any] = {"input_tokens": 36, "input_tokens_details": {"cached_tokens": 0},
                           "output_tokens": 18, "output_tokens_details": {"reasoning_tokens": 0}}
    for key, value in (usage or {}).items():
        out[key] = out[key] | value if key.endswith("_details") and isinstance(value, dict) else value
    if "total_tokens" not in out:
        out["total_tokens"] = out["input_tokens"] + out["output_tokens"]
    return out


def response(output_items: list[dict[str, Any]], *, response_id: str = "resp_fake",
             model: str = DEFAULT_MODEL, usage: dict[str, Any] | None = None, status: str = "completed",
             **fields: Any) -> dict[str, Any]:
    """A complete Response object. `fields` override top-level keys (instructions, tools, error, ...)."""
    body: dict[str, Any] = {
        "id": response_id, "object": "response", "created_at": CREATED_AT, "status": status,
        "background": False, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None, "max_output_tokens": None, "max_tool_calls": None, "model": model,
        "output": [dict(item) for item in output_items], "parallel_tool_calls": True,
        "previous_response_id": None, "prompt_cache_key": None,
        "reasoning": {"effort": "medium", "summary": None}, "safety_identifier": None,
        "service_tier": "default", "store": True, "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto", "tools": [],
        "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled",
        "usage": usage_of(usage) if status != "in_progress" else None, "user": None, "metadata": {},
    }
    if status == "failed" and "error" not in fields:
        body["error"] = {"code": "server_error", "message": "The model failed to generate a response."}
    return body | fields


# --- streaming -------------------------------------------------------------------------------------------

def event(data: dict[str, Any]) -> bytes:
    """One SSE event, named after its `type` (as the API sends them)."""
    return f"event: {data['type']}\ndata: {orjson.dumps(data).decode()}\n\n".encode()


def split(s: str, pieces: int = 2) -> list[str]:
    """`s` cut into `pieces` non-empty parts (fewer when `s` is shorter); [""] for the empty string."""
    if not s:
        return [""]
    pieces = max(1, min(pieces, len(s)))
    step = -(-len(s) // pieces)
    return [s[i:i + step] for i in range(0, len(s), step)]


def _obfuscation(delta: str) -> str:
    """Deterministic stand-in for the random padding the API adds to delta events."""
    return "Qx7mZp2Lk9Vb4RtN"[: 1 + zlib.crc32(delta.encode()) % 16]


def _item_events(index: int, item: dict[str, Any], pieces: int, obfuscate: bool) -> list[dict[str, Any]]:
    kind, item_id = item["type"], item.get("id", f"item_{index}")
    at = {"item_id": item_id, "output_index": index}

    def delta(type: str, text: str, **extra: Any) -> dict[str, Any]:
        d = {"type": type, **at, **extra, "delta": text}
        return d | ({"obfuscation": _obfuscation(text)} if obfuscate else {})

    if kind == "message":
        started = item | {"status": "in_progress", "content": []}
        out: list[dict[str, Any]] = []
        for j, part in enumerate(item.get("content") or ()):
            at_part = {**at, "content_index": j}
            if part.get("type") != "output_text":  # refusal and others arrive whole
                out += [{"type": "response.content_part.added", **at_part, "part": part},
                        {"type": "response.content_part.done", **at_part, "part": part}]
                continue
            out.append({"type": "response.content_part.added", **at_part, "part": part | {"text": ""}})
            out += [delta("response.output_text.delta", p, content_index=j, logprobs=[])
                    for p in split(part["text"], pieces)]
            out += [{"type": "response.output_text.done", **at_part, "text": part["text"], "logprobs": []},
                    {"type": "response.content_part.done", **at_part, "part": part}]
    elif kind in ("function_call", "custom_tool_call"):
        field, name = ("arguments", "function_call_arguments") if kind == "function_call" \
            else ("input", "custom_tool_call_input")
        started = item | {"status": "in_progress", field: ""}
        out = [delta(f"response.{name}.delta", p) for p in split(item[field], max(2, pieces))]
        done = {"type": f"response.{name}.done", **at, field: item[field]}
        out.append(done | ({"name": item["name"]} if kind == "function_call" else {}))
    elif kind == "reasoning":
        started = {k: v for k, v in item.items() if k not in ("encrypted_content", "content", "summary")}
        started["summary"] = []
        out = []
        for j, part in enumerate(item.get("summary") or ()):
            at_part = {**at, "summary_index": j}
            out.append({"type": "response.reasoning_summary_part.added", **at_part,
                        "part": {"type": "summary_text", "text": ""}})
            out += [delta("response.reasoning_summary_text.delta", p, summary_index=j)
                    for p in split(part["text"], pieces)]
            out += [{"type": "response.reasoning_summary_text.done", **at_part, "text": part["text"]},
                    {"type": "response.reasoning_summary_part.done", **at_part, "part": part}]
    else:  # web_search_call and other built-in tool items: announced in progress, then whole
        started, out = item | ({"status": "in_progress"} if "status" in item else {}), []
    return [{"type": "response.output_item.added", "output_index": index, "item": started}, *out,
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def response_stream(output_items: list[dict[str, Any]], *, response_id: str = "resp_fake",
                    model: str = DEFAULT_MODEL, usage: dict[str, Any] | None = None,
                    status: str = "completed", pieces: int = 2, obfuscate: bool = True,
                    **fields: Any) -> list[bytes]:
    """The SSE events of a streamed Response, one list element (network write) per event.

    Text and summaries go out in `pieces` deltas, function arguments and custom tool input in at least two;
    the last event is response.completed (.incomplete / .failed for that `status`) with the whole Response.
    """
    start = response([], response_id=response_id, model=model, status="in_progress", **fields)
    events: list[dict[str, Any]] = [{"type": "response.created", "response": start},
                                    {"type": "response.in_progress", "response": start}]
    for index, item in enumerate(output_items):
        events += _item_events(index, item, pieces, obfuscate)
    final = response(output_items, response_id=response_id, model=model, usage=usage, status=status, **fields)
    events.append({"type": TERMINAL[status], "response": final})
    return [event(e | {"sequence_number": n}) for n, e in enumerate(events)]


def error_event(message: str, *, sequence_number: int, type: str = "server_error", code: str | None = None,
                param: str | None = None) -> bytes:
    """A mid-stream `error` event (HTTP status already 200), as the API sends it: the error object nested."""
    return event({"type": "error", "error": {"type": type, "code": code, "message": message, "param": param},
                  "sequence_number": sequence_number})


def error_body(message: str, type: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> bytes:
    """OpenAI's error body; pair it with ERROR_STATUS[type] in a Step(kind="error", ...)."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def parse_stream(data: bytes) -> list[dict[str, Any]]:
    """The events of an SSE body, each as its JSON data with the SSE `event:` name under "_event"."""
    out = []
    for block in data.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            out.append(orjson.loads(fields["data"]) | {"_event": fields.get("event")})
    return out


# --- reading what the fake upstream got ------------------------------------------------------------------

def last_user_text(body: dict[str, Any]) -> str | None:
    """The text of the last user message of a request: `input` itself when a string, else the last user
    item's string content or its last input_text part."""
    items = body.get("input")
    if isinstance(items, str):
        return items
    for item in reversed(items or []):
        if not isinstance(item, dict) or item.get("role") != "user" \
                or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            return content
        texts = [p.get("text", "") for p in content or ()
                 if isinstance(p, dict) and p.get("type") == "input_text"]
        return texts[-1] if texts else None
    return None
