"""Entity working memory: extraction from tool results, the MRU window, the rendered block, checkpoints."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.layers import working_memory
from proxy.layers.working_memory import (
    MAX_CONTENT_CHARS,
    MAX_PER_RESULT,
    Entity,
    WorkingMemory,
    extract,
    infer_type,
    observe_messages,
)
from tests.strategies import conversation


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def pages(count: int) -> list[dict[str, Any]]:
    return [{"id": f"page-{i}", "title": f"Page {i}"} for i in range(count)]


def ids(memory: WorkingMemory) -> list[str]:
    return [entity.id for entity in memory.entities]


# --- the source's own examples ---------------------------------------------------------------------------


def test_single_page_created():
    result = {"success": True, "page": {"id": "page-123", "title": "About Us", "slug": "about"}}
    assert extract("cms_createPage", None, dumps(result)) == [Entity("page-123", "About Us", "page")]


def test_search_images_keeps_first_three_matches():
    matches = [{"id": f"img-{i}", "filename": f"pic{i}.jpg"} for i in range(1, 8)]
    matches[:2] = [{"id": "img-1", "filename": "hero.jpg"}, {"id": "img-2", "filename": "bg.jpg"}]
    found = extract("cms_searchImages", '{"query": "mountain"}', dumps({"matches": matches}))
    assert found == [Entity("img-1", "hero.jpg", "image"), Entity("img-2", "bg.jpg", "image"),
                     Entity("img-3", "pic3.jpg", "image")]


def test_section_content_named_by_heading():
    result = {"section": {"id": "sec-456", "heading": "Welcome"}}
    assert extract("cms_getSectionContent", None, dumps(result)) == [Entity("sec-456", "Welcome", "section")]


def test_update_renames_and_moves_to_front():
    memory = WorkingMemory()
    memory.observe(extract("cms_getPage", '{"slug": "about"}', dumps({"page": {"id": "page-123",
                                                                               "title": "About Us"}})))
    memory.observe([Entity("page-9", "Contact", "page")])
    # the update answers only {"success": true}: the new title comes from the call's arguments
    arguments = dumps({"pageId": "page-123", "title": "About Our Team"})
    memory.observe(extract("cms_updatePage", arguments, '{"success": true}'))
    assert memory.entities == [Entity("page-123", "About Our Team", "page"),
                               Entity("page-9", "Contact", "page")]


def test_failed_update_does_not_rename():
    arguments = dumps({"pageId": "page-123", "title": "About Our Team"})
    assert extract("cms_updatePage", arguments, '{"success": false, "error": "not found"}') == []


def test_create_with_id_only_result_takes_name_from_arguments():
    found = extract("cms_createPage", '{"title": "About Us"}', '{"id": "page-123"}')
    assert found == [Entity("page-123", "About Us", "page")]


def test_mru_walkthrough():
    memory = WorkingMemory()
    home, about = Entity("p-home", "Home", "page"), Entity("p-about", "About", "page")
    memory.observe([home])
    assert memory.entities == [home]
    memory.observe([about])
    assert memory.entities == [about, home]
    memory.observe([home])  # cms_getPage("Home") again
    assert memory.entities == [home, about]
    memory.observe([Entity(f"e{i}", f"E{i}", "section") for i in range(1, 9)])  # fills the 10 slots
    assert ids(memory)[-2:] == ["p-home", "p-about"] and len(memory.entities) == 10
    memory.observe([Entity("e9", "E9", "section")])
    assert ids(memory)[0] == "e9" and ids(memory)[-1] == "p-home" and "p-about" not in ids(memory)


# --- the MRU window --------------------------------------------------------------------------------------


def test_batch_order_last_entity_ends_most_recent():
    memory = WorkingMemory()
    memory.observe([Entity("a", "A", "page"), Entity("b", "B", "page")])
    assert ids(memory) == ["b", "a"]
    other = WorkingMemory()
    other.observe([Entity("a", "A", "page")])
    other.observe([Entity("b", "B", "page")])
    assert other.entities == memory.entities


def test_dedup_keeps_one_entry_with_newest_name():
    memory = WorkingMemory()
    memory.observe([Entity("page-1", "Draft", "page"), Entity("page-2", "Other", "page")])
    memory.observe([Entity("page-1", "Final", "page")])
    assert memory.entities == [Entity("page-1", "Final", "page"), Entity("page-2", "Other", "page")]


def test_cap_at_max_entities():
    memory = WorkingMemory(max_entities=3)
    memory.observe([Entity(str(i), f"n{i}", "task") for i in range(7)])
    assert ids(memory) == ["6", "5", "4"]
    assert ids(WorkingMemory(max_entities=0, entities=[Entity("x", "X", "task")])) == []


def test_by_type():
    memory = WorkingMemory(entities=[Entity("p1", "A", "page"), Entity("s1", "B", "section"),
                                     Entity("p2", "C", "page")])
    assert [e.id for e in memory.by_type("page")] == ["p1", "p2"]


# --- extraction ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("result", [
    pages(10),
    {"pages": pages(10), "total": 10},
    {"items": pages(10)},
    {"results": pages(10)},
    {"data": pages(10)},
])
def test_list_yields_first_three_in_order(result):
    assert [e.id for e in extract("list_pages", None, dumps(result))] == ["page-0", "page-1", "page-2"]


def test_max_from_list_and_invalid_items_skipped():
    items = [{"id": "page-0"}, "junk", {"title": "no id"}, *pages(10)[1:]]
    assert [e.id for e in extract("list_pages", None, dumps(items), max_from_list=5)] == [
        "page-1", "page-2", "page-3", "page-4", "page-5"]
    assert extract("list_pages", None, dumps(pages(10)), max_from_list=0) == []


def test_plural_key_of_inferred_type():
    invoices = [{"id": 100 + i, "name": f"INV-{i}"} for i in range(5)]
    found = extract("list_invoices", None, dumps({"invoices": invoices, "next": None}))
    assert found == [Entity("100", "INV-0", "invoice"), Entity("101", "INV-1", "invoice"),
                     Entity("102", "INV-2", "invoice")]


@pytest.mark.parametrize(("item", "name"), [
    ({"id": 1, "title": "T", "name": "N", "slug": "s", "filename": "f.txt"}, "T"),
    ({"id": 1, "name": "N", "slug": "s", "filename": "f.txt"}, "N"),
    ({"id": 1, "slug": "s", "filename": "f.txt"}, "s"),
    ({"id": 1, "filename": "f.txt"}, "f.txt"),
    ({"id": 1, "title": "", "name": "  Spaced \n out  "}, "Spaced out"),
])
def test_name_precedence(item, name):
    assert extract("get_file", None, dumps(item)) == [Entity("1", name, "file")]


@pytest.mark.parametrize("item", [
    {"title": "no id"},
    {"id": "x"},
    {"id": True, "title": "bool id"},
    {"id": None, "title": "null id"},
    {"id": 1.5, "title": "float id"},
    {"id": "x", "title": 42},
])
def test_items_without_id_or_name_are_skipped(item):
    assert extract("get_page", None, dumps({"page": item})) == []


def test_single_resource_shapes():
    bare = {"id": 7, "title": "Bare", "sections": [{"id": "s", "title": "S"}]}
    # nested records count too; the record the tool was about comes last, so it ends up most recent
    assert extract("get_page", None, dumps(bare)) == [Entity("s", "S", "section"),
                                                      Entity("7", "Bare", "page")]
    wrapped = {"data": {"id": "p-1", "name": "Wrapped"}}
    assert extract("get_page", None, dumps(wrapped)) == [Entity("p-1", "Wrapped", "page")]
    json_api = {"data": {"type": "articles", "id": "1", "attributes": {"title": "JSON:API"}}}
    assert extract("get_post", None, dumps(json_api)) == [Entity("1", "JSON:API", "post")]
    twice = {"result": {"data": {"page": {"id": "p-2", "title": "Deep"}}}}
    assert extract("get_page", None, dumps(twice)) == [Entity("p-2", "Deep", "page")]


def test_non_json_or_unknown_tool_yields_nothing():
    assert extract("get_page", None, "Created page About Us (page-123)") == []
    assert extract("get_page", None, "") == []
    assert extract(None, None, dumps({"id": "p", "title": "T"})) == []
    assert extract("run_command", None, dumps({"id": "p", "title": "T"})) == []


@pytest.mark.parametrize(("tool", "kind"), [
    ("get_page", "page"), ("list_pages", "page"), ("search_pages", "page"), ("cms_createPage", "page"),
    ("cms_searchImages", "image"), ("cms_getSectionContent", "section"), ("create_post", "post"),
    ("get_user", "user"), ("list_orders", "order"), ("read_file", "file"),
    ("mcp__github__get_issue", "issue"),
    ("list_entries", "entry"), ("list_pull_requests", "pull_request"), ("post_comment", "comment"),
    ("list_invoices", "invoice"), ("get_customer_details", "customer"), ("searchAddresses", "address"),
    ("run_command", None), ("bash", None), ("", None),
])
def test_type_from_tool_name(tool, kind):
    assert infer_type(tool) == kind


def test_type_patterns_checked_first_in_order():
    patterns = {r"^wp_": "post", r"page": "landing", "(": "broken"}
    assert infer_type("wp_fetch_page", patterns) == "post"
    assert infer_type("cms_getPage", patterns) == "landing"  # case-insensitive, before the default table
    assert infer_type("get_section", patterns) == "section"  # no pattern matches: defaults apply
    result = dumps({"posts": [{"id": 3, "title": "Hello"}]})
    found = extract("wp_fetch_page", None, result, type_patterns=patterns)
    assert found == [Entity("3", "Hello", "post")]


def test_huge_and_deep_inputs_are_cheap_and_safe():
    started = time.perf_counter()
    assert len(extract("list_pages", None, dumps(pages(20_000)))) == 3
    # past MAX_CONTENT_CHARS a result is not parsed at all: a bounded cost on the request path
    assert extract("list_pages", None, dumps(pages(3)) + " " * MAX_CONTENT_CHARS) == []
    assert extract("get_page", None, '{"id": "\ud800", "title": "lone surrogate"}') == []
    assert extract("get_page", None, '{"id": 123456789012345678901234567890, "title": "big"}') == []
    assert extract("list_pages", None, "[" * 100_000 + "]" * 100_000) == []
    deep = '{"data": ' * 500 + '{"id": "p", "title": "T"}' + "}" * 500
    assert extract("get_page", None, deep) == []  # wrappers are unwrapped only a few levels
    assert time.perf_counter() - started < 2


# --- rendering -------------------------------------------------------------------------------------------


def test_render_groups_by_type_in_order_of_recent_use():
    memory = WorkingMemory()
    memory.observe([Entity("page-456", "Home", "page"), Entity("img-345", "hero-bg.jpg", "image"),
                    Entity("sec-789", "Hero", "section"), Entity("page-123", "About Us", "page"),
                    Entity("entry-1", 'Say "hi"', "entry")])
    block = memory.render()
    assert block.splitlines()[0] == "[WORKING MEMORY]"
    assert '"it"' in block.splitlines()[1] and "ids" in block.splitlines()[1]
    assert block.splitlines()[2:] == [
        "entries:", '  - "Say \\"hi\\"" (entry-1)',
        "pages:", '  - "About Us" (page-123)', '  - "Home" (page-456)',
        "sections:", '  - "Hero" (sec-789)',
        "images:", '  - "hero-bg.jpg" (img-345)',
    ]


def test_render_empty_is_empty_string():
    assert WorkingMemory().render() == ""


# --- checkpoints -----------------------------------------------------------------------------------------


def test_round_trip():
    memory = WorkingMemory(max_entities=4)
    memory.observe([Entity("a", "A", "page"), Entity("2", "B", "image"), Entity("c", "C", "page")])
    data = orjson.loads(orjson.dumps(memory.to_dict()))
    assert data["version"] == 1
    restored = WorkingMemory.from_dict(data)
    assert restored == memory and restored.render() == memory.render()
    assert ids(WorkingMemory.from_dict(data, max_entities=2)) == ["c", "2"]


@pytest.mark.parametrize("data", [
    None, [], "x", {}, {"version": 2, "entities": [{"id": "a", "name": "A", "type": "page"}]},
    {"version": True, "entities": [{"id": "a", "name": "A", "type": "page"}]},
    {"entities": [{"id": "a", "name": "A", "type": "page"}]}, {"version": 1, "entities": "nope"},
])
def test_bad_checkpoint_starts_empty(data):
    memory = WorkingMemory.from_dict(data)
    assert memory.entities == [] and memory.max_entities == 10


def test_from_dict_skips_bad_entries_and_ignores_unknown_fields():
    data = {"version": 1, "max_entities": 5, "future": {"x": 1}, "entities": [
        {"id": "a", "name": "A", "type": "page", "seen_at": 3}, {"id": "b"}, "junk", {"id": 5, "name": "N",
                                                                                   "type": "task"},
        {"id": "a", "name": "older", "type": "page"}]}
    memory = WorkingMemory.from_dict(data)
    assert memory.max_entities == 5
    assert memory.entities == [Entity("a", "A", "page"), Entity("5", "N", "task")]


# --- feeding from chat messages --------------------------------------------------------------------------


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": dumps(arguments)}}


def test_observe_messages_in_order():
    messages = [
        {"role": "system", "content": "You edit a CMS."},
        {"role": "user", "content": "Create a page called About Us"},
        {"role": "assistant", "content": None, "tool_calls": [
            call("c1", "cms_createPage", {"title": "About Us"}), call("c2", "cms_searchImages", {"q": "x"})]},
        {"role": "tool", "tool_call_id": "c1",
         "content": dumps({"page": {"id": "page-123", "title": "About Us"}})},
        {"role": "tool", "tool_call_id": "c2", "content": [  # one JSON result split over two text parts
            {"type": "text", "text": '{"matches": [{"id": "img-1", "file'},
            {"type": "text", "text": 'name": "a.jpg"}]}'}]},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Add a hero section to it"},
        {"role": "assistant", "content": None,
         "tool_calls": [call("c3", "cms_addSection", {"pageId": "page-123"})]},
        {"role": "tool", "tool_call_id": "c3",
         "content": dumps({"section": {"id": "sec-1", "title": "Hero"}})},
        {"role": "tool", "tool_call_id": "unknown", "content": dumps({"id": "x", "title": "orphan"})},
        {"role": "function", "name": "get_user", "content": dumps({"id": 9, "login": "octocat"})},
    ]
    memory = WorkingMemory()
    observe_messages(memory, messages)
    assert ids(memory) == ["9", "sec-1", "img-1", "page-123"]
    again = WorkingMemory()
    observe_messages(again, messages)
    assert again.render() == memory.render()


# --- properties ------------------------------------------------------------------------------------------

entities = st.builds(Entity, st.sampled_from([str(i) for i in range(15)]), st.text(min_size=1, max_size=5),
                     st.sampled_from(["page", "image", "section"]))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["id", "title", "name", "page", "pages", "items", "data", "matches", "x"]), inner,
        max_size=5),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(entities, max_size=8), max_size=8), st.integers(0, 12))
def test_observe_keeps_cap_and_unique_ids(batches, cap):
    memory = WorkingMemory(max_entities=cap)
    for batch in batches:
        memory.observe(batch)
        assert len(memory.entities) <= cap
        assert len(set(ids(memory))) == len(memory.entities)
        if batch and cap:
            assert memory.entities[0] == batch[-1]
    assert WorkingMemory.from_dict(memory.to_dict()) == memory


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), json_values.map(dumps)), st.one_of(st.none(), st.text(), json_values.map(dumps)),
       st.sampled_from(["get_page", "list_pages", "search_images", "cms_getSectionContent", "list_x", None]))
def test_extract_never_raises(content, arguments, tool):
    found = extract(tool, arguments, content)
    assert all(isinstance(e, Entity) and e.id and e.name for e in found)
    assert len(found) <= MAX_PER_RESULT
    assert extract(tool, arguments, content) == found


@settings(max_examples=30, deadline=None)
@given(conversation(max_turns=3), st.lists(st.one_of(json_values, st.dictionaries(
    st.sampled_from(["role", "tool_calls", "tool_call_id", "content", "name"]), json_values)), max_size=5))
def test_observe_messages_never_raises(messages, junk):
    memory = WorkingMemory()
    observe_messages(memory, [*messages, *junk])
    assert len(memory.entities) <= 10


# --- identifier keys of any common shape, nested records (tau-bench, tau2, ToolBench shapes) ----------


RESERVATION = {"reservation_id": "HXDUBJ", "user_id": "yara_garcia_1905", "origin": "IAH",
               "destination": "SFO",
               "flight_type": "round_trip", "flights": [
                   {"origin": "IAH", "destination": "JFK", "flight_number": "HAT085", "date": "2024-05-18"},
                   {"origin": "JFK", "destination": "SFO", "flight_number": "HAT023", "date": "2024-05-18"},
                   {"origin": "SFO", "destination": "IAH", "flight_number": "HAT278", "date": "2024-05-22"},
                   {"origin": "IAH", "destination": "SFO", "flight_number": "HAT999", "date": "2024-05-23"}],
               "passengers": [{"first_name": "Yara", "last_name": "Garcia", "dob": "1974-08-15"}]}


def test_reservation_with_nested_flights_typed_by_key():
    found = extract("get_reservation_details", dumps({"reservation_id": "HXDUBJ"}), dumps(RESERVATION),
                    max_from_list=2)
    assert found == [Entity("HAT085", "origin IAH, destination JFK, date 2024-05-18", "flight"),
                     Entity("HAT023", "origin JFK, destination SFO, date 2024-05-18", "flight"),
                     Entity("HXDUBJ", "origin IAH, destination SFO, flight_type round_trip", "reservation")]


def test_user_details_without_its_id_take_it_from_the_call():
    result = {"name": {"first_name": "Yara", "last_name": "Garcia"}, "email": "y@example.com",
              "payment_methods": {"gift_card_6941833": {"source": "gift_card", "amount": 152,
                                                        "id": "gift_card_6941833"}}}
    found = extract("get_user_details", dumps({"user_id": "yara_garcia_1905"}), dumps(result))
    assert found == [Entity("gift_card_6941833", "source gift_card, amount 152", "payment_method"),
                     Entity("yara_garcia_1905", "Yara Garcia", "user")]


def test_search_results_with_no_type_in_the_tool_name():
    flights = [{"flight_number": f"HAT0{i}", "origin": "EWR", "status": "available"} for i in range(5)]
    found = extract("search_direct_flight", "{}", dumps(flights))
    assert [e.id for e in found] == ["HAT00", "HAT01", "HAT02"] and {e.type for e in found} == {"flight"}


@pytest.mark.parametrize(("key", "kind"), [
    ("order_id", "order"), ("orderId", "order"), ("customerID", "customer"), ("ORDER_ID", "order"),
    ("flight_number", "flight"), ("flightNumber", "flight"), ("promo_code", "promo"), ("item-id", "item"),
    ("paymentMethodId", "payment_method"), ("ticket_key", "ticket"), ("sku", "product"),
    ("uuid", "product"), ("code", "product"),
])
def test_identifier_key_shapes(key, kind):
    found = extract("get_product", None, dumps({key: "X-123", "title": "Thing"}))
    assert found == [Entity("X-123", "Thing", kind)]


@pytest.mark.parametrize("key", ["zip_code", "status_code", "api_key", "phone_number", "card_number",
                                 "request_id", "line_items", "valid", "item_ids"])
def test_attribute_and_secret_keys_are_not_ids(key):
    assert extract("run_command", None, dumps({key: "X123", "title": "Thing"})) == []


def test_status_code_record_and_error_payload_are_not_entities():
    assert extract("get_page", None, dumps({"code": 404, "message": "Not found"})) == []
    assert extract("get_page", None, dumps({"error": {"id": "e1", "title": "Boom"}})) == []


def test_telecom_records_labelled_by_their_fields():
    line = {"line_id": "L1001", "phone_number": "555-123-2001", "status": "Active", "plan_id": "P1001"}
    customer = {"customer_id": "C1001", "full_name": "John Smith", "line_ids": ["L1001", "L1002"]}
    assert extract("get_details_by_id", dumps({"id": "L1001"}), dumps(line)) == [
        Entity("L1001", "phone_number 555-123-2001, status Active", "line")]
    assert extract("get_customer_by_phone", "{}", dumps(customer)) == [
        Entity("C1001", "John Smith", "customer")]


def test_bare_id_answer_of_an_id_lookup_tool():
    arguments = dumps({"first_name": "Daiki", "last_name": "Sanchez", "zip": "46236"})
    assert extract("find_user_id_by_name_zip", arguments, "daiki_sanchez_3253") == [
        Entity("daiki_sanchez_3253", "Daiki Sanchez", "user")]
    assert extract("get_flight_status", dumps({"flight_number": "HAT1"}), "available") == []
    assert extract("find_user_id_by_email", "{}", "Error: User not found") == []


def test_toolbench_wrapped_json_and_python_literals():
    listing = dumps([{"id": "1", "title": "Rhubarb cordial"}, {"id": "2", "title": "Coffee cocktail"}])
    wrapped = dumps({"error": "", "response": listing})
    assert [e.id for e in extract("list_of_cocktails", None, wrapped)] == ["1", "2"]
    python = dumps({"error": "", "response": "{'id': 'ACT_1', 'name': 'ACT - Agence', 'ok': True}"})
    assert extract("get_transitaire", None, python) == [Entity("ACT_1", "ACT - Agence", "transitaire")]


def test_one_result_never_floods_the_memory():
    result = {"pages": pages(50), "sections": [{"id": f"s{i}", "title": "S"} for i in range(50)],
              "images": [{"id": f"i{i}", "title": "I"} for i in range(50)], "id": "root", "title": "Root"}
    found = extract("get_site", None, dumps(result), max_from_list=5)
    assert len(found) == MAX_PER_RESULT and found[-1] == Entity("root", "Root", "site")


def test_observe_messages_from_start_still_knows_earlier_calls():
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "get_order", {"order_id": "#W1"})]},
        {"role": "tool", "tool_call_id": "c1", "content": dumps({"order_id": "#W1", "status": "pending"})},
        {"role": "assistant", "content": None, "tool_calls": [call("c2", "get_order", {"order_id": "#W2"})]},
        {"role": "tool", "tool_call_id": "c2", "content": dumps({"order_id": "#W2", "status": "delivered"})},
    ]
    whole, tail = WorkingMemory(), WorkingMemory()
    observe_messages(whole, messages)
    observe_messages(tail, messages, start=3)
    assert ids(whole) == ["#W2", "#W1"] and ids(tail) == ["#W2"]


def test_a_turns_new_call_and_its_result_are_observed_without_looking_back():
    """A resent history's new turn holds the call and its result: the walk starts at the new part (it
    went back to the start of the history every turn, looking for a call the new part holds)."""
    messages: list[dict[str, Any]] = []
    for n in range(200):
        messages += [{"role": "assistant", "content": None, "tool_calls": [call(f"c{n}", "get_order", {})]},
                     {"role": "tool", "tool_call_id": f"c{n}", "content": dumps({"order_id": f"#W{n}"})}]
    assert working_memory._calls_from(messages, 398) == 398
    assert working_memory._calls_from(messages, 399) == 398  # (its call is just before the part)
    late = [*messages, {"role": "tool", "tool_call_id": "c5", "content": "{}"}]  # an old call's late result
    assert working_memory._calls_from(late, 400) == 10


def test_saved_memories_of_the_first_format_still_load():
    saved = {"version": 1, "max_entities": 10,
             "entities": [{"id": "page-123", "name": "About Us", "type": "page"}]}
    assert WorkingMemory.from_dict(saved).render().endswith('pages:\n  - "About Us" (page-123)')


class Seen:
    """Records what observe_messages feeds a memory (the extracted entities, in order)."""

    def __init__(self) -> None:
        self.fed: list[list[Entity]] = []

    def observe(self, entities: list[Entity]) -> None:
        self.fed.append(list(entities))


def fed_by_whole_walk(messages: list[dict[str, Any]], start: int) -> list[list[Entity]]:
    """What a walk over the whole history from index 0 feeds, results before `start` skipped."""
    calls: dict[str, tuple[Any, Any]] = {}
    fed = []
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            calls.update({c["id"]: (c["function"]["name"], c["function"]["arguments"])
                          for c in message.get("tool_calls") or ()})
        elif index >= start and message["role"] == "tool" and message["tool_call_id"] in calls:
            name, arguments = calls[message["tool_call_id"]]
            fed.append(extract(name, arguments, message["content"]))
    return fed


shapes = st.lists(st.tuples(st.sampled_from(["call", "tool", "user"]), st.integers(0, 3),
                            st.sampled_from(["get_order", "get_user", "find_flight"])), max_size=14)


@settings(max_examples=300, deadline=None)
@given(shapes, st.integers(0, 15))
def test_observing_from_start_feeds_what_a_whole_walk_feeds(steps: list[tuple[str, int, str]],
                                                           start: int) -> None:
    # Call ids are reused and results may come late: each result is typed by the latest call with its id.
    messages: list[dict[str, Any]] = []
    for n, (kind, call_id, tool) in enumerate(steps):
        if kind == "call":
            messages.append({"role": "assistant", "content": None,
                             "tool_calls": [call(f"c{call_id}", tool, {"n": n})]})
        elif kind == "tool":
            messages.append({"role": "tool", "tool_call_id": f"c{call_id}",
                             "content": dumps({"id": f"R{n}", "name": f"thing {n}"})})
        else:
            messages.append({"role": "user", "content": "and then?"})
    seen = Seen()
    observe_messages(seen, messages, start=start)  # type: ignore[arg-type]
    assert seen.fed == fed_by_whole_walk(messages, start)
