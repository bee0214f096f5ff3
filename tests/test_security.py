"""Issue 8, security: keyless isolation, secret scrubbing in checkpoints, header hygiene both ways, and
slash commands that change state (off unless a policy turns them on, then scoped)."""

from __future__ import annotations

import httpx
import orjson
import pytest

from proxy.pins import EVERY_TENANT
from proxy.secrets import POLICY_ENTRY, REDACTED, scrub
from tests.servers import Seen, Step

BIG = "\n".join(f"line {i}: value={i * 7} path=src/mod_{i % 13}.py" for i in range(500))
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
CODEWORD = "quizzical-aardvark"


def history(call_id: str, task: str) -> list[dict]:
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": task},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "read_file",
                                                              "arguments": '{"path": "big.log"}'}}]},
        {"role": "tool", "tool_call_id": call_id, "content": BIG},
    ]


def internal(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}


def chat(proxy, messages: list[dict], *, key: str | None, session: str | None = None, policy: str = "",
         **extra) -> httpx.Response:
    """A chat request through the proxy with httpx: no Authorization header at all when key is None."""
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    if session is not None:
        headers["x-ctxproxy-session"] = session
    prefix = f"/p/{policy}" if policy else ""
    return httpx.post(f"{proxy.url}{prefix}/v1/chat/completions", headers=headers, timeout=30,
                      json={"model": "gpt-4o", "messages": messages, **extra})


# ------------------------------------------------------------------------------ keyless isolation

@pytest.mark.parametrize("keyed", [False, True], ids=["keyless-isolated", "same-key-shared"])
@pytest.mark.parametrize("named", [True, False], ids=["session-header", "fingerprint"])
def test_keyless_clients_never_read_each_others_results_or_recall_hits(proxy, fake_upstream, keyed, named):
    key = "sk-shared-key" if keyed else None
    first = chat(proxy, history("call_a", f"Summarize big.log. The codeword is {CODEWORD}."), key=key,
                 session="sess-a" if named else None)
    assert first.status_code == 200
    assert "call_id=call_a" in fake_upstream.chat_requests[-1].json()["messages"][-1]["content"]  # stored
    proxy.flush()  # A's messages are searchable before B asks

    answers: dict[str, str] = {}

    def second_round(seen: Seen) -> Step:
        for message in seen.json()["messages"]:
            if message.get("role") == "tool" and message["tool_call_id"].startswith("int_"):
                answers[message["tool_call_id"]] = message["content"]
        return Step(content="done")

    fake_upstream.then(Step(tool_calls=[internal("int_read", "read_tool_result", {"call_id": "call_a"}),
                                        internal("int_recall", "recall", {"query": CODEWORD})]),
                       second_round)
    second = chat(proxy, history("call_b", "Summarize other.log"), key=key,
                  session="sess-b" if named else None, tools=TOOLS)
    assert second.status_code == 200 and second.json()["choices"][0]["message"]["content"] == "done"
    assert first.headers["x-ctxproxy-session"] != second.headers["x-ctxproxy-session"]
    if keyed:  # the control: one API key shares its results and archive across its sessions
        assert answers["int_read"] == BIG
        assert CODEWORD.split("-")[0] in answers["int_recall"] and "no matches" not in answers["int_recall"]
    else:
        assert answers["int_read"].startswith("error: no stored tool result") and "line 1:" not in answers[
            "int_read"]
        assert answers["int_recall"] == f"recall {CODEWORD!r}: no matches in the archive."
    # /recall as a slash command goes by the same rule.
    command = chat(proxy, [{"role": "user", "content": f"/recall {CODEWORD}"}], key=key,
                   session="sess-c" if named else None)
    text = command.json()["choices"][0]["message"]["content"]
    assert ("no matches" in text) != keyed
    proxy.flush()
    tenants = {r["tenant"] for r in proxy.query("select tenant from exchanges")}
    assert len(tenants) == (1 if keyed else 3)
    assert keyed or all(t.startswith("anon-") for t in tenants)


