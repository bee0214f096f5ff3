"""`ctxproxy replay` takes Anthropic Messages request bodies (a Claude Code capture) as well as chat
conversations: the codec decodes them, and the replay measures the same things."""

from __future__ import annotations

from pathlib import Path

import orjson

from proxy.policy import LoadedPolicy, Policy
from proxy.replay import replay_files

FIXTURE = Path(__file__).parent.parent / "fixtures" / "claude_code_request.json"


def test_replay_of_a_claude_code_request(tmp_path):
    body = orjson.loads(FIXTURE.read_bytes())
    path = tmp_path / "claude_code.jsonl"
    path.write_bytes(orjson.dumps(body) + b"\n")
    policy = LoadedPolicy("t", Policy.model_validate({"budget": {"max_input_tokens": 40000}}), None)
    report = replay_files([path], policy)["overall"]
    assert report["requests"] == 25  # one per assistant turn of the tool loop
    assert report["token_ratio"] < 0.6 and report["recoverable"] == 1.0
    assert report["pairing_errors"] == 0 and report["over_budget"] == 0 and report["refused"] == 0
