"""The tokenizers' ranks cached for a faster start: used when they check out, rebuilt when not, and
counting exactly as tiktoken's own encoding does either way."""

from __future__ import annotations

import hashlib
import marshal
import os
import signal
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiktoken_ext import openai_public

from proxy import encoders, tokenizer_cache

NAME = "p50k_base"  # (a small vocabulary the litellm package ships: quick to build in every test)
TEXTS = ["", "hello world", "def f(x):\n    return x ** 2  # ünïcødé ✓", "ERROR at src/app.py:42 " * 50]
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the times tiktoken's own constructor runs (what the cache saves)."""
    encoders._prepare_offline_env()
    tiktoken.get_encoding(NAME)  # (tiktoken's own, built once and kept by its registry: the reference)
    calls: list[str] = []
    original = openai_public.ENCODING_CONSTRUCTORS[NAME]

    def counted():
        calls.append(NAME)
        return original()
    monkeypatch.setitem(openai_public.ENCODING_CONSTRUCTORS, NAME, counted)
    monkeypatch.setattr(encoders, "_cache_dir", None)
    return calls


def counts(encoding) -> list[list[int]]:
    return [encoding.encode_ordinary(text) for text in TEXTS]


def encoding_from(folder: Path):
    encoders.use_cache_dir(folder)
    return encoders._tiktoken_encoding(NAME)


def the_file(folder: Path) -> Path:
    return tokenizer_cache.cache_path(folder, NAME, tiktoken.__version__)


