"""Model windows and prices come from litellm's bundled map, read as JSON: the server never imports
litellm (~2.5 s and ~125 MB at start, issue 14)."""

from __future__ import annotations

import subprocess
import sys

from proxy.model_map import FALLBACK_WINDOW, model_prices, model_window


def test_windows_from_the_bundled_map():
    assert model_window("gpt-4o") == 128_000
    assert model_window("claude-sonnet-4-5") == 200_000
    assert model_window("openai/gpt-4o") == 128_000  # a provider prefix
    assert model_window("ft:gpt-4o-mini-2024-07-18:acme::abc123") == model_window("gpt-4o-mini-2024-07-18")
    assert model_window("no-such-model-anywhere") == FALLBACK_WINDOW


def test_prices_from_the_bundled_map():
    prices = model_prices("gpt-4o")
    assert prices is not None and prices["input"] == 2.5e-06 and prices["cache_read"] == 1.25e-06
    claude = model_prices("anthropic/claude-sonnet-4-5")
    assert claude is not None and claude["cache_write"] == 3.75e-06
    assert model_prices("no-such-model-anywhere") is None


def test_the_server_never_imports_litellm():
    code = ("import sys, proxy.app, proxy.cli\n"
            "from proxy.tokens import TokenCounter\nfrom proxy.model_map import model_window, model_prices\n"
            "TokenCounter().warm(); model_window('gpt-4o'); model_prices('gpt-4o')\n"
            "from proxy.tokens import warm_up\n"
            "print('litellm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
