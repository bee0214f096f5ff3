"""What an agent acts on, found by shape and by content: identifier keys, ids, paths and error lines.

Shared by working memory (which records carry an id, and of what type) and the auto-summary (what a
headline names so that a recall query is obvious). Pure, deterministic and bounded in cost.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from itertools import islice
from typing import Any

MAX_KEY_CHARS = 64
MAX_SCAN_CHARS = 60_000  # a result is searched in its head and tail: ids and errors cluster there
MAX_WORD_CHARS = 128  # a single word longer than this is cut even mid-word (a blob, not a word)

GENERIC_ID_KEYS = frozenset({"id", "_id", "uuid", "guid", "sku", "code"})
# `reservation_id`, `order-id`, `flight_number`, `promo_code`; `orderId`, `flightNumber`, `customerID`
_SNAKE_ID = re.compile(r"^([A-Za-z][A-Za-z0-9_]*?)[_-]+(id|number|code|key|uuid|sku)$", re.IGNORECASE)
_CAMEL_ID = re.compile(r"^([a-z][A-Za-z0-9]*?)(Id|ID|Number|Code|Key|Uuid|UUID|Sku|SKU)$")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
# Ids of the transport, not of anything the agent works on.
NOT_ID_NOUNS = frozenset({"request", "trace", "correlation", "span", "session", "nonce", "parent"})
# `*_number`, `*_code`, `*_key` that are attributes (zip_code, status_code) or secrets (api_key).
NOT_NUMBER_NOUNS = frozenset({
    "zip", "postal", "post", "country", "currency", "status", "state", "error", "response", "http", "exit",
    "return", "language", "lang", "locale", "area", "region", "color", "colour", "phone", "line", "page",
    "version", "build", "street", "house", "apartment", "unit", "card", "credit_card", "account", "ssn",
    "social_security", "security", "tax", "routing", "iban", "swift", "cvv", "cvc", "pin", "verification",
    "otp", "auth", "access", "secret", "api", "private", "public", "signing", "encryption", "primary", "sort",
    "partition", "foreign", "idempotency", "license", "passport", "step", "row", "column", "index", "count",
    "total", "sequence", "week", "day", "month", "year", "client_secret", "invite", "reset",
})

# Content: a token mixing letters and digits (HAT169, ivan_rossi_8555, a git hash), a path, an error line.
_ID = re.compile(r"(?<![\w/.-])#?(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9][\w-]{3,63}(?![\w/])")
_PATH = re.compile(r"(?<![\w.:/])(?:\.{0,2}/)?(?:[\w.@+-]+/)+[\w.@+-]*[\w@+-]"
                   r"|(?<![\w./-])[\w-]+\.(?:py|js|ts|tsx|jsx|go|rs|java|c|h|cc|cpp|hpp|rb|php|cs|kt|swift|sh"
                   r"|yaml|yml|json|toml|cfg|ini|txt|md|rst|html|css|sql|lock|xml|csv|log)\b")
_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
_ERROR_WORDS = (r"(?i)\b(?:error|exception|traceback|failed|failure|fatal|panic|denied|not found)\b"
                r"|\w+(?:Error|Exception)\b|")
_ERROR = re.compile(_ERROR_WORDS + r"^=+ .*\b(?:passed|failed)\b")  # in one stripped line
# Found wherever _ERROR finds something in a line (unanchored: a line may start past a \r or a \f).
_ANY_ERROR = re.compile(_ERROR_WORDS + r"=+ .*\b(?:passed|failed)\b")
# The lines that say what went wrong: `ValueError: ...`, `FAILED tests/x.py::t`, `2 failed, 72 passed`.
_DECISIVE = re.compile(r"^\s*(?:[\w.]*(?:Error|Exception|Exit|Interrupt)\b:?|FAILED\b|E\s{2,}\w)"
                       r"|\b\d+ (?:failed|errors?)\b|^Error:")
# A line handing over a credential: its tokens are not repeated in a block that rides along in every request.
_CREDENTIAL = re.compile(r"(?i)\b(?:\w*key|secret|token|password|passwd|pwd|credentials?)\b\s*(?:is\b|=|:)")
_HEX_ONLY = re.compile(r"[0-9a-f]+")
_MARK = re.compile(r"[\d./]").search  # every _PATH match has a slash or a dot, every _ID match a digit
# Lower-case words every match of _ANY_ERROR, of _CREDENTIAL contains (the cheap first pass of _may_hold).
_ERROR_MARKS = ("error", "exception", "traceback", "fail", "fatal", "panic", "denied", "not found", "passed")
_CREDENTIAL_WORDS = ("key", "secret", "token", "passw", "pwd", "credential")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}")


def snake(key: str) -> str:
    return _CAMEL.sub("_", key).replace("-", "_").replace(" ", "_").lower().strip("_")


@lru_cache(maxsize=4096)
def id_key(key: str) -> tuple[str | None] | None:
    """Is `key` an identifier key? `(noun,)` names the type it implies (`reservation_id` -> reservation,
    `flightNumber` -> flight), `(None,)` is a generic id (`id`, `uuid`, `sku`, `code`) typed by where it
    sits; None: not an id key (nor are `zip_code`, `api_key` and other attributes or secrets)."""
    if not isinstance(key, str) or len(key) > MAX_KEY_CHARS:
        return None
    if key.lower() in GENERIC_ID_KEYS:
        return (None,)
    match = _SNAKE_ID.match(key) or _CAMEL_ID.match(key)
    if not match:
        return None
    noun, suffix = snake(match.group(1)), match.group(2).lower()
    if not noun or noun in NOT_ID_NOUNS or (suffix != "id" and noun in NOT_NUMBER_NOUNS):
        return None
    return (noun,)


def clip(text: str, limit: int) -> str:
    """`text` on one line, cut at a word boundary to at most `limit` characters, a cut marked with `…`."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, max(1, limit))
    if cut <= 0:  # one long first word: keep it whole unless it is a blob
        word = text.split(" ", 1)[0]
        return (word if len(word) <= MAX_WORD_CHARS else word[: MAX_WORD_CHARS - 1]) + "…"
    return text[:cut].rstrip(" ,;:") + "…"