def test_the_first_build_is_written_private_and_the_next_one_reads_it(tmp_path, built):
    folder = tmp_path / "data" / "cache"
    expected = counts(tiktoken.get_encoding(NAME))
    assert counts(encoding_from(folder)) == expected
    assert built == [NAME]
    assert stat.S_IMODE(the_file(folder).stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert counts(encoding_from(folder)) == expected
    assert built == [NAME]  # the second encoding came from the file


@pytest.mark.parametrize("name", ["p50k_base", "cl100k_base", "o200k_base"])
def test_a_first_build_parses_the_ranks_in_bulk_into_what_tiktoken_builds(name, monkeypatch):
    encoders._prepare_offline_env()
    constructor = openai_public.ENCODING_CONSTRUCTORS[name]
    loader = openai_public.load_tiktoken_bpe
    parsed: list[str] = []

    def bulk(path, expected_hash=None, *, fallback):
        parsed.append(path)
        return parse_ranks(path, expected_hash, fallback=fallback)
    parse_ranks = encoders.parse_ranks
    monkeypatch.setattr(encoders, "parse_ranks", bulk)
    assert encoders._constructed(constructor) == constructor()
    assert len(parsed) == 1  # the bulk parse, not tiktoken's own
    assert openai_public.load_tiktoken_bpe is loader  # tiktoken's own again


def test_builds_in_several_threads_leave_tiktoken_its_own_loader():
    encoders._prepare_offline_env()
    loader = openai_public.load_tiktoken_bpe
    constructor = openai_public.ENCODING_CONSTRUCTORS[NAME]
    with ThreadPoolExecutor(4) as pool:
        built = list(pool.map(lambda _: encoders._constructed(constructor), range(8)))
    assert all(kwargs == built[0] for kwargs in built)
    assert openai_public.load_tiktoken_bpe is loader


def test_ranks_are_parsed_in_bulk_only_from_a_file_whose_digest_was_checked(tmp_path, monkeypatch):
    """A published rank file (its digest checked) has a token and its rank on every line; any other
    file is parsed by tiktoken, line by line: one whose words pair up wrongly (3 on a line, 1 on the
    next) is refused, never read as a shifted dict."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))  # (it keeps what it read)
    shifted = tmp_path / "shifted.tiktoken"
    shifted.write_bytes(b"YQ== 0 1234\n5678\n")  # in bulk: {b"a": 0, b"\xd7m\xf8": 5678}
    with pytest.raises(ValueError):
        encoders.parse_ranks(str(shifted), None, fallback=tiktoken.load.load_tiktoken_bpe)
    published = tmp_path / "published.tiktoken"
    published.write_bytes(b"YQ== 0\n\nYg== 1\n")
    digest = hashlib.sha256(published.read_bytes()).hexdigest()

    def not_used(*args):
        raise AssertionError("tiktoken's own parse")
    assert encoders.parse_ranks(str(published), digest, fallback=not_used) == {b"a": 0, b"b": 1}


@pytest.mark.parametrize("damage", ["a flipped byte", "cut short", "empty", "not marshal",
                                    "another shape", "another encoding", "ranks tiktoken refuses"])
def test_a_file_that_does_not_check_out_is_rebuilt_and_rewritten(tmp_path, built, damage):
    folder = tmp_path / "cache"
    expected = counts(encoding_from(folder))
    path = the_file(folder)
    data = path.read_bytes()
    digest_size = len(tokenizer_cache._DIGEST().digest())

    def signed(value) -> bytes:
        payload = marshal.dumps(value)
        return tokenizer_cache._DIGEST(payload).digest() + payload
    kwargs = marshal.loads(data[digest_size:])
    at = data.index(b" hello") + 2
    damaged = {
        "a flipped byte": data[:at] + bytes([data[at] ^ 1]) + data[at + 1:],  # a token's bytes: loads
        "cut short": data[: len(data) // 2],
        "empty": b"",
        "not marshal": tokenizer_cache._DIGEST(b"\xff" * 10).digest() + b"\xff" * 10,
        "another shape": signed([1, 2, 3]),
        "another encoding": signed(kwargs | {"name": "o200k_base"}),
        "ranks tiktoken refuses": signed(kwargs | {"mergeable_ranks": {"not bytes": "nor a rank"}}),
    }[damage]
    path.write_bytes(damaged)
    assert counts(encoding_from(folder)) == expected
    assert built == [NAME, NAME]
    assert path.read_bytes() == data  # written anew, whole
    assert counts(encoding_from(folder)) == expected
    assert built == [NAME, NAME]


def test_another_tiktoken_version_never_reads_this_one_s_file(tmp_path):
    assert tokenizer_cache.cache_path(tmp_path, NAME, "0.14.0") != tokenizer_cache.cache_path(
        tmp_path, NAME, "0.15.0")
    kwargs = {"name": NAME, "pat_str": "x", "mergeable_ranks": {b"a": 0}, "special_tokens": {}}
    tokenizer_cache.store(tmp_path, NAME, "0.14.0", kwargs)
    assert tokenizer_cache.load(tmp_path, NAME, "0.14.0") == kwargs
    assert tokenizer_cache.load(tmp_path, NAME, "0.15.0") is None


def test_a_folder_that_cannot_be_written_costs_only_time(tmp_path, built, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert counts(encoding_from(blocked / "cache")) == counts(tiktoken.get_encoding(NAME))
    assert counts(encoding_from(blocked / "cache")) == counts(tiktoken.get_encoding(NAME))
    assert built == [NAME, NAME]
    assert "tokenizer cache not written" in caplog.text
    assert not list(tmp_path.glob("**/*.tmp"))


def test_without_a_folder_nothing_is_written(tmp_path, built, monkeypatch):
    monkeypatch.chdir(tmp_path)
    encoders.use_cache_dir(None)
    assert counts(encoders._tiktoken_encoding(NAME)) == counts(tiktoken.get_encoding(NAME))
    assert not list(tmp_path.iterdir())


def serve_once(config: Path) -> None:
    """`ctxproxy serve` until uvicorn says its start-up is complete (the tokenizer is loaded by then),
    then SIGINT."""
    proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", "0"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if "Application startup complete" in line:
                break
        else:
            pytest.fail("the server ended before it started:\n" + "".join(seen))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)


def test_the_server_keeps_the_ranks_in_its_data_dir_and_starts_from_them(tmp_path):
    data_dir = tmp_path / "data"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"upstream": {"base_url": "http://127.0.0.1:9/v1"},
                                      "data_dir": str(data_dir), "policies_dir": str(ROOT / "policies")}))
    serve_once(config)
    cached = tokenizer_cache.cache_path(data_dir / "cache", "o200k_base", tiktoken.__version__)
    first = cached.stat()
    assert stat.S_IMODE(first.st_mode) == 0o600
    serve_once(config)
    again = cached.stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # read, not rewritten
    assert os.listdir(data_dir / "cache") == [cached.name]


def test_the_pin_command_counts_with_the_same_cache(tmp_path):
    """`ctxproxy pin add` (a process of its own) counts the pin with the data dir's cached ranks."""
    data_dir = tmp_path / "data"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(data_dir)}))
    argv = [sys.executable, "-m", "proxy", "pin", "add", "--config", str(config), "--policy", "default",
            "--text", "The staging host is stg-04."]
    first = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    cached = tokenizer_cache.cache_path(data_dir / "cache", "o200k_base", tiktoken.__version__).stat()
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.split()[1:3] == first.stdout.split()[1:3]  # the same count
    after = tokenizer_cache.cache_path(data_dir / "cache", "o200k_base", tiktoken.__version__).stat()
    assert (after.st_ino, after.st_mtime_ns) == (cached.st_ino, cached.st_mtime_ns)


class NeverRead:
    """Stands for marshal where a file must be turned away before it is parsed."""
    version = marshal.version

    @staticmethod
    def loads(data: bytes):
        raise AssertionError("marshal was handed bytes whose digest does not check out")


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_whatever_bytes_the_file_holds_never_reach_marshal(tmp_path, monkeypatch, data):
    """(marshal is not made for hostile bytes: random ones can make it allocate or loop without end.)"""
    monkeypatch.setattr(tokenizer_cache, "marshal", NeverRead)
    tokenizer_cache.cache_path(tmp_path, NAME, "0").write_bytes(data)
    assert tokenizer_cache.load(tmp_path, NAME, "0") is None
