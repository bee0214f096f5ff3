"""A tokenizer's ranks kept in a file that loads in a tenth of the time, for a faster start.

tiktoken builds an encoding from its `.tiktoken` file by decoding 200,000 base64 lines in Python on every
start (o200k: ~0.15 s on a quick machine, ~0.35 s on a slow one: a sixth of ctxproxy's start). The same
constructor arguments written once with `marshal` load in ~0.05 s. The file is ours (`<data_dir>/cache/`,
0600 in a 0700 folder, written whole then renamed into place), named by everything its bytes depend on
(the encoding, tiktoken's version, the marshal format), and checked against a digest before it is used:
anything that does not check out is ignored and written anew. marshal runs no code, but it is not made
for hostile bytes (a crafted payload can make it allocate or loop without end: random bytes do, in a
fuzz run): it only ever reads a payload whose digest checks out, so a damaged file never reaches it, and
the folder is the proxy's own, as the archive beside it. What it built is type-checked before tiktoken
sees it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import marshal
import os
import re
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("ctxproxy")

_DIGEST = hashlib.sha256
_DIGEST_SIZE = _DIGEST().digest_size
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")  # (file names from versions and encoding names)


def cache_path(folder: Path, name: str, version: str) -> Path:
    python = f"py{sys.version_info[0]}{sys.version_info[1]}m{marshal.version}"
    return folder / _SAFE.sub("_", f"tiktoken-{name}-{version}-{python}.marshal")


def load(folder: Path, name: str, version: str) -> dict[str, Any] | None:
    """The constructor arguments stored for this encoding, or None (no file, or one that does not check
    out: it is then rewritten by `store`)."""
    path = cache_path(folder, name, version)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    digest, payload = data[:_DIGEST_SIZE], data[_DIGEST_SIZE:]
    if _DIGEST(payload).digest() != digest:
        log.warning("tokenizer cache %s does not check out: rebuilt", path)
        return None
    try:
        kwargs = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    return kwargs if _well_formed(kwargs, name) else None


def store(folder: Path, name: str, version: str, kwargs: dict[str, Any]) -> None:
    """Write the constructor arguments (best effort: a cache that cannot be written only costs time)."""
    path = cache_path(folder, name, version)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        payload = marshal.dumps(kwargs)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_DIGEST(payload).digest())
            f.write(payload)
        os.replace(temporary, path)  # whole or not at all, whoever else writes it at the same time
    except (OSError, ValueError) as exc:
        log.warning("tokenizer cache not written to %s: %s", folder, exc)
        with contextlib.suppress(OSError):
            temporary.unlink()


def _well_formed(kwargs: Any, name: str) -> bool:
    """The shape tiktoken's Encoding takes (the ranks' entries are checked by tiktoken's own constructor)."""
    return (isinstance(kwargs, dict) and kwargs.get("name") == name
            and isinstance(kwargs.get("pat_str"), str)
            and isinstance(kwargs.get("mergeable_ranks"), dict) and len(kwargs["mergeable_ranks"]) > 0
            and isinstance(kwargs.get("special_tokens"), dict)
            and set(kwargs) <= {"name", "pat_str", "mergeable_ranks", "special_tokens", "explicit_n_vocab"})
