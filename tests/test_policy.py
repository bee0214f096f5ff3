"""Policy files: validation messages, defaults, selection, reload, `policy check`."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from proxy.cli import main
from proxy.errors import ConfigError, NotFound
from proxy.policy import Policy, PolicyStore, load_policy_file


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_missing_keys_take_design_defaults(tmp_path):
    loaded = load_policy_file(write(tmp_path / "p.yaml", "budget:\n  max_input_tokens: 16000\n"))
    policy = loaded.policy
    assert policy.budget.max_input_tokens == 16000
    budget = policy.budget
    assert (budget.soft_warn_at_pct, budget.prune_at_pct, budget.pad_pct) == (0.7, 0.8, 0.05)
    assert policy.tool_results.threshold_tokens == 2000 and policy.tool_results.keep_recent == 3
    assert policy.working_memory.max_entities == 10 and policy.working_memory.max_from_list == 3
    assert policy.pinned.max_tokens == 100_000 and policy.folded.enabled is False
    assert load_policy_file(write(tmp_path / "empty.yaml", "")).policy == Policy()


@pytest.mark.parametrize(("text", "expected"), [
    ("budget:\n  soft_warn_pct: 0.5\n", "budget.soft_warn_pct: unknown key"),
    ("tool_results:\n  threshold_tokens: -3\n", "tool_results.threshold_tokens: Input should be greater"),
    ("budget:\n  prune_at_pct: 1.5\n", "budget.prune_at_pct"),
    ("budget:\n  soft_warn_at_pct: 0.9\n  prune_at_pct: 0.8\n", "soft_warn_at_pct must not exceed"),
    ("bogus_section: {}\n", "bogus_section: unknown key"),
    ("- a list\n", "expected a mapping"),
    ("budget: [unclosed\n", "not valid YAML"),
    ("pinned:\n  files: [missing.md]\n", "pinned.files: 'missing.md' does not exist"),
    ("working_memory:\n  type_patterns: {'get_(': page}\n", "is not a valid regex"),
])
def test_bad_policies_name_file_key_and_reason(tmp_path, text, expected):
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError) as caught:
        load_policy_file(path)
    assert str(path) in caught.value.message and expected in caught.value.message


def test_policy_check_cli(tmp_path, capsys):
    good = write(tmp_path / "good.yaml", "window:\n  enabled: false\n")
    bad = write(tmp_path / "bad.yaml", "window:\n  enabeld: false\n")
    assert main(["policy", "check", str(good)]) == 0
    assert main(["policy", "check", str(good), str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}: window.enabeld: unknown key" in err


def test_shipped_policies_are_valid():
    shipped = sorted(Path(__file__).parent.parent.joinpath("policies").glob("*.yaml"))
    assert {p.stem for p in shipped} >= {"default", "passthrough"}
    assert main(["policy", "check", *map(str, shipped)]) == 0
    passthrough = load_policy_file(Path(__file__).parent.parent / "policies" / "passthrough.yaml").policy
    assert not any(getattr(passthrough, section).enabled for section in
                   ("tool_results", "budget", "window", "summary", "working_memory", "folded"))


def test_store_reloads_changed_file_and_keeps_last_good_on_bad_edit(tmp_path, caplog):
    path = write(tmp_path / "proj.yaml", "tool_results:\n  threshold_tokens: 100\n")
    store = PolicyStore(tmp_path)
    assert store.get("proj").policy.tool_results.threshold_tokens == 100
    write(path, "tool_results:\n  threshold_tokens: 200\n")
    os.utime(path, ns=(1, 10**18))  # a distinct mtime, independent of the clock's resolution
    assert store.get("proj").policy.tool_results.threshold_tokens == 200
    write(path, "tool_results:\n  threshold_tokens: nope\n")
    os.utime(path, ns=(1, 2 * 10**18))
    assert store.get("proj").policy.tool_results.threshold_tokens == 200
    assert "keeping the last good version" in caplog.text
    with pytest.raises(NotFound):
        store.get("absent")


def test_default_file_added_later_is_picked_up(tmp_path):
    store = PolicyStore(tmp_path)
    assert store.get("default").path is None  # no default.yaml: the built-in default
    assert store.get("default").path is None  # (remembered against the folder's mtime)
    write(tmp_path / "default.yaml", "tool_results:\n  threshold_tokens: 300\n")
    os.utime(tmp_path, ns=(1, 10**18))  # a distinct folder mtime, independent of the clock's resolution
    assert store.get("default").policy.tool_results.threshold_tokens == 300


def test_store_looks_for_a_new_default_file_at_most_every_recheck_s(tmp_path):
    store = PolicyStore(tmp_path, recheck_s=3600)
    assert store.get("default").path is None  # the built-in default
    write(tmp_path / "default.yaml", "tool_results:\n  threshold_tokens: 300\n")
    os.utime(tmp_path, ns=(1, 10**18))
    assert store.get("default").path is None  # the folder not looked at again yet
    store.recheck_s = 0
    assert store.get("default").policy.tool_results.threshold_tokens == 300


def test_store_checks_a_known_file_at_most_every_recheck_s(tmp_path):
    path = write(tmp_path / "proj.yaml", "tool_results:\n  threshold_tokens: 100\n")
    store = PolicyStore(tmp_path, recheck_s=3600)
    assert store.get("proj").policy.tool_results.threshold_tokens == 100
    write(path, "tool_results:\n  threshold_tokens: 200\n")
    os.utime(path, ns=(1, 10**18))
    assert store.get("proj").policy.tool_results.threshold_tokens == 100  # not looked at again yet
    store.recheck_s = 0
    assert store.get("proj").policy.tool_results.threshold_tokens == 200


def test_reload_is_visible_through_the_server(make_proxy, fake_upstream):
    proxy = make_proxy({"server": {"reload_check_s": 0}})  # (the default looks at a file once a second)
    path = proxy.policies_dir / "passthrough.yaml"
    url = f"{proxy.url}/p/passthrough/v1/chat/completions"
    payload = {"model": "gpt-4o", "messages": [{"role": "user", "content": "word " * 300}]}
    assert httpx.post(url, json=payload).status_code == 200  # every layer off
    write(path, "budget:\n  max_input_tokens: 100\nwindow:\n  enabled: false\n")
    os.utime(path, ns=(1, 10**18))
    assert httpx.post(url, json=payload).status_code == 400  # the edit took effect: refused
    write(path, "budget:\n  enabled: maybe\n")
    os.utime(path, ns=(1, 2 * 10**18))
    assert httpx.post(url, json=payload).status_code == 400  # a bad edit keeps the last good version
