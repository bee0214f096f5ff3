"""Model windows and prices, from the JSON map litellm bundles, read without importing litellm (importing it
costs ~2.5 s and ~125 MB at start)."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

import orjson

FALLBACK_WINDOW = 8192


@cache
def litellm_dir() -> Path | None:
    """Where the litellm package lies (found, never imported), or None when it is not installed."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


_windows: dict[str, int] = {}
MODEL_MAP = "model_prices_and_context_window_backup.json"  # litellm's bundled map of windows and prices


@cache
def _model_map() -> dict[str, Any]:
    """litellm's bundled model map, read as JSON: importing litellm for it would cost ~2 s and ~120 MB."""
    package = litellm_dir()
    if package is None:
        return {}
    try:
        loaded = orjson.loads((package / MODEL_MAP).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def model_info(model: str) -> dict[str, Any] | None:
    """The map's entry for `model`: as named, then without a provider prefix (`openai/gpt-4o`) or a
    fine-tune wrapper (`ft:gpt-4o-mini:org::id`)."""
    names = [model]
    if model.startswith("ft:") and model.count(":") >= 1:
        names.append(model.split(":")[1])
    if "/" in model:
        names.append(model.split("/", 1)[1])
    known = _model_map()
    for name in names:
        entry = known.get(name)
        if isinstance(entry, dict):
            return entry
    return None


def model_window(model: str) -> int:
    """The model's input window from litellm's bundled map; 8192 for models it does not know."""
    if model not in _windows:
        entry = model_info(model) or {}
        window = entry.get("max_input_tokens")
        _windows[model] = int(window) if isinstance(window, int | float) and window > 0 else FALLBACK_WINDOW
    return _windows[model]


def model_prices(model: str) -> dict[str, float | None] | None:
    """USD per token from litellm's bundled cost map (input, output, cache read, cache write), or None
    for a model it does not know."""
    entry = model_info(model)
    if entry is None or entry.get("input_cost_per_token") is None:
        return None
    return {"input": entry.get("input_cost_per_token"), "output": entry.get("output_cost_per_token"),
            "cache_read": entry.get("cache_read_input_token_cost"),
            "cache_write": entry.get("cache_creation_input_token_cost")}
