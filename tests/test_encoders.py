"""Tokenizer families: each built once per process, however many requests ask for it first at once."""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st


def _inside(thread: threading.Thread, function: str) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_concurrent_first_requests_of_a_family_wait_for_one_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sixteen requests ask for a family not built yet, all at once: one build, and every one of them gets
    its counter (Claude's tokenizer loads at its first request: each build holds the GIL ~0.2 s)."""
    from proxy import encoders

    builds: list[str] = []
    release = threading.Event()

    def build(name: str) -> Callable[[str], int]:
        builds.append(name)
        assert release.wait(30)
        return len

    monkeypatch.setattr(encoders, "_built_encoder", build)
    monkeypatch.setattr(encoders, "_encoders", {})
    got: list[Callable[[str], int]] = []
    threads = [threading.Thread(target=lambda: got.append(encoders._encoder("family"))) for _ in range(16)]
    for thread in threads:
        thread.start()
    # Every thread is inside `_encoder` (building, or waiting for the build) before the build ends.
    deadline = time.monotonic() + 30
    while not all(_inside(t, "_encoder") for t in threads) and time.monotonic() < deadline:
        release.wait(0.001)
    release.set()
    for thread in threads:
        thread.join(30)
    assert builds == ["family"]
    assert got == [len] * 16
    assert encoders._encoder("family") is len  # (and later asks find it built)



def _recording_build(calls: list[tuple[str, int]]) -> Callable[[str], Callable[[str], int]]:
    def build(name: str) -> Callable[[str], int]:
        def count(text: str) -> int:
            calls.append((text, threading.get_ident()))
            return len(text)
        return count
    return build


def test_an_encoder_built_off_the_loop_counts_first_on_its_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """tiktoken's regex caches serve the first thread that counts without a lock, every other through
    a mutex: a family built in a worker thread (Claude's, at its first request) makes its first count
    on the server's event loop, where nearly every count runs, before the worker gets it."""
    import asyncio

    from proxy import encoders

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(encoders, "_built_encoder", _recording_build(calls))
    monkeypatch.setattr(encoders, "_encoders", {})
    monkeypatch.setattr(encoders, "_home_loop", None)

    async def main() -> tuple[int, list[tuple[str, int]]]:
        encoders.count_first_on(asyncio.get_running_loop())
        await asyncio.to_thread(encoders._encoder, "family")
        return threading.get_ident(), list(calls)

    loop_thread, seen_when_built = asyncio.run(main())
    assert [thread for _, thread in seen_when_built] == [loop_thread]
    encoders._encoder("family")("later")  # (built once: no second claim)
    assert len(calls) == 2


def test_without_a_loop_the_builder_counts_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy import encoders

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(encoders, "_built_encoder", _recording_build(calls))
    monkeypatch.setattr(encoders, "_encoders", {})
    monkeypatch.setattr(encoders, "_home_loop", None)
    builder = threading.Thread(target=encoders._encoder, args=("family",))
    builder.start()
    builder.join(30)
    assert [thread for _, thread in calls] == [builder.ident]


def test_a_loop_that_never_runs_the_claim_does_not_hold_the_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped (or long busy) loop: the builder waits CLAIM_WAIT_S, then counts on its own thread."""
    import asyncio

    from proxy import encoders

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(encoders, "_built_encoder", _recording_build(calls))
    monkeypatch.setattr(encoders, "_encoders", {})
    monkeypatch.setattr(encoders, "CLAIM_WAIT_S", 0.01)
    stopped = asyncio.new_event_loop()
    try:
        monkeypatch.setattr(encoders, "_home_loop", stopped)
        counter = encoders._encoder("family")
        assert calls == []  # the claim waits in the loop's queue
        assert counter("x") == 1
        stopped.close()
        encoders._encoders.clear()
        encoders._encoder("family")  # a closed loop: claimed right away, here
        assert [thread for _, thread in calls[1:]] == [threading.get_ident()]
    finally:
        stopped.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=80), min_size=1, max_size=12))
def test_short_texts_count_as_the_encoder_counts_them(texts: list[str]) -> None:
    """Short texts (roles, names, ids) are counted once each and remembered: the same counts."""
    from proxy import encoders

    encoder = encoders._encoder("o200k_base")
    for text in texts + texts:
        assert encoders._short_count(text, "o200k_base") == encoder(text)
    message = {"role": texts[0], "content": "".join(texts), "name": texts[-1],
               "tool_calls": [{"function": {"name": text, "arguments": text}} for text in texts]}
    expected = (encoders.TOKENS_PER_MESSAGE + encoder(texts[0]) + encoder("".join(texts))
                + encoders.TOKENS_PER_NAME * bool(texts[-1]) + (encoder(texts[-1]) if texts[-1] else 0)
                + sum(encoders.TOKENS_PER_MESSAGE + 2 * encoder(text) for text in texts))
    assert encoders._count_message(message, "o200k_base") == expected


Counter = Callable[[str], int]


# ------------------------------------------------------------------------ Claude's tokenizer via tiktoken

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO.parent / "shared" / "traces"


@functools.cache
def _tokenizers_count() -> Callable[[list[str]], list[int]]:
    """The oracle: `tokenizers` itself on the file litellm ships."""
    from tokenizers import Tokenizer

    from proxy.encoders import CLAUDE_FILE, _litellm_resource_dir

    tokenizer = Tokenizer.from_file(str(_litellm_resource_dir() / CLAUDE_FILE))
    return lambda texts: [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def _trace_texts() -> list[str]:
    texts = []
    for path in sorted(TRACES.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            for message in orjson.loads(line).get("messages") or ():
                content = message.get("content")
                parts = content if isinstance(content, list) else [{"text": content}]
                texts += [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
                calls = message.get("tool_calls") or ()
                texts += [str((c.get("function") or {}).get("arguments")) for c in calls]
    return texts


def _repository_texts() -> list[str]:
    """Code, prose, YAML and JSON: this repository's own files, whole and line by line."""
    files = [p for pattern in ("**/*.py", "**/*.md", "**/*.yaml", "tests/fixtures/**/*.json")
             for p in sorted(REPO.glob(pattern)) if ".venv" not in p.parts]
    texts = [p.read_text(errors="replace") for p in files]
    return texts + [line for text in texts for line in text.splitlines(keepends=True)]


@pytest.mark.parametrize("corpus", ["repository", "traces"])
def test_claudes_counts_through_tiktoken_are_the_tokenizers_counts(corpus: str) -> None:
    from proxy.encoders import _encoder

    if corpus == "traces" and not TRACES.is_dir():
        pytest.skip("../shared/traces is not beside this checkout")
    texts = _repository_texts() if corpus == "repository" else _trace_texts()
    assert len(texts) > 1000
    count = _encoder("claude")
    assert list(map(count, texts)) == _tokenizers_count()(texts)


# What the tokenizer treats apart: its added tokens (matched before normalizing), NFKC's changes (full-width
# forms, ligatures, composed accents, compatibility digits), the contractions and whitespace GPT-2's split
# pattern knows, scripts, emoji, control characters.
TRICKY = ["<EOT>", "<META>", "<META_START>", "<META_END>", "<SOS>", "<META", "EOT>", "\uff1cEOT\uff1e",
          "\uff46\uff55\uff4c\uff4c", "\ufb01", "\u00e9", "e\u0301", "\u00df", "\u2460", "\u216b",
          "\u01c5", "\u00a0", "\u2003", "\u200b", "\ufeff", "'s", "'S", "'ll", "'ve", " ", "  ", "\t",
          "\n", "\r\n", "\n\n", "\u4e2d\u6587", "\ud55c\uad6d\uc5b4", "\u0e44\u0e17\u0e22",
          "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\U0001f600", "\U0001f469\u200d\U0001f4bb",
          "\U0001d518\U0001d52b\U0001d526", "\x00", "\x7f", "a", "Z", "0", "42", "3.14", "_", "-", "/",
          "\\", '"', "{", "}", "<", ">", "def", " the"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(TRICKY), st.text(max_size=6)), max_size=30))
