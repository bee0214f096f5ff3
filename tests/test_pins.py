"""Pinned knowledge: budget errors, placement and prefix stability, runtime pins (CLI, slash, admin)."""

from __future__ import annotations

import httpx
import pytest

from proxy.cli import main
from proxy.errors import ConfigError
from proxy.pins import PinStore
from proxy.policy import LoadedPolicy, Policy, load_policy_file
from proxy.tokens import TokenCounter
from tests.conftest import BOTH_BACKENDS


def write_policy(folder, name="proj", max_tokens=100_000, files=("notes.md",)):
    (folder / "notes.md").write_text("# Conventions\nUse snake_case. Deploys go through `make ship`.\n")
    listed = ", ".join(files)
    (folder / f"{name}.yaml").write_text(f"pinned:\n  files: [{listed}]\n  max_tokens: {max_tokens}\n")
    return folder / f"{name}.yaml"


def test_pinned_files_over_budget_are_rejected_with_both_sizes(tmp_path, capsys):
    path = write_policy(tmp_path, max_tokens=5)
    with pytest.raises(ConfigError) as caught:
        load_policy_file(path)
    assert "pinned.files" in caught.value.message and "over pinned.max_tokens (5)" in caught.value.message
    assert main(["policy", "check", str(path)]) == 1
    assert "tokens, over pinned.max_tokens (5)" in capsys.readouterr().err


def test_pinned_block_follows_the_system_prompt_and_keeps_the_prefix_stable(make_proxy, fake_upstream):
    proxy = make_proxy()
    write_policy(proxy.policies_dir)
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "hi"}]
    url = f"{proxy.url}/p/proj/v1/chat/completions"
    httpx.post(url, json={"model": "gpt-4o", "messages": messages})
    messages += [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "next"}]
    httpx.post(url, json={"model": "gpt-4o", "messages": messages})
    first, second = (r.json()["messages"] for r in fake_upstream.chat_requests)
    assert first[0] == messages[0]
    assert first[1]["content"].startswith("[ctxproxy pinned knowledge") and "make ship" in first[1]["content"]
    assert first[2] == messages[1]
    assert second[:3] == first[:3]  # pinned unchanged -> identical prefix


@BOTH_BACKENDS
def test_runtime_pins_from_the_cli(make_proxy, fake_upstream, capsys):
    proxy = make_proxy()
    write_policy(proxy.policies_dir, max_tokens=60)
    config = ["--config", str(proxy.config_path), "--policy", "proj"]
    assert main(["pin", "add", "--text", "The staging host is stg-04.", *config]) == 0
    pin_id = capsys.readouterr().out.split()[0]
    response = httpx.post(f"{proxy.url}/p/proj/v1/chat/completions",
                          json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 200
    assert "stg-04" in fake_upstream.chat_requests[-1].json()["messages"][0]["content"]
    assert main(["pin", "add", "--text", "word " * 200, *config]) == 2
    assert "over pinned.max_tokens (60)" in capsys.readouterr().err
    assert main(["pin", "list", *config]) == 0
    listed = capsys.readouterr().out
    assert pin_id in listed and listed.count("pin-") == 1  # the failed pin changed nothing
    assert main(["pin", "rm", pin_id, *config]) == 0
    assert main(["pin", "rm", pin_id, *config]) == 2


@pytest.mark.parametrize("command", ["/pin", "/remember"])
def test_pin_slash_commands(make_proxy, fake_upstream, command):
    proxy = make_proxy()
    (proxy.policies_dir / "team.yaml").write_text("commands:\n  pins: project\n")  # off by default
    client = proxy.client(api_key="key-A", base_url=f"{proxy.url}/p/team/v1")
    answer = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": f"{command} Always run tests with -x."}])
    text = answer.choices[0].message.content
    assert text.startswith("Pinned as pin-") and fake_upstream.chat_requests == []
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "go"}])
    assert "Always run tests with -x." in fake_upstream.chat_requests[-1].json()["messages"][0]["content"]
    proxy.client(api_key="key-B", base_url=f"{proxy.url}/p/team/v1").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "go"}])
    assert "Always run" not in str(fake_upstream.chat_requests[-1].json()["messages"])  # tenant's own pin
    pin_id = text.split()[2]
    removed = client.chat.completions.create(model="gpt-4o",
                                             messages=[{"role": "user", "content": f"/unpin {pin_id}"}])
    assert removed.choices[0].message.content == f"Unpinned {pin_id}."


@BOTH_BACKENDS
def test_admin_pins_api(make_proxy, fake_upstream, monkeypatch):
    monkeypatch.setenv("CTXPROXY_ADMIN", "tok")
    proxy = make_proxy({"admin": {"token_env": "CTXPROXY_ADMIN"}})
    auth = {"authorization": "Bearer tok"}
    url = f"{proxy.url}/ctxproxy/pins"
    assert httpx.post(url, json={"text": "x"}).status_code == 401
    created = httpx.post(url, json={"text": "Prod DB is read-only.", "name": "db"}, headers=auth)
    assert created.status_code == 201
    listed = httpx.get(url, headers=auth).json()["pins"]
    assert [p["name"] for p in listed] == ["db"]
    assert httpx.post(url, json={"nope": 1}, headers=auth).status_code == 400
    assert httpx.delete(f"{url}/{created.json()['id']}", headers=auth).status_code == 200
    assert httpx.delete(f"{url}/{created.json()['id']}", headers=auth).status_code == 404
    assert httpx.delete(f"{url}/..%2Fetc", headers=auth).status_code in (400, 404)


def test_pins_read_are_reused_for_recheck_s_and_this_stores_own_changes_show_at_once(tmp_path):
    loaded = LoadedPolicy("proj", Policy(), None)
    tokens = TokenCounter()
    ours = PinStore(tmp_path / "archive.db", tokens, recheck_s=3600)
    elsewhere = PinStore(tmp_path / "archive.db", tokens)  # the CLI, or another replica
    assert ours.list("proj", "t1") == []
    elsewhere.add(loaded, "Deploys go through stg-04.", name="cli")
    assert ours.list("proj", "t1") == []  # read within the last recheck_s: reused
    mine = ours.add(loaded, "Always run the tests with -x.", name="chat", tenant="t1")
    assert [p.name for p in ours.list("proj", "t1")] == ["cli", "chat"]  # its own change: read again
    ours.remove("proj", mine.id, tenant="t1")
    assert [p.name for p in ours.list("proj", "t1")] == ["cli"]
    fresh = PinStore(tmp_path / "archive.db", tokens, recheck_s=0)
    assert [p.name for p in fresh.list("proj", "t1")] == ["cli"]
