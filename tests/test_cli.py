"""The `ctxproxy` command: `sessions|show|search` over a real archive written by the running proxy, its
version, and how `serve` keeps client connections."""

from __future__ import annotations

import importlib.metadata
import signal
import socket
import subprocess
import sys
import time

import orjson
import pytest
import yaml

from proxy.cli import main, version
from proxy.config import ServerConfig


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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_keeps_an_idle_client_connection_for_keep_alive_s(tmp_path):
    """An idle client connection stays open `server.keep_alive_s`, then the server closes it. By default
    longer than clients keep theirs idle (reqwest, Codex's, 90 s), so the client closes first."""
    assert ServerConfig().keep_alive_s > 90
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"server": {"keep_alive_s": 1},
                                      "upstream": {"base_url": "http://127.0.0.1:9/v1"},
                                      "data_dir": str(tmp_path / "data"),
                                      "policies_dir": str(tmp_path / "policies")}))
    (tmp_path / "policies").mkdir()
    port = _free_port()
    argv = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "Uvicorn running on" in line:  # (bound: the app started before)
                break
        else:
            pytest.fail("the server ended before it started")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += client.recv(4096)
            head, body = answer.split(b"\r\n\r\n", 1)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += client.recv(4096)
            assert head.startswith(b"HTTP/1.1 200")
            idle = time.monotonic()
            closed = client.recv(1)  # returns when the server closes the idle connection
            waited = time.monotonic() - idle
        assert closed == b"" and 0.9 <= waited < 4, waited  # (uvicorn's own default is 5 s)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