def test_keyless_client_keeps_its_own_results_within_its_session(proxy, fake_upstream):
    opening = history("call_a", "Summarize big.log")
    chat(proxy, opening, key=None)
    fake_upstream.then(Step(tool_calls=[internal("int_read", "read_tool_result", {"call_id": "call_a"})]),
                       lambda seen: Step(content=seen.json()["messages"][-1]["content"][:7]))
    later = [*opening, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "show line 0"}]
    response = chat(proxy, later, key=None, tools=TOOLS)  # same opening: same session, same tenant
    assert response.json()["choices"][0]["message"]["content"] == "line 0:"


def test_an_odd_session_header_is_hashed_not_refused(proxy, fake_upstream):
    response = chat(proxy, [{"role": "user", "content": "hi"}], key="k", session="has spaces / and ../")
    assert response.status_code == 200
    assert response.headers["x-ctxproxy-session"].startswith("header-")
    proxy.flush()
    row = next(proxy.query("select session_id, session_source from exchanges"))
    assert (row["session_id"], row["session_source"]) == (response.headers["x-ctxproxy-session"], "header")


# ----------------------------------------------------------------------- checkpoints without secrets

SECRETS = {
    "openai": "sk-proj-Zx9mQ2vL7rT4wY1uP8sK3nB6cV0aD5fG",
    "anthropic": "sk-ant-api03-Hq7Lm2Np9Rt4Vw6Xy1Zb3Cd5Ef8Gh0Jk",
    "password": "hunter2-correct-horse",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "github": "ghp_1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuVwXyZ",
    "gitlab": "glpat-Ab3De6Gh9Jk2Mn5Pq8St",
    "slack": "xoxb-123456789012-abcdefGHIJKL",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "bearer": "tok_9f8e7d6c5b4a3210",
    "pem": "MIIEpAIBAAKCAQEA7bq2nJ5sW1ExampleKeyMaterial",
}
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{SECRETS['pem']}\nQm9ndXM=\n-----END RSA PRIVATE KEY-----"


def test_refusal_checkpoint_holds_no_secret_in_any_text_channel(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "tiny.yaml").write_text(
        "budget:\n  max_input_tokens: 1000\nwindow:\n  enabled: false\n")
    messages = [
        {"role": "system", "content": f"Deploy notes. OPENAI_API_KEY={SECRETS['openai']} "
                                      f"and {SECRETS['anthropic']} for the judge. " + "filler " * 1500},
        {"role": "user", "name": SECRETS["github"], "content": [
            {"type": "text", "text": f"my password={SECRETS['password']} and the key:\n{PEM}\nthanks"},
            {"type": "text", "text": f"gitlab {SECRETS['gitlab']}, slack {SECRETS['slack']}"}]},
        {"role": "assistant",
         "content": f"Use {SECRETS['aws']} with Authorization: Bearer {SECRETS['bearer']}"},
        {"role": "user", "content": f"and this jwt {SECRETS['jwt']} please"},
    ]
    response = chat(proxy, messages, key="k", policy="tiny")
    assert response.status_code == 400 and fake_upstream.chat_requests == []
    error = response.json()["error"]
    path = proxy.data_dir / "checkpoints" / f"{error['checkpoint_id']}.json"
    raw = path.read_bytes()
    for name, secret in SECRETS.items():
        assert secret.encode() not in raw, f"{name} secret leaked into the checkpoint"
    assert b"PRIVATE KEY" not in raw
    document = orjson.loads(raw)
    assert POLICY_ENTRY == "secrets:api_keys,tokens,passwords,private_keys"
    assert document["redaction_policy"] == ["tool.content", "assistant.tool_calls.function.arguments",
                                            POLICY_ENTRY]
    kept = document["messages"]
    assert kept[0]["content"].startswith(
        f"Deploy notes. OPENAI_API_KEY={REDACTED} and {REDACTED} for the judge.")
    assert kept[1]["name"] == REDACTED
    assert kept[1]["content"][0]["text"] == f"my password={REDACTED} and the key:\n{REDACTED}\nthanks"
    assert kept[2]["content"] == f"Use {REDACTED} with Authorization: Bearer {REDACTED}"
    assert kept[3]["content"] == f"and this jwt {REDACTED} please"


