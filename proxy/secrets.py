"""Secret-looking values in free text, in one place: API keys, tokens, passwords, private keys.

`scrub` replaces each with `[redacted secret]`. The patterns favour catching a secret over keeping
an innocent look-alike: they run on copies meant for people to read (refusal checkpoints), never on
what is forwarded to the model.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted secret]"
# The checkpoint's `redaction_policy` entry naming this scrub.
POLICY_ENTRY = "secrets:api_keys,tokens,passwords,private_keys"

_ALNUM = r"A-Za-z0-9"

# (kind, pattern). A pattern with a group named `value` has only that group replaced.
PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    # PEM private key blocks (RSA, EC, OPENSSH, ENCRYPTED, PGP ...); a block cut short runs to the end.
    ("private_key", re.compile(
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
        r"(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|.*\Z)", re.DOTALL)),
    # OpenAI (sk-, sk-proj-, sk-svcacct-) and Anthropic (sk-ant-) keys.
    ("api_key", re.compile(rf"(?<![{_ALNUM}_-])sk-[{_ALNUM}][{_ALNUM}_-]{{15,}}")),
    # Stripe secret and restricted keys.
    ("api_key", re.compile(rf"(?<![{_ALNUM}_-])[rs]k_(?:live|test)_[{_ALNUM}]{{16,}}")),
    # Google API keys.
    ("api_key", re.compile(rf"(?<![{_ALNUM}_-])AIza[{_ALNUM}_-]{{35}}")),
    # AWS access key ids (long-term and temporary).
    ("api_key", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])")),
    # GitHub (classic and fine-grained), GitLab, Slack, Hugging Face tokens.
    ("token", re.compile(rf"(?<![{_ALNUM}_])gh[pousr]_[{_ALNUM}]{{20,}}")),
    ("token", re.compile(rf"(?<![{_ALNUM}_])github_pat_[{_ALNUM}_]{{20,}}")),
    ("token", re.compile(rf"(?<![{_ALNUM}_-])glpat-[{_ALNUM}_-]{{20,}}")),
    ("token", re.compile(rf"(?<![{_ALNUM}_-])xox[abposr]-[{_ALNUM}-]{{10,}}")),
    ("token", re.compile(rf"(?<![{_ALNUM}_])hf_[{_ALNUM}]{{30,}}")),
    # JSON Web Tokens: base64url header and payload (the header always starts with `{"`), signature.
    ("token", re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*")),
    # Bearer credentials, e.g. a pasted Authorization header (the credential goes; it holds a digit).
    ("token", re.compile(r"\b(?:[Bb]earer|BEARER)\s+(?P<value>(?!\[redacted)(?=[A-Za-z._~+/=-]*[0-9])"
                         r"[A-Za-z0-9._~+/=-]{8,})")),
    # Authorization headers of any scheme (Basic, Digest, ...): everything after the scheme goes.
    ("token", re.compile(r"(?i)\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?[A-Za-z]+\s+"
                         r"(?P<value>(?!\[redacted)[^\s\"']+)")),
    # Passwords in URLs: scheme://user:PASSWORD@host.
    ("password", re.compile(r"://[^/\s:@]+:(?P<value>(?!\[redacted)[^/\s@]+)@")),
    # Assignments: password=..., passwd: ..., "secret": "...", API_KEY=..., GITHUB_TOKEN=... (the value goes).
    ("password", re.compile(
        r"(?i)(?<![A-Za-z0-9])[A-Za-z0-9_.-]*?"
        r"(?:password|passwd|secret|token|api[_-]?key|apikey|(?:access|secret|private|signing)[_-]?key)"
        r"(?![A-Za-z0-9])[\"']?\s*(?:=|:)\s*"
        r"(?:(?P<q>[\"'])(?P<quoted>(?!\[redacted)[^\"'\n]+)(?P=q)"
        r"|(?P<value>(?!\[redacted)[^\s\"',;&}\]]+))")),
]

KINDS = sorted({kind for kind, _ in PATTERNS})


def _replace(match: re.Match[str]) -> str:
    for group in ("quoted", "value"):
        if group in match.re.groupindex and match.group(group) is not None:
            start, end = match.span(group)
            whole_start = match.start()
            text = match.group(0)
            return text[:start - whole_start] + REDACTED + text[end - whole_start:]
    return REDACTED


def scrub(text: str) -> str:
    """`text` with every secret-looking value replaced by `[redacted secret]`."""
    if not text:
        return text
    for _, pattern in PATTERNS:
        text = pattern.sub(_replace, text)
    return text


def scrub_value(value: Any) -> Any:
    """A copy of a JSON-like value with every string in it scrubbed (keys are kept)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [scrub_value(item) for item in value]
    if isinstance(value, dict):
        return {key: scrub_value(item) for key, item in value.items()}
    return value


def contains_secret(text: str) -> bool:
    return scrub(text) != text
