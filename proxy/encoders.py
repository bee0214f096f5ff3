"""Tokenizer families and exact counts of texts and messages. The only module that imports tiktoken.

Counts are exact for the encoding that fits the model and work offline: the encodings ship inside the
litellm package, which we locate without importing it (importing litellm costs ~2.5 s and ~125 MB). A
message counts as OpenAI's published recipe says.
"""

from __future__ import annotations

import asyncio
import binascii
import functools
import logging
import os
import re
import threading
import unicodedata
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from proxy import heavy, tokenizer_cache
from proxy.claude_ranks import GPT2_PATTERN, claude_ranks
from proxy.model_map import litellm_dir

log = logging.getLogger("ctxproxy")

# Per-message overheads as in OpenAI's published counting recipe.
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
IMAGE_TOKENS = 765


def _litellm_resource_dir() -> Path:
    package = litellm_dir()
    if package is None:
        raise RuntimeError("litellm is not installed; it ships the offline tokenizer files")
    return package / "litellm_core_utils" / "tokenizers"


def _prepare_offline_env() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        os.environ["TIKTOKEN_CACHE_DIR"] = str(_litellm_resource_dir())


@functools.lru_cache(maxsize=1024)
def encoding_name_for(model: str) -> str:
    """Pick the tokenizer family for a model name (provider prefixes are ignored)."""
    bare = model.rsplit("/", 1)[-1].lower()
    if bare.startswith("ft:"):
        bare = bare[3:]
    if "claude" in bare:
        return "claude"
    o200k_prefixes = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o", "gpt-oss")
    if bare.startswith(o200k_prefixes):
        return "o200k_base"
    if bare.startswith(("gpt-4", "gpt-3.5", "text-embedding")):
        return "cl100k_base"
    # Unknown families (gemini, llama, mistral, ...): o200k is close to their modern vocabularies.
    return "o200k_base"


CLAUDE_FILE = "anthropic_tokenizer.json"


_encoders: dict[str, Callable[[str], int]] = {}
_build_lock = threading.Lock()

# tiktoken's patterns run in fancy_regex over regex-automata, whose match caches sit in pools that every
# thread shares. A pool serves its owner, the first thread to use it, without a lock; every other thread
# takes a mutex-guarded slow path on each match: ~30 % more per count (Claude's; o200k ~20 %). Nearly
# all counting runs on the server's event loop, so each encoding counts there first.
_home_loop: asyncio.AbstractEventLoop | None = None
CLAIM_WAIT_S = 1.0


def count_first_on(loop: asyncio.AbstractEventLoop | None) -> None:
    """Make `loop`'s thread the one each tokenizer serves fastest (the server's event loop; None: the
    thread that builds it)."""
    global _home_loop
    _home_loop = loop


def _encoder(name: str) -> Callable[[str], int]:
    """Return a function counting the tokens of a string for this tokenizer family, built once: the
    concurrent first requests of a family (Claude's loads at its first request) wait for one build
    rather than each making its own (~0.2 s of held GIL apiece: sixteen cost the server ~3 s)."""
    found = _encoders.get(name)
    if found is None:
        with _build_lock:
            found = _encoders.get(name)
            if found is not None:
                return found
            found = _encoders[name] = _built_encoder(name)
        _claim(found)  # (outside the lock: the loop's thread may be waiting on it)
    return found


def _claim(counter: Callable[[str], int]) -> None:
    """The first count of a new encoder, made on the home loop's thread (see `count_first_on`); a
    builder on another thread waits for it, at most CLAIM_WAIT_S (a busy or stopped loop)."""
    loop = _home_loop
    try:
        on_loop = loop is None or asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if loop is None or on_loop or loop.is_closed():
        counter("claim")
        return
    claimed = threading.Event()

    def claim() -> None:
        try:
            counter("claim")
        finally:
            claimed.set()

    try:
        loop.call_soon_threadsafe(claim)
    except RuntimeError:  # closed meanwhile
        return
    claimed.wait(CLAIM_WAIT_S)


def _built_encoder(name: str) -> Callable[[str], int]:
    _prepare_offline_env()
    if name == "claude":
        return _claude_counter(_litellm_resource_dir() / CLAUDE_FILE)
    encoding = _tiktoken_encoding(name)
    # Counting runs in the Rust core, which holds its own copy of the ranks; the Python dict beside it
    # (~35 MB for o200k) serves only to pickle an unregistered encoding. Harmless if tiktoken changes.
    encoding._mergeable_ranks = {}
    return lambda text: len(encoding.encode_ordinary(text))


def _claude_counter(path: Path) -> Callable[[str], int]:
    """Claude's counts through tiktoken (proxy/claude_ranks.py: the same tokens, ~6 times faster), or
    through `tokenizers` for a file of another shape."""
    import tiktoken

    found = claude_ranks(path)
    if found is None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)
    encoding = tiktoken.Encoding("claude", pat_str=GPT2_PATTERN, mergeable_ranks=found.mergeable_ranks,
                                 special_tokens={})
    encoding._mergeable_ranks = {}  # (as above)
    ordinary = encoding.encode_ordinary
    longest_first = sorted(found.added, key=len, reverse=True)
    split = re.compile("|".join(map(re.escape, longest_first))).split if found.added else None
    normalize = functools.partial(unicodedata.normalize, "NFKC")

    def count(text: str) -> int:
        if split is None or len(pieces := split(text)) == 1:
            return len(ordinary(normalize(text)))
        # An added token counts one where it stands in the raw text; the rest normalize apart.
        return len(pieces) - 1 + sum(len(ordinary(normalize(piece))) for piece in pieces)

    return count


