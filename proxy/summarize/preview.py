"""`ctxproxy summarize FILE`: exactly the replacement layer 1 would put in the prompt for a tool result."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

HANDLE = "preview"
MODEL = "gpt-4o"


@dataclass
class Preview:
    replaced: bool
    original_tokens: int
    summary_tokens: int  # of the labelled summary, made or not
    text: str  # what the model would see: the summary, or the original when none is applied

    def as_dict(self) -> dict[str, object]:
        return {"replaced": self.replaced, "original_tokens": self.original_tokens,
                "summary_tokens": self.summary_tokens, "text": self.text}


def preview(content: str, tool: str | None = None, arguments: str | None = None,
            model: str = MODEL) -> Preview:
    from proxy.layers.tool_results import replacement, summary_text
    from proxy.tokens import TokenCounter

    tokens = TokenCounter()

    def count(text: str) -> int:
        return tokens.text(text, model)

    made = replacement(HANDLE, tool, content, count, arguments)
    original = count(content)
    if made is not None:
        return Preview(True, original, count(made), made)
    summary = summary_text(HANDLE, tool, content, original, arguments=arguments)
    return Preview(False, original, count(summary), content)


def read_input(name: str) -> str:
    """The file's text (`-`: stdin); FileNotFoundError for a missing file."""
    if name == "-":
        return sys.stdin.read()
    path = Path(name)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {name}")
    return path.read_text(encoding="utf-8", errors="replace")


def explain(result: Preview) -> str:
    """Why no summary is applied, in one line (for the plain-text output)."""
    return (f"not replaced: the summary would be {result.summary_tokens} tokens, more than half of the "
            f"original's {result.original_tokens}; layer 1 keeps the original (shown below).")