def test_checkpoint_keeps_secrets_when_redaction_is_off(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "raw.yaml").write_text(
        "budget:\n  max_input_tokens: 1000\n  checkpoint_redact_secrets: false\nwindow:\n  enabled: false\n")
    response = chat(proxy, [{"role": "user", "content": f"password={SECRETS['password']} " + "x " * 1500}],
                    key="k", policy="raw")
    document = orjson.loads((proxy.data_dir / "checkpoints" /
                             f"{response.json()['error']['checkpoint_id']}.json").read_bytes())
    assert document["redaction_policy"] == [] and SECRETS["password"] in document["messages"][0]["content"]


@pytest.mark.parametrize("text", [
    "max_tokens: 100, tokens: 5", "the bearer bonds of 1903", "Basic knowledge", "bypass=1", "PWD=/home/x",
    "risk-assessment-framework-v2", "sk-learn", "a token_count=7", "call_id=call_read",
])
def test_scrub_leaves_look_alikes(text):
    assert scrub(text) == text


@pytest.mark.parametrize(("text", "expected"), [
    ('{"api_key": "abc 123"}', f'{{"api_key": "{REDACTED}"}}'),
    ("GITHUB_TOKEN=xyz; next", f"GITHUB_TOKEN={REDACTED}; next"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG", f"aws_secret_access_key = {REDACTED}"),
    ("postgres://app:s3cr3t@db:5432/x", f"postgres://app:{REDACTED}@db:5432/x"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk (cut short", REDACTED),
    ("client_secret: abc, passwd:'q w'", f"client_secret: {REDACTED}, passwd:'{REDACTED}'"),
])
def test_scrub_replaces_values(text, expected):
    assert scrub(text) == expected and scrub(scrub(text)) == expected  # idempotent


# ------------------------------------------------------------------------------------- headers

HOSTILE = {"cookie": "session=abc", "x-forwarded-for": "10.1.2.3", "x-forwarded-host": "internal.example",
           "x-forwarded-proto": "http", "forwarded": "for=10.1.2.3", "x-real-ip": "10.1.2.3",
           "connection": "keep-alive, X-Hop-Secret", "x-hop-secret": "shh", "x-kept": "yes"}


def test_private_and_connection_listed_headers_never_reach_the_upstream(proxy, fake_upstream):
    chat_response = httpx.post(f"{proxy.url}/v1/chat/completions", headers=HOSTILE,
                               json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    passthrough = httpx.post(f"{proxy.url}/v1/embeddings", headers=HOSTILE, content=b'{"input": "x"}')
    assert chat_response.status_code == passthrough.status_code == 200
    assert len(fake_upstream.seen) == 2
    for seen in fake_upstream.seen:
        for name in ("cookie", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "forwarded",
                     "x-real-ip", "x-hop-secret"):
            assert name not in seen.headers, f"{name} reached the upstream on {seen.path}"
        assert seen.headers["x-kept"] == "yes" and "x-hop-secret" not in seen.headers.get("connection", "")


def test_forward_headers_lets_named_ones_through(make_proxy, fake_upstream):
    proxy = make_proxy({"upstream": {"forward_headers": ["Cookie", "x-hop-secret"]}})
    httpx.post(f"{proxy.url}/v1/chat/completions", headers=HOSTILE,
               json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    seen = fake_upstream.chat_requests[-1].headers
    assert seen["cookie"] == "session=abc"
    assert "x-forwarded-for" not in seen and "x-real-ip" not in seen
    assert "x-hop-secret" not in seen  # hop-by-hop by the Connection header: never forwarded


def test_client_sees_one_date_and_one_server_header(proxy, fake_upstream):
    fake_upstream.then(Step(content="hi", headers={"connection": "x-up-hop", "x-up-hop": "1"}),
                       Step(kind="stream", chunks=[b"data: [DONE]\n\n"]))
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    plain = httpx.post(f"{proxy.url}/v1/chat/completions", json=body)
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body | {"stream": True}) as streamed:
        streamed.read()
    models = httpx.get(f"{proxy.url}/v1/models")
    for response in (plain, streamed, models):
        assert response.status_code == 200
        assert len(response.headers.get_list("date")) == 1
        assert len(response.headers.get_list("server")) == 1
    assert "x-up-hop" not in plain.headers and plain.headers["x-upstream"] == "fake"


# ---------------------------------------------------------------------------------- slash commands

def write_policy(proxy, name: str, pins: str | None) -> str:
    text = "window:\n  enabled: false\n" + (f"commands:\n  pins: {pins}\n" if pins else "")
    (proxy.policies_dir / f"{name}.yaml").write_text(text)
    return name


def pinned_block(fake_upstream) -> str:
    first = fake_upstream.chat_requests[-1].json()["messages"][0]
    return first["content"] if first["content"].startswith("[ctxproxy pinned knowledge") else ""


@pytest.mark.parametrize("policy", [None, "off"])
def test_pin_is_off_by_default_and_reaches_the_model_unchanged(make_proxy, fake_upstream, policy):
    proxy = make_proxy()
    name = write_policy(proxy, "proj", policy) if policy else ""
    for text in ("/pin Always run tests with -x.", "/remember the VPN is down", "/unpin pin-0123456789ab"):
        response = chat(proxy, [{"role": "user", "content": text}], key="k", policy=name)
        assert response.status_code == 200 and "x-ctxproxy-command" not in response.headers
        assert fake_upstream.chat_requests[-1].json()["messages"] == [{"role": "user", "content": text}]
        assert response.json()["choices"][0]["message"]["content"] == f"echo: {text}"
    assert proxy.state.pins.list(name or "default") == []
    listed = chat(proxy, [{"role": "user", "content": "/pins"}], key="k", policy=name)  # read-only: on
    assert listed.headers["x-ctxproxy-command"] == "pins"
    assert listed.json()["choices"][0]["message"]["content"] == "No pins."
    assert len(fake_upstream.chat_requests) == 3


def test_session_pins_show_only_in_their_session(make_proxy, fake_upstream):
    proxy = make_proxy()
    policy = write_policy(proxy, "sess", "session")
    made = chat(proxy, [{"role": "user", "content": "/pin Always run tests with -x."}], key="k",
                session="s-1", policy=policy)
    text = made.json()["choices"][0]["message"]["content"]
    assert text.startswith("Pinned as pin-") and "this conversation" in text
    assert fake_upstream.chat_requests == []
    pin_id = text.split()[2]
    chat(proxy, [{"role": "user", "content": "go"}], key="k", session="s-1", policy=policy)
    block = pinned_block(fake_upstream)
    assert block.startswith("[ctxproxy pinned knowledge: pinned in this conversation by /pin]")
    assert "Always run tests with -x." in block and "curated" not in block
    for other in ({"key": "k", "session": "s-2"}, {"key": "other", "session": "s-1"},
                  {"key": None, "session": "s-1"}):
        chat(proxy, [{"role": "user", "content": "go"}], policy=policy, **other)
        assert "Always run" not in str(fake_upstream.chat_requests[-1].json()["messages"]), other
    refused = chat(proxy, [{"role": "user", "content": f"/unpin {pin_id}"}], key="k", session="s-2",
                   policy=policy)
    assert refused.json()["choices"][0]["message"]["content"].startswith("unpin failed")
    removed = chat(proxy, [{"role": "user", "content": f"/unpin {pin_id}"}], key="k", session="s-1",
                   policy=policy)
    assert removed.json()["choices"][0]["message"]["content"] == f"Unpinned {pin_id}."
    assert proxy.state.pins.list(policy) == []


def test_project_pins_show_in_the_project_for_that_key_and_never_touch_curated_ones(make_proxy,
                                                                                    fake_upstream):
    proxy = make_proxy()
    policy = write_policy(proxy, "team", "project")
    curated = proxy.state.pins.add(proxy.state.policies.get(policy), "Prod DB is read-only.", name="db")
    made = chat(proxy, [{"role": "user", "content": "/remember Staging is stg-04."}], key="k",
                session="s-1", policy=policy)
    assert made.json()["choices"][0]["message"]["content"].startswith("Pinned as pin-")
    chat(proxy, [{"role": "user", "content": "go"}], key="k", session="s-2", policy=policy)
    block = pinned_block(fake_upstream)
    curated_label, _, chat_part = block.partition(
        "[ctxproxy pinned knowledge: pinned by /pin in a conversation")
    assert curated_label.startswith("[ctxproxy pinned knowledge: curated by the user; always applies]")
    assert "Prod DB is read-only." in curated_label and "stg-04" in chat_part
    chat(proxy, [{"role": "user", "content": "go"}], key="other", session="s-2", policy=policy)
    other = pinned_block(fake_upstream)
    assert "Prod DB is read-only." in other and "stg-04" not in other
    # A chat user removes only its own pins, never a curated (CLI/admin) one.
    attempt = chat(proxy, [{"role": "user", "content": f"/unpin {curated.id}"}], key="k", policy=policy)
    assert attempt.json()["choices"][0]["message"]["content"].startswith("unpin failed")
    assert [p.id for p in proxy.state.pins.list(policy, EVERY_TENANT)] == [curated.id]
    assert len(proxy.state.pins.list(policy)) == 2


def test_commands_disabled_turns_off_read_only_ones_too(make_proxy, fake_upstream):
    proxy = make_proxy()
    (proxy.policies_dir / "quiet.yaml").write_text("commands:\n  enabled: false\n  pins: project\n")
    for text in ("/recall anything", "/pins", "/pin x"):
        response = chat(proxy, [{"role": "user", "content": text}], key="k", policy="quiet")
        assert fake_upstream.chat_requests[-1].json()["messages"][-1]["content"] == text
        assert "x-ctxproxy-command" not in response.headers


def test_an_archive_from_before_session_pins_keeps_its_pins_project_wide(tmp_path):
    import sqlite3

    from sqlite_utils import Database

    from proxy.migrations import migrations
    from proxy.pins import PinStore
    from proxy.policy import LoadedPolicy, Policy
    from proxy.tokens import TokenCounter

    path = tmp_path / "archive.db"
    old = Database(sqlite3.connect(path))
    migrations.apply(old, stop_before="m008_pins_session")
    old["pins"].insert({"id": "pin-0123456789ab", "tenant": "t", "policy": "p", "name": "old",
                        "content": "kept", "tokens": 1, "created_at": "2026-01-01T00:00:00"})
    old.close()
    store = PinStore(path, TokenCounter())
    assert [p.id for p in store.list("p", "t", "any-session")] == ["pin-0123456789ab"]
    store.add(LoadedPolicy("p", Policy(), None), "mine", name="n", tenant="t", session_id="s-1")
    assert len(store.list("p", "t", "s-1")) == 2 and len(store.list("p", "t", "s-2")) == 1


@pytest.mark.parametrize(("text", "pins"), [("commands:\n  pins: off\n", "off"),
                                            ("commands:\n  pins: 'session'\n", "session"),
                                            ("{}", "off")])
def test_commands_pins_setting(tmp_path, text, pins):
    from proxy.policy import load_policy_file

    (tmp_path / "p.yaml").write_text(text)
    assert load_policy_file(tmp_path / "p.yaml").policy.commands.pins == pins


def test_commands_pins_rejects_other_values(tmp_path):
    from proxy.errors import ConfigError
    from proxy.policy import load_policy_file

    (tmp_path / "p.yaml").write_text("commands:\n  pins: everyone\n")
    with pytest.raises(ConfigError, match=r"commands\.pins"):
        load_policy_file(tmp_path / "p.yaml")


def test_an_empty_bearer_is_keyless_not_one_shared_tenant(proxy, fake_upstream):
    for session in ("s-1", "s-2"):
        response = httpx.post(f"{proxy.url}/v1/chat/completions",
                              headers={"authorization": "Bearer", "x-ctxproxy-session": session},
                              json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 200
    proxy.flush()
    tenants = [r["tenant"] for r in proxy.query("select tenant from exchanges")]
    assert len(set(tenants)) == 2 and all(t.startswith("anon-") for t in tenants)
