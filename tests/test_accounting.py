"""Spent, baseline and saved dollars per call (proxy/accounting.py), hand-computed, and the same figures
through the real server, the archive, `ctxproxy report` and /metrics (issue 12)."""

from __future__ import annotations

import logging

import httpx
import orjson
import pytest

from proxy import cli
from proxy.accounting import Prices, Pricing, account, prefix_hit
from tests.anthropic_upstream import message, text
from tests.conftest import BOTH_BACKENDS
from tests.servers import Step, completion, stream_chunks

PRICES = Prices(input=2e-6, output=8e-6, cache_read=0.5e-6, cache_write=2.5e-6, source="config")
CLAUDE = Prices(input=3e-6, output=15e-6, cache_read=0.3e-6, cache_write=3.75e-6, source="config")


def test_openai_usage_against_the_unmodified_request():
    # We forwarded 2,000 tokens (the provider counted 2,200: its tokenizer is 1.1x ours) of a 5,000-token
    # request; 1,100 came from its cache. Unmodified, the request would have been 5,500 provider tokens,
    # 4,400 of them (the 4,000 it shares with the previous request, x1.1) from the cache.
    row = {"status": 200, "round": 0, "tokens_before": 5000, "tokens_after": 2000, "prompt_tokens": 2200,
           "cached_tokens": 1100, "completion_tokens": 100, "client_cached_tokens": 4000}
    columns = account(row, PRICES)
    assert columns["cost_source"] == "provider"
    assert columns["cost_usd"] == pytest.approx(1100 * 2e-6 + 1100 * 0.5e-6 + 100 * 8e-6)  # 0.00355
    assert columns["baseline_usd"] == pytest.approx(1100 * 2e-6 + 4400 * 0.5e-6 + 100 * 8e-6)  # 0.0052
    assert columns["saved_usd"] == pytest.approx(0.0052 - 0.00355)
    assert (columns["baseline_tokens"], columns["baseline_cached_tokens"]) == (5500, 4400)


def test_anthropic_usage_with_cache_writes():
    # input 500 + cache read 3,000 + cache write 1,000 = 4,500 provider tokens for our 4,000; the client's
    # 8,000 -> 9,000, 6,750 shared with its previous request; writes in the same share as ours (2/3 of
    # what was not read).
    row = {"status": 200, "round": 0, "tokens_before": 8000, "tokens_after": 4000, "prompt_tokens": 4500,
           "cached_tokens": 3000, "cache_write_tokens": 1000, "completion_tokens": 200,
           "client_cached_tokens": 6000}
    columns = account(row, CLAUDE)
    assert columns["cost_usd"] == pytest.approx(0.0015 + 0.0009 + 0.00375 + 0.003)
    assert columns["baseline_usd"] == pytest.approx(750 * 3e-6 + 6750 * 0.3e-6 + 1500 * 3.75e-6 + 0.003)
    assert columns["saved_usd"] == pytest.approx(0.0129 - 0.00915)


def test_internal_rounds_are_spent_and_save_nothing():
    row = {"status": 200, "round": 1, "tokens_before": 5000, "tokens_after": 3000, "prompt_tokens": 3000,
           "cached_tokens": 2000, "completion_tokens": 10, "client_cached_tokens": 4000}
    columns = account(row, PRICES)
    assert columns["baseline_usd"] == 0 and columns["saved_usd"] == pytest.approx(-columns["cost_usd"])


def test_without_provider_usage_the_cost_is_estimated_and_labelled():
    row = {"status": 200, "round": 0, "tokens_before": 3000, "tokens_after": 3000,
           "forwarded_cached_tokens": 2000, "client_cached_tokens": 2000}
    columns = account(row, PRICES)
    assert columns["cost_source"] == "estimated"
    assert columns["cost_usd"] == pytest.approx(1000 * 2e-6 + 2000 * 0.5e-6)
    assert columns["saved_usd"] == pytest.approx(0.0)  # unchanged request, same cache: nothing saved


def test_short_prefixes_are_not_cached_failures_are_not_billed_unknown_models_are_unpriced():
    short = account({"status": 200, "tokens_before": 900, "tokens_after": 900, "prompt_tokens": 900,
                     "client_cached_tokens": 800}, PRICES)
    assert short["baseline_cached_tokens"] == 0
    assert account({"status": 500, "tokens_before": 10, "tokens_after": 10}, PRICES) == {"cost_source": None}
    unpriced = account({"status": 200, "tokens_before": 10, "tokens_after": 10, "prompt_tokens": 12}, None)
    assert unpriced["cost_source"] == "unpriced" and "cost_usd" not in unpriced