def _scanned(text: str) -> str:
    if len(text) <= MAX_SCAN_CHARS:
        return text
    head = MAX_SCAN_CHARS * 2 // 3
    return text[:head] + "\n" + text[-(MAX_SCAN_CHARS - head):]


def ids_and_paths(text: str, limit: int) -> list[str]:
    """Ids and paths in `text`, in order of first appearance, distinct, at most `limit`."""
    text = _URL.sub(" ", _scanned(text))
    if _may_hold(text, _CREDENTIAL_WORDS) and _CREDENTIAL.search(text):
        text = "\n".join(line for line in text.splitlines() if not _CREDENTIAL.search(line))
    # Only the words that can hold a match, one a line: neither pattern matches whitespace or has it in a
    # lookaround's class, so they find the same matches, in the same order, as in the whole text.
    words = "\n".join(filter(_MARK, text.split()))
    found: dict[str, None] = {}
    for match in _merged(words):
        token = match.rstrip(".")
        if len(token) >= 4 and not (_HEX_ONLY.fullmatch(token) and len(token) < 7) and not _DATE.match(token):
            found.setdefault(token, None)
            if len(found) >= limit:
                break
    return list(found)


def _may_hold(text: str, words: tuple[str, ...]) -> bool:
    """False only when a case-insensitive pattern whose every match holds one of `words` cannot match: for
    ASCII text, none of them is in the lower-cased text (str.find in C, several times faster than the
    pattern). Outside ASCII, case-insensitive matching has equivalences lower-casing does not give
    (U+017F, U+212A): True, and the pattern decides."""
    if not text.isascii():
        return True
    lowered = text.lower()
    return any(word in lowered for word in words)


def _merged(text: str) -> Iterator[str]:
    """Path and id matches in text order (a path wins over an id inside it); lazily, as a caller that has
    enough stops early."""
    paths = _PATH.finditer(text)
    path = next(paths, None)
    for match in _ID.finditer(text):
        while path is not None and path.end() <= match.start():
            yield path.group()
            path = next(paths, None)
        if path is not None and path.start() <= match.start() < path.end():
            continue  # the id is part of the path
        yield match.group().lstrip("#")
    while path is not None:
        yield path.group()
        path = next(paths, None)


def error_lines(text: str, limit: int, width: int) -> list[str]:
    """Up to `limit` error lines: the decisive ones (exception lines, failures, test summaries; the last of
    them first) before the rest (first come), each clipped to `width`."""
    decisive: list[str] = []
    other: list[str] = []
    text = _scanned(text)
    if not _may_hold(text, _ERROR_MARKS) or not _ANY_ERROR.search(text):  # (most results have none)
        return []
    for raw in islice(text.splitlines(), 5_000):
        line = raw.strip()
        if not line or len(line) > 2_000 or not _ERROR.search(line):
            continue
        (decisive if _DECISIVE.search(line) else other).append(line)
    chosen: dict[str, None] = {}
    for line in [*reversed(decisive), *other]:
        chosen.setdefault(clip(line, width), None)
        if len(chosen) >= limit:
            break
    return list(chosen)


def json_strings(value: Any, budget: int = 5_000) -> str:
    """The string values of parsed JSON, one a line (keys such as `address1` are not content)."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack and budget > 0:
        budget -= 1
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(islice(item.values(), 200))))
        elif isinstance(item, list):
            stack.extend(reversed(list(islice(item, 200))))
    return "\n".join(out)


def id_values(value: Any, limit: int, budget: int = 5_000) -> list[str]:
    """Values of identifier keys in parsed JSON (`"order_id": "#W93"`, `"item_id": 6117189161`), in order,
    distinct; a bounded walk."""
    found: dict[str, None] = {}
    stack: list[Any] = [value]
    while stack and budget > 0 and len(found) < limit:
        budget -= 1
        item = stack.pop()
        if isinstance(item, dict):
            for key, child in islice(item.items(), 200):
                if isinstance(child, dict | list):
                    continue
                if isinstance(key, str) and id_key(key) and isinstance(child, str | int) \
                        and not isinstance(child, bool) and 0 < len(text := str(child).strip()) <= 64 \
                        and " " not in text:
                    found.setdefault(text, None)
            stack.extend(reversed([c for c in islice(item.values(), 200) if isinstance(c, dict | list)]))
        elif isinstance(item, list):
            stack.extend(reversed(list(islice(item, 50))))
    return list(found)[:limit]
