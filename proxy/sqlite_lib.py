"""sqlite-utils, imported without numpy and pandas.

sqlite-utils imports numpy and pandas when they are installed, only to map their value types to column
types; the archive never stores one. litellm[proxy] installs numpy (through soundfile), so the import
cost the server ~0.15 s of its start and ~15 MB of memory for nothing. Both stay importable for anyone
else: they are hidden only while sqlite-utils loads.
"""

from __future__ import annotations

import sys

_HIDDEN = ("numpy", "pandas")


def _load() -> None:
    hidden = [name for name in _HIDDEN if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # (`import name` raises ImportError)
    try:
        import sqlite_utils  # noqa: F401
    finally:
        for name in hidden:
            if sys.modules.get(name, False) is None:  # (still our placeholder)
                del sys.modules[name]


_load()

from sqlite_utils import Database, Migrations  # noqa: E402

__all__ = ["Database", "Migrations"]