def test_prices_from_the_config_then_litellms_map():
    pricing = Pricing({"my-model": {"input": 1.0, "output": 4.0, "cache_read": None, "cache_write": None}})
    mine = pricing.for_model("my-model")
    assert mine is not None and mine.source == "config"
    assert (mine.input, mine.output, mine.cache_read) == (1e-6, 4e-6, 1e-6)  # no cache price: as input
    gpt = pricing.for_model("gpt-4o")
    assert gpt is not None and gpt.source == "litellm" and gpt.input == pytest.approx(2.5e-6)
    assert pricing.for_model("openai/gpt-4o") == gpt
    assert pricing.for_model("no-such-model-xyz") is None and pricing.for_model(None) is None


def test_prefix_hit_needs_the_previous_request_as_a_prefix():
    history = [{"role": "user", "content": str(i)} for i in range(4)]
    assert prefix_hit((3, history[2], 5000), history) == 5000
    assert prefix_hit((3, {"role": "user", "content": "edited"}, 5000), history) == 0
    assert prefix_hit((5, history[3], 5000), history) == 0  # longer than this request: not a prefix


def test_prefix_hit_takes_a_moved_cache_marker_for_no_edit() -> None:
    """An Anthropic client marks its newest message every turn: the previous request's last message comes
    back without the marker, and a block marked in a part is compared without it too."""
    from proxy.accounting import unmarked
    from proxy.state_snapshot import MessageDigest

    plain = {"role": "user", "content": [{"type": "text", "text": "run the tests"}]}
    marked = {"role": "user", "content": [{"type": "text", "text": "run the tests", "cache_control": {}}]}
    assert unmarked(marked) == plain and unmarked(plain) is plain
    assert unmarked({**plain, "cache_control": {"type": "ephemeral"}}) == plain
    history = [{"role": "system", "content": "s"}, plain, {"role": "assistant", "content": "ok"}, marked]
    assert prefix_hit((2, unmarked(marked), 5000), history) == 5000  # the marker moved off it
    assert prefix_hit((2, MessageDigest(MessageDigest.of(unmarked(marked))), 5000), history) == 5000
    assert prefix_hit((2, marked, 5000), history) == 5000  # (kept as it was sent)
    # A marker set on the message the previous request ended with (a client that marks two messages).
    assert prefix_hit((2, plain, 5000), [history[0], marked, *history[2:]]) == 5000
    # A session caught up from a replica knows the previous last message by its digest, unmarked.
    from proxy.session_state import SessionState
    from proxy.state_snapshot import restore, snapshot

    sent = SessionState("tenant-a", "s")
    sent.last_client = (2, marked, 5000)
    caught_up = SessionState("tenant-a", "s")
    restore(caught_up, orjson.loads(orjson.dumps(snapshot(sent))))
    assert isinstance(caught_up.last_client[1], MessageDigest)
    assert prefix_hit(caught_up.last_client, history) == 5000
    edited = {"role": "user", "content": [{"type": "text", "text": "run the linter", "cache_control": {}}]}
    assert prefix_hit((2, unmarked(edited), 5000), history) == 0
    assert prefix_hit((3, history[2], 1000), history) == 0  # under the providers' minimum
    assert prefix_hit(None, history) == 0


# ------------------------------------------------------------------------------ through the server

PRICING = {"pricing": {"acct-model": {"input": 2.0, "output": 8.0, "cache_read": 0.5}}}
SYSTEM = "You are a careful agent. " + "Follow the project rules exactly. " * 260  # ~1.8k tokens


def usage_reply(prompt: int, cached: int, completion_tokens: int = 10) -> Step:
    body = completion("ok", model="acct-model")
    body["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                     "total_tokens": prompt + completion_tokens,
                     "prompt_tokens_details": {"cached_tokens": cached}}
    return Step(payload=body)


def rows(proxy, session: str) -> list[dict]:
    proxy.flush()
    return list(proxy.query("select * from exchanges where session_id = ? order by created_at, rowid",
                            (session,)))


