"""`ctxproxy sessions|show|search` over a real archive written by the running proxy."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import orjson
import pytest

from proxy.cli import main, version


def test_sessions_show_and_search(proxy, fake_upstream, capsys):
    client = proxy.client()
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "why does build 7731 fail on arm64?"}]
    client.chat.completions.create(model="gpt-4o", messages=messages,
                                   extra_headers={"x-ctxproxy-session": "build-debug"})
    proxy.flush()
    config = ["--config", str(proxy.config_path)]

    assert main(["sessions", *config]) == 0
    out = capsys.readouterr().out
    assert "build-debug" in out and "header" in out

    assert main(["show", "build-debug", *config, "--json"]) == 0
    shown = orjson.loads(capsys.readouterr().out)
    assert shown == [*messages, {"role": "assistant", "content": f"echo: {messages[-1]['content']}"}]

    assert main(["search", "arm64", *config]) == 0
    assert "[arm64]" in capsys.readouterr().out

    assert main(["show", "nope", *config]) == 1
    assert "no session 'nope'" in capsys.readouterr().err


def test_cli_without_archive_says_so(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("data_dir: nowhere\n")
    assert main(["sessions", "--config", str(config)]) == 2
    assert "no archive at" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"ctxproxy {version()}"
    done = subprocess.run([sys.executable, "-m", "proxy", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"ctxproxy {version()}"
    assert version().count(".") >= 1
    # The installed distribution's version is this one (pyproject.toml reads it from proxy/__init__.py).
    assert importlib.metadata.version("ctxproxy") == version()