@cache
def tokenizer_version(name: str) -> str:
    """What a tokenizer family's counts depend on besides the text: the library's version (and for
    Claude's, the size of the file litellm ships), for counts kept across processes."""
    import tiktoken

    if name == "claude":  # (counted through tiktoken; a file of another shape, through `tokenizers`)
        size = (_litellm_resource_dir() / CLAUDE_FILE).stat().st_size
        return f"tiktoken-{tiktoken.__version__}-claude-{size}"

    return f"tiktoken-{tiktoken.__version__}"


_cache_dir: Path | None = None


def use_cache_dir(folder: Path | None) -> None:
    """Keep the tokenizers' ranks under `folder` (the server's `<data_dir>/cache`): a faster start."""
    global _cache_dir
    _cache_dir = folder


def _tiktoken_encoding(name: str) -> Any:
    """tiktoken's encoding, built from our cached ranks when they check out (proxy/tokenizer_cache.py)."""
    import tiktoken
    from tiktoken_ext.openai_public import ENCODING_CONSTRUCTORS

    constructor = ENCODING_CONSTRUCTORS.get(name)
    if _cache_dir is None or constructor is None:
        return tiktoken.get_encoding(name)
    kwargs = tokenizer_cache.load(_cache_dir, name, tiktoken.__version__)
    if kwargs is not None:
        try:
            return tiktoken.Encoding(**kwargs)
        except (TypeError, ValueError, OverflowError, AssertionError):
            log.warning("tokenizer cache for %s did not build: rebuilt", name)
    kwargs = _constructed(constructor)
    encoding = tiktoken.Encoding(**kwargs)
    tokenizer_cache.store(_cache_dir, name, tiktoken.__version__, kwargs)
    return encoding


_loader_lock = threading.Lock()


def _constructed(constructor: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """tiktoken's constructor arguments, its rank file parsed in bulk: tiktoken decodes it line by line
    in Python (o200k: 0.40 s here, a first start's; in bulk 0.22 to 0.26 s)."""
    from tiktoken_ext import openai_public

    with _loader_lock:  # (a constructor looks its loader up in its module when it runs)
        tiktoken_loader = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = functools.partial(parse_ranks, fallback=tiktoken_loader)
        try:
            return constructor()
        finally:
            openai_public.load_tiktoken_bpe = tiktoken_loader


def parse_ranks(path: str, expected_hash: str | None = None, *,
                fallback: Callable[..., dict[bytes, int]]) -> dict[bytes, int]:
    """tiktoken.load.load_tiktoken_bpe's result, split and decoded in C. Only for a file whose digest
    tiktoken checked (the one published, every line a token and its rank); else tiktoken's own."""
    from tiktoken.load import read_file_cached

    if expected_hash is None:
        return fallback(path, expected_hash)
    words = read_file_cached(path, expected_hash).split()
    return dict(zip(map(binascii.a2b_base64, words[0::2]), map(int, words[1::2]), strict=True))


def count_text(text: str, family: str) -> int:
    """Tokens of one text (module-level, so a huge text can be counted in the worker process)."""
    return _encoder(family)(text)


def count_messages(messages: list[dict[str, Any]], family: str) -> list[int]:
    return [_count_message(message, family) for message in messages]


SHORT_CHARS = 64


@functools.lru_cache(maxsize=4096)
def _short_count(text: str, family: str) -> int:
    """A short text's count: roles and function names recur every message, and a call into tiktoken
    costs ~5 µs however short the text."""
    return _encoder(family)(text)


def _count_message(message: dict[str, Any], family: str) -> int:
    encoder = _encoder(family)

    def count(text: str) -> int:
        if len(text) <= SHORT_CHARS:
            return _short_count(text, family)
        return heavy.call(count_text, text, family) if len(text) >= heavy.HUGE_CHARS else encoder(text)

    total = TOKENS_PER_MESSAGE + count(str(message.get("role", "")))
    content = message.get("content")
    if isinstance(content, str):
        total += count(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            if isinstance(part.get("text"), str):
                total += count(part["text"])
            elif part.get("type") in ("image_url", "input_image", "image"):
                total += IMAGE_TOKENS
            else:
                total += count(orjson.dumps(part).decode())
    if message.get("name"):
        total += TOKENS_PER_NAME + count(str(message["name"]))
    for call in message.get("tool_calls") or ():
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        total += TOKENS_PER_MESSAGE + count(str(function.get("name", ""))) + count(
            str(function.get("arguments", "")))
    if message.get("tool_call_id"):
        total += count(str(message["tool_call_id"]))
    return total