@BOTH_BACKENDS
def test_costs_are_archived_reported_and_counted(make_proxy, fake_upstream, capsys, caplog):
    caplog.set_level(logging.INFO, logger="ctxproxy.exchange")
    proxy = make_proxy(PRICING)
    client = proxy.client(default_headers={"x-ctxproxy-session": "acct-1"})
    log = "\n".join(f"2026-11-23 04:{i % 60:02d} worker-{i % 7} processed batch {i} in {i * 3} ms"
                    for i in range(600))  # ~9k tokens: summarized before it is ever sent
    call = {"id": "call_log", "type": "function", "function": {"name": "read_log", "arguments": "{}"}}
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "check the log"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_log", "content": log}]
    tools = [{"type": "function", "function": {"name": "read_log", "parameters": {"type": "object"}}}]
    fake_upstream.then(usage_reply(2300, 0), usage_reply(2400, 2200))
    first = client.chat.completions.with_raw_response.create(model="acct-model", messages=history,
                                                              tools=tools)
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "the word is zebra-42"}]
    second = client.chat.completions.with_raw_response.create(model="acct-model", messages=history,
                                                               tools=tools)
    for raw in (first, second):
        assert float(raw.headers["x-ctxproxy-overhead-ms"]) >= 0
    before1, after1 = (int(first.headers[f"x-ctxproxy-tokens-{k}"]) for k in ("before", "after"))
    before2, after2 = (int(second.headers[f"x-ctxproxy-tokens-{k}"]) for k in ("before", "after"))
    assert before1 > 3 * after1  # the log was summarized
    one, two = rows(proxy, "acct-1")
    # First: 2,300 provider tokens for our `after1`; the log, sent as it was, would have been
    # before1 x 2300/after1 of them, none cached.
    scale1 = 2300 / after1
    assert one["cost_usd"] == pytest.approx(2300 * 2e-6 + 10 * 8e-6)
    assert one["baseline_usd"] == pytest.approx(before1 * scale1 * 2e-6 + 10 * 8e-6)
    assert one["saved_usd"] == pytest.approx((before1 * scale1 - 2300) * 2e-6) and one["saved_usd"] > 0
    # Second: the client's request shares the first whole (before1 tokens) with it.
    assert two["client_cached_tokens"] == before1
    scale2 = 2400 / after2
    hit = before1 * scale2
    assert two["cost_usd"] == pytest.approx(200 * 2e-6 + 2200 * 0.5e-6 + 10 * 8e-6)
    assert two["baseline_usd"] == pytest.approx((before2 * scale2 - hit) * 2e-6 + hit * 0.5e-6 + 10 * 8e-6)
    assert two["cost_source"] == "provider" and orjson.loads(two["prices"])["source"] == "config"
    assert two["overhead_ms"] >= 0 and two["round"] == 0 and one["summaries"] == 1

    assert cli.main(["report", "--config", str(proxy.config_path), "--session", "acct-1",
                     "--format", "json"]) == 0
    (total,) = orjson.loads(capsys.readouterr().out)
    assert total["requests"] == 2 and total["calls"] == 2
    assert total["spent_usd"] == pytest.approx(one["cost_usd"] + two["cost_usd"], abs=1e-6)
    assert total["saved_usd"] == pytest.approx(one["saved_usd"] + two["saved_usd"], abs=1e-6)
    assert total["tokens_client"] == before1 + before2
    metrics = httpx.get(f"{proxy.url}/metrics").text
    spent = [line for line in metrics.splitlines()
             if line.startswith('ctxproxy_spent_usd_total{model="acct-model"')]
    assert spent and float(spent[0].split()[-1]) == pytest.approx(total["spent_usd"], abs=1e-6)
    assert "ctxproxy_archived_bytes_total" in metrics
    lines = [r for r in caplog.records if r.name == "ctxproxy.exchange"]  # one per exchange, no content
    assert len(lines) == 2 and all("session=acct-1" in r.getMessage() for r in lines)
    assert f"cost_usd={two['cost_usd']:g}" in lines[1].getMessage()
    assert not any("zebra" in r.getMessage() or "project rules" in r.getMessage() for r in lines)


def test_a_cache_marker_moved_every_turn_keeps_the_baselines_cache_hit(make_proxy, fake_upstream):
    """A chat client sending Anthropic's markers in content parts (for OpenRouter, LiteLLM) marks its newest
    message every turn: through the server, each later turn shares the earlier one as its cached prefix
    (the hit a rewritten request's baseline counts; it counted none, so the savings were overstated)."""
    proxy = make_proxy(PRICING)
    client = proxy.client(default_headers={"x-ctxproxy-session": "acct-marker"})
    fake_upstream.then(*(usage_reply(2000, 0) for _ in range(3)))
    history: list[dict] = [{"role": "system", "content": SYSTEM}]
    for number in range(3):
        history.append({"role": "user", "content": [{"type": "text", "text": f"step {number}"}]})
        marked = {**history[-1]["content"][0], "cache_control": {"type": "ephemeral"}}
        newest = {**history[-1], "content": [marked]}
        client.chat.completions.create(model="acct-model", messages=[*history[:-1], newest])
        history.append({"role": "assistant", "content": "ok"})
    first, *later = rows(proxy, "acct-marker")
    assert first["client_cached_tokens"] == 0
    expected = [first["tokens_before"], later[0]["tokens_before"]]
    assert [row["client_cached_tokens"] for row in later] == expected


