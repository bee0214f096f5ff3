"""The dashboard in a real browser over an archive seeded through the real proxy: every page loads
without a script error or a Content-Security-Policy refusal, the figures are the CLI report's, and one
can walk from the overview to a request and to the original of a summarized result."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy import report
from proxy.cli import main as cli
from tests.conftest import BOTH_BACKENDS
from tests.ui.seed import BIG, CHAT, FACT, MARKUP, PIN, SESSION

FIELDS = [f for f in report.FIELDS if f not in ("first", "last")]


def ui(seeded, path: str = "") -> str:
    return f"{seeded.proxy.url}/ctxproxy/ui{path}"


def shown(page, selector: str) -> dict[str, str]:
    """data-key -> data-value of the figures under `selector`."""
    pairs = page.eval_on_selector_all(f"{selector} [data-value]", "els => els.map(e => [e.dataset.key, "
                                      "e.dataset.value])")
    return dict(pairs)


def equal(value: str, expected: Any) -> bool:
    """A figure's exact value (repr in data-value) against the report's."""
    if expected is None:
        return value == ""
    return (float(value) if isinstance(expected, float) else int(value)) == expected


def cli_report(seeded, capsys, *args: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert cli(["report", "--config", str(seeded.proxy.config_path), "--format", "json", *args]) == 0
    return orjson.loads(capsys.readouterr().out)


@BOTH_BACKENDS
def test_overview_figures_are_the_cli_report(seeded, page, capsys):
    page.goto(ui(seeded))
    [expected] = cli_report(seeded, capsys, "--by", "none")
    figures = shown(page, "#totals") | shown(page, "#activity")
    compared = [key for key in FIELDS if key in figures]
    assert {"requests", "tokens_client", "tokens_forwarded", "tokens_cached", "spent_usd", "baseline_usd",
            "saved_usd", "saved_pct", "added_ms_avg", "upstream_ms_avg", "evictions", "summaries",
            "masked"} <= set(compared)
    assert {k: figures[k] for k in compared if not equal(figures[k], expected[k])} == {}
    assert expected["spent_usd"] > 0 and expected["saved_usd"] > 0  # priced: the comparison means something
    by_policy = {row["policy"]: row for row in cli_report(seeded, capsys, "--by", "policy")}
    rows = page.locator("#by-policy tbody tr")
    assert rows.count() == len(by_policy) == 2
    for index in range(rows.count()):
        row = rows.nth(index)
        name = row.locator("td").first.inner_text()
        cells = dict(row.evaluate("r => [...r.querySelectorAll('[data-value]')].map(e => "
                                  "[e.dataset.key, e.dataset.value])"))
        assert all(equal(value, by_policy[name][key]) for key, value in cells.items()), name
    assert page.locator("#chart-dollars svg rect").count() >= 2
    assert page.locator("#chart-tokens svg rect").count() >= 3
    assert page.errors == []


@BOTH_BACKENDS
def test_from_the_overview_to_a_request_and_the_original_of_its_summary(seeded, page):
    page.goto(ui(seeded))
    page.click("header nav >> text=Sessions")
    page.wait_for_url("**/ctxproxy/ui/sessions")
    page.click(f"#sessions >> text={SESSION}")
    page.wait_for_url(f"**/sessions/{SESSION}")
    page.click(f'#requests a[href$="/exchanges/{seeded.summarized}"]')
    page.wait_for_url(f"**/exchanges/{seeded.summarized}")
    assert page.locator("#forwarded .msg.summary").count() == 1
    assert page.locator("#sent .msg.replaced").count() == 1
    assert "read_tool_result" in page.locator("#answer.internal").inner_text()  # the proxy answered it
    assert "The build log is long" in page.locator("#final-answer").inner_text()  # the client got this
    page.click("#forwarded .msg.summary a.original")
    page.wait_for_url("**/results/call_big?session=*")
    assert page.locator("#original").text_content() == BIG  # byte for byte, markup and all
    assert page.errors == []


@BOTH_BACKENDS
def test_session_page_figures_requests_and_memory(seeded, page, capsys):
    page.goto(ui(seeded, f"/sessions/{SESSION}"))
    [expected] = cli_report(seeded, capsys, "--session", SESSION)
    figures = shown(page, "#totals")
    assert {k: v for k, v in figures.items() if not equal(v, expected[k])} == {}
    rows = page.locator("#requests tbody tr")
    assert rows.count() == expected["requests"]
    spent = [float(v) for v in page.eval_on_selector_all(
        '#requests [data-key="spent_usd"]', "els => els.map(e => e.dataset.value)")]
    assert sum(spent) == pytest.approx(expected["spent_usd"], abs=1e-6)
    assert page.locator("#timeline svg a").count() == expected["requests"]
    assert page.locator("#timeline circle.event").count() > 0  # evictions, summaries, masks, rounds
    block = page.locator("#auto-summary").text_content()
    state = seeded.proxy.state
    tenant = state.reader.exchanges(SESSION)[-1]["tenant"]
    assert block == state.reader.session_window(tenant, SESSION)["block"]
    assert block.startswith("[ctxproxy auto-summary")
    assert PIN in page.locator("#pinned").text_content()
    assert page.errors == []


def test_a_request_that_evicted_shows_what_left_and_what_was_injected(seeded, page):
    page.goto(ui(seeded, f"/exchanges/{seeded.evicting}"))
    assert page.locator("#sent .msg.evicted").count() > 0
    assert page.locator("#sent details.evicted-run").count() >= 1
    injected = page.locator("#forwarded .msg.injected pre").all_text_contents()
    assert any(t.startswith("[ctxproxy auto-summary") for t in injected)
    assert any(t.startswith("[ctxproxy pinned knowledge") for t in injected)
    row = next(seeded.proxy.query("select * from exchanges where id = ?", (seeded.evicting,)))
    costs = shown(page, "#costs")
    assert equal(costs["cost_usd"], row["cost_usd"]) and equal(costs["saved_usd"], row["saved_usd"])
    assert equal(shown(page, "#activity")["evictions"], row["evictions"]) and row["evictions"] > 0
    assert page.errors == []


def test_a_masked_placeholder_links_to_the_result_it_replaced(seeded, page):
    page.goto(ui(seeded, f"/exchanges/{seeded.masking}"))
    masked = page.locator("#forwarded .msg.masked").first
    placeholder = masked.locator("pre").text_content()
    assert placeholder.startswith("[summarized: call_id=")
    call_id = placeholder.split("call_id=", 1)[1].split("]", 1)[0]
    row = next(seeded.proxy.query("select request_leaf from exchanges where id = ?", (seeded.masking,)))
    [sent] = [m["content"] for m in seeded.proxy.state.reader.chain(row["request_leaf"])
              if m.get("tool_call_id") == call_id]
    masked.locator("a.original").click()
    page.wait_for_url(f"**/results/{call_id}?session=*")
    assert page.locator("#original").text_content() == sent  # what the client sent, byte for byte
    assert page.errors == []


@BOTH_BACKENDS
def test_search_finds_a_seeded_fact_and_opens_it(seeded, page):
    page.goto(ui(seeded, "/search"))
    page.fill('input[name="q"]', "staging deploy key")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/search?q=*")
    hits = page.locator("#hits .hit")
    assert hits.count() >= 1 and FACT in hits.first.inner_text()
    hits.first.locator("a", has_text="open").click()
    page.wait_for_url("**/results/*")
    assert FACT in page.locator("#original").text_content()
    assert page.errors == []


def test_the_sessions_table_filters_as_one_types(seeded, page):
    page.goto(ui(seeded, "/sessions"))
    assert page.locator("#sessions tbody tr:visible").count() == 2
    page.fill('input[name="q"]', "mini")  # the chat session's model
    visible = page.locator("#sessions tbody tr:visible")
    assert visible.count() == 1 and CHAT in visible.inner_text()
    page.goto(ui(seeded, "/sessions?q=w16k"))  # the same filter, server side
    assert page.locator("#sessions tbody tr").count() == 1
    assert page.errors == []


def test_archived_markup_is_shown_as_text(seeded, page):
    chat = next(seeded.proxy.query("select id from exchanges where session_id = ? order by rowid", (CHAT,)))
    for path in (f"/exchanges/{chat['id']}", f"/results/call_big?session={SESSION}", "/pins",
                 "/search?q=arm64"):
        page.goto(ui(seeded, path))
        assert "pwned" not in page.title()  # the archived <script> did not run
        assert page.locator("main b", has_text="bold?").count() == 0
        assert page.locator("main img").count() == 0
        text = page.locator("main").text_content()
        assert MARKUP in text or PIN in text
    assert page.errors == []


def test_pins_and_policies_pages(seeded, page):
    page.goto(ui(seeded, "/pins"))
    assert PIN in page.locator("#pins-w16k").text_content()
    page.goto(ui(seeded, "/policies"))
    settings = page.locator("#policy-w16k + pre").text_content()
    assert "max_input_tokens: 16000" in settings and "max_tokens: 3000" in settings
    assert page.errors == []
