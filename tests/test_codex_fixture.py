"""The Codex request fixture is current, well formed, and what the openai SDK sends unchanged."""

from __future__ import annotations

import json

import openai
import pytest

from tests.fixtures.make_codex_request import OUT, build, render
from tests.responses_upstream import message_item, response_stream
from tests.servers import Step


@pytest.fixture(scope="module")
def body() -> dict:
    return json.loads(OUT.read_text())


def test_fixture_is_regenerated_identically():
    assert OUT.read_text() == render(build()), "run: python -m tests.fixtures.make_codex_request"


def test_every_call_is_answered_after_it_in_order(body):
    items = body["input"]
    calls = [(n, i["call_id"]) for n, i in enumerate(items)
             if i["type"] in ("function_call", "custom_tool_call")]
    outputs = {i["call_id"]: (n, i["type"]) for n, i in enumerate(items)
               if i["type"].endswith("_call_output")}
    assert len(calls) == len(outputs) == len({c for _, c in calls})
    for n, call_id in calls:
        at, kind = outputs[call_id]
        assert at > n and kind == ("custom_tool_call_output" if items[n]["type"] == "custom_tool_call"
                                   else "function_call_output")
    assert [c for _, c in calls] == sorted(outputs, key=lambda c: outputs[c][0])
    assert items[-1]["type"] == "function_call_output"


def test_shape_of_a_long_codex_session(body):
    items = body["input"]
    assert [i["role"] for i in items[:3]] == ["user"] * 3
    assert items[0]["content"][0]["text"].startswith("<user_instructions>")
    assert items[1]["content"][0]["text"].startswith("<environment_context>")
    assert all("id" not in i for i in items)  # Codex sends items without ids (stateless, store: false)
    reasoning = [i for i in items if i["type"] == "reasoning"]
    assert len(reasoning) >= 20 and all(r["encrypted_content"].startswith("gAAAAAB") for r in reasoning)
    assert any(r["summary"] for r in reasoning) and any(not r["summary"] for r in reasoning)
    shell = [json.loads(i["arguments"]) for i in items if i.get("name") == "shell"]
    assert all(isinstance(a["command"], list) and a["workdir"] for a in shell)
    (patch,) = [i for i in items if i["type"] == "custom_tool_call"]
    assert patch["name"] == "apply_patch" and patch["input"].startswith("*** Begin Patch\n")
    assert {t.get("name", t["type"]) for t in body["tools"]} == {"shell", "update_plan", "apply_patch",
                                                                  "view_image", "web_search"}
    assert body["store"] is False and body["stream"] is True
    assert body["include"] == ["reasoning.encrypted_content"]
    assert 1_500_000 > len(OUT.read_bytes()) > 200_000


def test_sdk_sends_the_fixture_unchanged(body, upstream_server, fake_upstream):
    _, server = upstream_server
    client = openai.OpenAI(api_key="sk-test", base_url=f"{server.url}/v1", max_retries=0, timeout=30)
    fake_upstream.then(Step(kind="stream",
                            chunks=response_stream([message_item("done")], model=body["model"])))
    params = {k: v for k, v in body.items() if k != "stream"}
    with client.responses.stream(**params) as stream:
        assert stream.get_final_response().output_text == "done"
    assert fake_upstream.responses_requests[0].json() == body