def test_a_streamed_exchange_records_its_upstream_time(make_proxy, fake_upstream):
    proxy = make_proxy(PRICING)
    client = proxy.client(default_headers={"x-ctxproxy-session": "acct-stream"})
    fake_upstream.then(Step(kind="stream", chunks=stream_chunks(["Hel", "lo"])))
    raw = client.chat.completions.with_raw_response.create(
        model="acct-model", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert float(raw.headers["x-ctxproxy-overhead-ms"]) >= 0
    text_out = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text_out == "Hello"
    (row,) = rows(proxy, "acct-stream")
    assert row["upstream_headers_ms"] is not None and row["upstream_ms"] >= row["upstream_headers_ms"] > 0


def test_anthropic_cache_writes_are_priced(make_proxy, fake_upstream):
    proxy = make_proxy({"pricing": {"claude-acct": {"input": 3.0, "output": 15.0, "cache_read": 0.3,
                                                     "cache_write": 3.75}}})
    usage = {"input_tokens": 500, "output_tokens": 200, "cache_read_input_tokens": 3000,
             "cache_creation_input_tokens": 1000}
    fake_upstream.then(Step(payload=message([text("done")], model="claude-acct", usage=usage)))
    proxy.anthropic(default_headers={"x-ctxproxy-session": "acct-claude"}).messages.create(
        model="claude-acct", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    (row,) = rows(proxy, "acct-claude")
    assert row["cache_write_tokens"] == 1000 and row["cached_tokens"] == 3000
    assert row["cost_usd"] == pytest.approx(500 * 3e-6 + 3000 * 0.3e-6 + 1000 * 3.75e-6 + 200 * 15e-6)


def test_report_rejects_a_bad_since_clearly(proxy, capsys):
    proxy.flush()
    assert cli.main(["report", "--config", str(proxy.config_path), "--since", "yesterday"]) == 2
    assert "--since 'yesterday'" in capsys.readouterr().err


@BOTH_BACKENDS
def test_the_proxys_own_model_calls_are_spent_and_count_against_saved(make_proxy, fake_upstream, capsys):
    from tests.test_model_summary import post, summarizer_answer
    from tests.test_rounds import history

    proxy = make_proxy({"pricing": {"summ-model": {"input": 1.0, "output": 4.0}}})
    (proxy.policies_dir / "summ.yaml").write_text("tool_results:\n  summarizer_model: summ-model\n")
    fake_upstream.then(summarizer_answer, Step(content="answer"))
    answered = post(proxy, history())
    assert answered.status_code == 200
    session = answered.headers["x-ctxproxy-session"]
    ours = [r for r in rows(proxy, session) if r["gate"] == "internal"]
    assert len(ours) == 1 and ours[0]["model"] == "summ-model" and ours[0]["route"] == "proxy/model"
    # tests.servers.completion reports 11 prompt tokens (5 cached) and 3 output tokens; no cache price
    assert ours[0]["cost_usd"] == pytest.approx(6 * 1e-6 + 5 * 1e-6 + 3 * 4e-6)
    assert ours[0]["saved_usd"] == pytest.approx(-ours[0]["cost_usd"])
    assert cli.main(["report", "--config", str(proxy.config_path), "--session", session,
                     "--format", "json"]) == 0
    (total,) = orjson.loads(capsys.readouterr().out)
    assert total["requests"] == 1 and total["calls"] == 2  # our call is spend, not a client request
    # its answer is archived but not indexed: recall never returns the proxy's own traffic
    assert list(proxy.query("select 1 from messages where body like '%records; paths%'"))
    if proxy.backend == "sqlite":
        assert not list(proxy.query("select 1 from message_chunks_fts where text match 'records AND paths'"))
    else:
        assert not list(proxy.query("select 1 from message_chunks where text like '%records; paths%'"))
        assert list(proxy.query("select 1 from message_chunks"))  # the client's own text is indexed
