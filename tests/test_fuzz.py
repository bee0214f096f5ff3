"""Fuzz the real server with structural mutations of valid requests: client mistakes are 4xx, never 5xx.

Through uvicorn and the whole chat path (validator, session, commands, every layer, the archive), with the
default policy and a small-threshold one under which the layers act (summaries, pruning, eviction,
folding, working memory). Invariants per case: no 5xx; a 4xx is OpenAI-shaped JSON naming a param (a body
that is not JSON at all has none, as with OpenAI); a 2xx is archived.
"""

from __future__ import annotations

import os
import random
import uuid

import httpx
import orjson
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests.strategies_requests import mutated_requests, request_bytes

SMALL_POLICY = """
tool_results: {threshold_tokens: 40, keep_recent: 1}
budget: {max_input_tokens: 6000, keep_recent: 1}
window: {max_tokens: 1500, low_water_pct: 0.5}
summary: {max_tokens: 300}
working_memory: {max_entities: 5}
folded: {enabled: true, max_episodes: 2}
assembly: {tokens_max: 800}
"""
ROUTES = ("/v1/chat/completions", "/p/small/v1/chat/completions")
# Deterministic by default (the same cases every run); CTXPROXY_FUZZ_SEED=<n> explores others, and
# CTXPROXY_FUZZ_EXAMPLES=<n> runs more of them (bench/faults.py runs thousands via mutated_requests).
EXAMPLES = int(os.environ.get("CTXPROXY_FUZZ_EXAMPLES", "400"))
SEED = os.environ.get("CTXPROXY_FUZZ_SEED") or None


class Checker:
    def __init__(self, proxy) -> None:
        (proxy.policies_dir / "small.yaml").write_text(SMALL_POLICY)
        self.proxy = proxy
        self.client = httpx.Client(base_url=proxy.url, timeout=60)
        self.statuses: dict[int, int] = {}
        self.rewritten = 0  # 2xx whose forwarded request the layers changed

    def archived(self) -> int:
        self.proxy.flush()
        return next(self.proxy.query("select count(*) as n from exchanges"))["n"]

    def check(self, raw: bytes, route: str, key: int, fresh: bool = False) -> None:
        """`fresh`: a session of its own (replays alike); else the session the body's opening names, which
        earlier cases left state in (sticky cuts, summaries, pins) and this case may contradict."""
        before = self.archived()
        headers = {"content-type": "application/json", "authorization": f"Bearer sk-fuzz-{key}"}
        if fresh:
            headers["x-ctxproxy-session"] = f"fuzz-{uuid.uuid4().hex}"
        response = self.client.post(route, content=raw, headers=headers)
        status = response.status_code
        self.statuses[status] = self.statuses.get(status, 0) + 1
        case = f"{route} {raw[:300]!r}: {status} {response.content[:500]!r}"
        assert status < 500, case
        if status >= 400:
            error = orjson.loads(response.content)["error"]
            assert isinstance(error["message"], str) and error["message"], case
            assert error["type"] == "invalid_request_error", case
            assert "param" in error and "code" in error, case
            assert isinstance(error["param"], str) or error["code"] == "invalid_json", case
        else:
            assert status == 200, case
            assert self.archived() == before + 1, f"not archived: {case}"
            tokens = response.headers.get("x-ctxproxy-tokens-before"), response.headers.get(
                "x-ctxproxy-tokens-after")
            self.rewritten += tokens[0] is not None and tokens[0] != tokens[1]


def test_fuzzed_requests_are_never_5xx(make_proxy, fake_upstream):
    checker = Checker(make_proxy())

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=SEED is None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    # A uniform random source per case (hypothesis's own randoms favour small draws, so rarely reach the
    # deep mutations); a failure prints its case_seed: request_bytes(random.Random(case_seed)) replays it.
    @given(case_seed=st.integers(0, 2**32 - 1), route=st.sampled_from(ROUTES), key=st.integers(0, 3),
           fresh=st.booleans())
    def case(case_seed: int, route: str, key: int, fresh: bool) -> None:
        checker.check(request_bytes(random.Random(case_seed)), route, key, fresh)

    if SEED is not None:
        case = seed(int(SEED))(case)

    case()
    assert sum(checker.statuses.values()) >= EXAMPLES
    assert checker.statuses.get(200, 0) > EXAMPLES // 10, checker.statuses
    assert checker.rewritten > 0  # the layers acted on some of them
    assert sum(n for s, n in checker.statuses.items() if s >= 400) > EXAMPLES // 10, checker.statuses


def test_seeded_cases_are_reproducible_and_varied():
    first, again = mutated_requests(seed=3, n=200), mutated_requests(seed=3, n=200)
    assert first == again and mutated_requests(seed=4, n=5) != first[:5]
    assert len(set(first)) > 150
    assert any(b"\\ud8" in raw or b"\\udc" in raw or b"\\udf" in raw for raw in first)  # lone surrogates
    assert any(b"[[[[[[[[" in raw for raw in first)  # deep nesting


def test_hostile_strings_in_evicted_tool_calls(make_proxy, fake_upstream):
    """Valid shapes the fuzzer found hard to reach: JSON-looking arguments nested far beyond the
    interpreter's recursion limit, or numbers beyond its digit limit, in exchanges that folded memory
    distills as they slide out of the window."""
    checker = Checker(make_proxy())
    deep_object = '{"a":' * 950 + "1" + "}" * 950
    for arguments in ("[" * 5000, '{"a":' * 3000, deep_object, "1" + "0" * 5000, "[" * 200 + "]" * 200):
        messages: list[dict] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
        for turn in range(12):
            call = {"id": f"call_{turn}", "type": "function",
                    "function": {"name": "run", "arguments": arguments}}
            messages += [{"role": "assistant", "content": "I decided to use make.", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"], "content": f"line {turn}\n" * 60},
                         {"role": "user", "content": f"next {turn}"}]
        raw = orjson.dumps({"model": "gpt-4o", "messages": messages})
        checker.check(raw, ROUTES[1], 0)
    assert checker.statuses == {200: 5}