def test_claudes_counts_through_tiktoken_hold_on_tricky_text(pieces: list[str]) -> None:
    from proxy.encoders import _encoder

    text = "".join(pieces)
    assert _encoder("claude")(text) == _tokenizers_count()([text])[0]


def test_the_shipped_file_is_counted_without_tokenizers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiktoken route is the one taken for litellm's file (the equality tests above would pass on
    `tokenizers` itself): with `tokenizers` unimportable, its counter still builds and counts."""
    from proxy.encoders import CLAUDE_FILE, _claude_counter, _litellm_resource_dir

    expected = _tokenizers_count()(["Hello world <EOT>"])[0]
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # (`from tokenizers import ...` raises)
    count = _claude_counter(_litellm_resource_dir() / CLAUDE_FILE)
    assert count("Hello world <EOT>") == expected > 1


def test_a_tokenizer_file_of_another_shape_is_counted_by_tokenizers(tmp_path: Path) -> None:
    """The tiktoken route only takes the shape it reproduces; a file with another normalizer (a future
    litellm's) is counted by `tokenizers`, as before."""
    from tokenizers import Tokenizer

    from proxy.claude_ranks import claude_ranks
    from proxy.encoders import CLAUDE_FILE, _claude_counter, _litellm_resource_dir

    spec = orjson.loads((_litellm_resource_dir() / CLAUDE_FILE).read_bytes())
    assert claude_ranks(_litellm_resource_dir() / CLAUDE_FILE) is not None
    spec["normalizer"] = {"type": "Lowercase"}
    other = tmp_path / "tokenizer.json"
    other.write_bytes(orjson.dumps(spec))
    assert claude_ranks(other) is None
    text = "Hello World <EOT> \uff26\uff35\uff2c\uff2c"  # (full-width FULL)
    expected = len(Tokenizer.from_file(str(other)).encode(text, add_special_tokens=False).ids)
    shipped = _claude_counter(_litellm_resource_dir() / CLAUDE_FILE)
    assert _claude_counter(other)(text) == expected != shipped(text)


def test_a_merge_outside_the_vocabulary_is_not_taken_for_the_scheme(tmp_path: Path) -> None:
    from proxy.claude_ranks import claude_ranks
    from proxy.encoders import CLAUDE_FILE, _litellm_resource_dir

    spec = orjson.loads((_litellm_resource_dir() / CLAUDE_FILE).read_bytes())
    spec["model"]["merges"].append("zq zq")  # makes "zqzq", no token of the vocabulary
    other = tmp_path / "tokenizer.json"
    other.write_bytes(orjson.dumps(spec))
    assert claude_ranks(other) is None


def _small_byte_level_bpe(merges: list[str], added: list[str]) -> dict[str, object]:
    """A tokenizer file of the shape litellm's has: GPT-2's 256 byte stand-ins, then each merge's result."""
    from proxy.claude_ranks import UNENCODABLE, _byte_level_table

    stand_ins = [code for code, byte in _byte_level_table().items() if byte != UNENCODABLE]
    vocab = {chr(code): rank for rank, code in enumerate(stand_ins)}
    for merge in merges:
        vocab.setdefault(merge.replace(" ", ""), len(vocab))
    return {"version": "1.0", "truncation": None, "padding": None, "normalizer": {"type": "NFKC"},
            "added_tokens": [{"id": 1000 + i, "content": text, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True}
                             for i, text in enumerate(added)],
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "vocab": vocab, "merges": merges}}


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Counter, Counter]:
    """(ours, the oracle) for a small file: added tokens that share an opening (`<X>`, `<X>Y`: the longer
    one wins, as in `tokenizers`), merges whose order decides (`b c` before `a b`), a ligature NFKC splits."""
    from tokenizers import Tokenizer

    from proxy.claude_ranks import claude_ranks
    from proxy.encoders import _claude_counter

    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    merges = ["b c", "a b", "a bc", "\u0120 a", "f i"]  # (\u0120: GPT-2's stand-in for a space)
    path.write_bytes(orjson.dumps(_small_byte_level_bpe(merges, ["<X>", "<X>Y"])))
    assert claude_ranks(path) is not None
    oracle = Tokenizer.from_file(str(path))
    return _claude_counter(path), lambda text: len(oracle.encode(text, add_special_tokens=False).ids)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abc<X>Y \ufb01\n", max_size=30))  # (\ufb01: the fi ligature)
@example("<X>Y abc<X>bc \ufb01")
def test_a_small_tokenizer_counts_the_same_both_ways(
        small_tokenizer: tuple[Counter, Counter], text: str) -> None:
    ours, oracle = small_tokenizer
    assert ours(text) == oracle(text)


def test_a_file_whose_merges_make_the_same_bytes_twice_is_not_taken_for_the_scheme(tmp_path: Path) -> None:
    from proxy.claude_ranks import claude_ranks

    path = tmp_path / "tokenizer.json"
    path.write_bytes(orjson.dumps(_small_byte_level_bpe(["a b", "b c", "ab c", "a bc"], [])))
    assert claude_ranks(path) is None
    path.write_bytes(orjson.dumps(_small_byte_level_bpe(["a b", "b c", "ab c"], [])))
    assert claude_ranks(path) is not None
