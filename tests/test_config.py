"""Server config: validation, defaults, relative paths."""

from __future__ import annotations

import pytest

from proxy.cli import main
from proxy.config import load_config
from proxy.errors import ConfigError


def test_defaults_match_the_design(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("upstream:\n  base_url: http://127.0.0.1:9/v1\n")
    config = load_config(path)
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8787)
    assert config.upstream.connect_timeout_s == 10
    assert config.data_dir == tmp_path / "data"
    assert load_config(None).upstream.base_url == "https://api.openai.com/v1"


@pytest.mark.parametrize(("text", "expected"), [
    ("server:\n  prot: 1\n", "server.prot: unknown key"),
    ("datadir: x\n", "datadir: unknown key"),
    ("upstream:\n  timeout_s: -1\n", "upstream.timeout_s"),
])
def test_unknown_keys_and_bad_values_name_file_and_key(tmp_path, text, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert f"{path}: {expected}" in caught.value.message


def test_serve_with_bad_config_exits_with_a_message(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  prot: 1\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert "server.prot: unknown key" in capsys.readouterr().err


def test_example_config_is_valid_and_documents_every_key():
    from pathlib import Path

    from proxy.config import Config, ServerConfig, UpstreamConfig

    path = Path(__file__).parent.parent / "config.example.yaml"
    config = load_config(path)
    assert config.server == ServerConfig() and config.upstream == UpstreamConfig()
    text = path.read_text()
    for key in [*Config.model_fields, *ServerConfig.model_fields, *UpstreamConfig.model_fields]:
        assert f"{key}:" in text, f"config.example.yaml does not document {key}"
