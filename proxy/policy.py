"""Per-project policies: YAML files validated by pydantic, selected per request, reloaded on change."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from proxy import shipped
from proxy.config import describe_validation_error, read_yaml_mapping
from proxy.errors import BadRequest, ConfigError, NotFound
from proxy.tokens import TokenCounter

log = logging.getLogger("ctxproxy.policy")

POLICY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _check_regexes(key: str, patterns: Iterable[str]) -> None:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{key}: {pattern!r} is not a valid regex: {exc}") from None


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolResultsPolicy(_Section):
    enabled: bool = True
    threshold_tokens: int = Field(2000, gt=0)
    summarizer_model: str | None = None
    keep_recent: int = Field(3, ge=0)
    prune_at_pct: float = Field(0.80, ge=0.0, le=1.0)
    summarizer_timeout_s: float = Field(20.0, gt=0)
    max_internal_rounds: int = Field(6, ge=1, le=50)
    read_page_chars: int = Field(24_000, ge=1000)
    # Regexes marking user messages that are environment output (text-protocol agents), beside the
    # built-in mini-swe-agent / SWE-agent / smolagents shapes; such messages are summarized like tool results.
    observation_patterns: list[str] = []

    @model_validator(mode="after")
    def _observation_patterns_compile(self) -> ToolResultsPolicy:
        _check_regexes("observation_patterns", self.observation_patterns)
        return self


class BudgetPolicy(_Section):
    enabled: bool = True
    max_input_tokens: int | None = Field(None, gt=0)
    soft_warn_at_pct: float = Field(0.70, ge=0.0, le=1.0)
    prune_at_pct: float = Field(0.80, ge=0.0, le=1.0)
    pad_pct: float = Field(0.05, ge=0.0, le=1.0)
    keep_recent: int = Field(3, ge=0)
    checkpoint_redact_secrets: bool = True
    # Prune in one batch down to this share of the window, so the next turns do not prune again.
    prune_to_pct: float = Field(0.50, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _bands_in_order(self) -> BudgetPolicy:
        if self.soft_warn_at_pct > self.prune_at_pct:
            raise ValueError("soft_warn_at_pct must not exceed prune_at_pct")
        if self.prune_to_pct > self.prune_at_pct:
            raise ValueError("prune_to_pct must not exceed prune_at_pct")
        return self


class WindowPolicy(_Section):
    enabled: bool = True
    max_tokens: int | None = Field(None, gt=0)  # the window's budget; null: max_pct of the model window
    max_pct: float = Field(0.75, gt=0.0, le=1.0)
    low_water_pct: float = Field(0.70, gt=0.0, lt=1.0)  # evict in one batch down to this share of it
    recall_results: int = Field(8, ge=1, le=50)
    # A request that asks the provider to manage context itself (Anthropic `context_management` edits):
    # provider — ours stays off for it (no replacement, masking, eviction or gate; archive and blocks
    # still on); proxy — ours manages it and the request's `context_management` is not forwarded.
    native: Literal["provider", "proxy"] = "provider"


class PinnedPolicy(_Section):
    files: list[str] = []
    max_tokens: int = Field(100_000, gt=0)


class SummaryPolicy(_Section):
    enabled: bool = True
    max_tokens: int = Field(10_000, gt=0)  # also capped at 15% of the window's budget
    summarizer_model: str | None = None
    role: Literal["system", "user"] = "system"  # some chat templates accept one system message only


class WorkingMemoryPolicy(_Section):
    enabled: bool = True
    max_entities: int = Field(10, gt=0)
    max_from_list: int = Field(3, gt=0)
    type_patterns: dict[str, str] = {}  # regex on the tool name -> entity type, tried in order
    # needed: the block is injected once a result has left the prompt (before, every entity is in it
    # verbatim, and a block that moves every turn costs cache); always: from the first entity on.
    inject: Literal["needed", "always"] = "needed"

    @model_validator(mode="after")
    def _patterns_compile(self) -> WorkingMemoryPolicy:
        _check_regexes("type_patterns", self.type_patterns)
        return self


class FoldedPolicy(_Section):
    enabled: bool = False
    max_episodes: int = Field(8, gt=1)
    summarizer_model: str | None = None


class AssemblyPolicy(_Section):
    tokens_max: int = Field(12_000, gt=0)  # injected blocks besides pinned knowledge (its own budget)
    time_ms: float = Field(50.0, gt=0)  # sources not reached by then are skipped, with a warning header


class CommandsPolicy(_Section):
    """Slash commands in the last user message, answered by the proxy without calling the model.

    `enabled` turns on the read-only ones (/recall, /pins). The ones that change state (/pin,
    /remember, /unpin) need `pins` too: off (default: they are not intercepted and reach the model as
    ordinary text), session (a pin shows in the conversation it was made in) or project (in every
    conversation of the project made with the same API key).
    """

    enabled: bool = True
    pins: Literal["off", "session", "project"] = "off"

    @field_validator("pins", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        return "off" if value is False else value  # YAML 1.1 reads a bare `off` as false


class Policy(_Section):
    tool_results: ToolResultsPolicy = ToolResultsPolicy()
    budget: BudgetPolicy = BudgetPolicy()
    window: WindowPolicy = WindowPolicy()
    pinned: PinnedPolicy = PinnedPolicy()
    summary: SummaryPolicy = SummaryPolicy()
    working_memory: WorkingMemoryPolicy = WorkingMemoryPolicy()
    folded: FoldedPolicy = FoldedPolicy()
    commands: CommandsPolicy = CommandsPolicy()
    assembly: AssemblyPolicy = AssemblyPolicy()


@dataclass(frozen=True)
class LoadedPolicy:
    name: str
    policy: Policy
    path: Path | None  # None for the built-in default

    def with_window(self, tokens: int) -> LoadedPolicy:
        """This policy sized for a window the request itself asks for (unless the policy fixes one)."""
        if self.policy.budget.max_input_tokens is not None:
            return self
        budget = self.policy.budget.model_copy(update={"max_input_tokens": tokens})
        return dataclasses.replace(self, policy=self.policy.model_copy(update={"budget": budget}))

    def without_models(self) -> LoadedPolicy:
        """This policy with every summarizer model off (deterministic summaries, headlines and folding)."""
        policy = self.policy
        if not (policy.tool_results.summarizer_model or policy.summary.summarizer_model
                or policy.folded.summarizer_model):
            return self
        off = {"summarizer_model": None}
        return dataclasses.replace(self, policy=policy.model_copy(update={
            "tool_results": policy.tool_results.model_copy(update=off),
            "summary": policy.summary.model_copy(update=off),
            "folded": policy.folded.model_copy(update=off)}))

    def leaving_context_to_provider(self) -> LoadedPolicy:
        """This policy with every layer that rewrites the conversation off (the provider manages it)."""
        off = {"enabled": False}
        policy = self.policy.model_copy(update={
            "tool_results": self.policy.tool_results.model_copy(update=off),
            "budget": self.policy.budget.model_copy(update=off),
            "window": self.policy.window.model_copy(update=off)})
        return dataclasses.replace(self, policy=policy)

    @property
    def folder(self) -> Path | None:
        return self.path.parent if self.path else None


def validate_policy_name(name: str) -> str:
    if not POLICY_NAME.match(name):
        raise BadRequest(f"invalid policy name {name!r}: use letters, digits, '.', '_' or '-'",
                         code="invalid_policy")
    return name


def load_policy_file(path: Path) -> LoadedPolicy:
    """Parse and validate one policy file; errors name the file, the key and the reason."""
    data = read_yaml_mapping(path)
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(str(path), exc)) from None
    pinned_tokens = 0
    for relative in policy.pinned.files:
        file = path.parent / relative
        if not file.is_file():
            raise ConfigError(f"{path}: pinned.files: {relative!r} does not exist "
                              f"(paths are relative to the policy file)")
        pinned_tokens += _counter().text(file.read_text(encoding="utf-8", errors="replace"), "gpt-4o")
    if pinned_tokens > policy.pinned.max_tokens:
        raise ConfigError(f"{path}: pinned.files: the pinned files hold {pinned_tokens} tokens, over "
                          f"pinned.max_tokens ({policy.pinned.max_tokens})")
    return LoadedPolicy(name=path.stem, policy=policy, path=path)


@functools.cache
def _counter() -> TokenCounter:
    return TokenCounter()


class PolicyStore:
    """Finds `<name>.yaml` in the policies folder; re-reads a file when its mtime changes, checked at most
    every `recheck_s` seconds (0: on every get).

    A bad edit keeps the last good version in service and logs why. No folder (no `policies_dir` in the
    config): the policies shipped with ctxproxy.
    """

    def __init__(self, folder: Path | None, recheck_s: float = 0.0) -> None:
        self.folder = folder if folder is not None else shipped.policies_dir()
        self.recheck_s = recheck_s
        self._checked: dict[str, float] = {}  # name -> when its file was last found unchanged
        self._cache: dict[str, tuple[float, LoadedPolicy]] = {}
        self._builtin_default = LoadedPolicy("default", Policy(), None)
        # A folder with no default.yaml: the folder's mtime when that was seen (a file added or renamed
        # into it changes it), so the built-in default costs one stat every recheck_s, not two failed
        # lookups a request.
        self._no_default_file: int | None = None

    def _path_for(self, name: str) -> Path | None:
        if self.folder is None:
            return None
        for suffix in (".yaml", ".yml"):
            candidate = self.folder / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
        return None

    def get(self, name: str) -> LoadedPolicy:
        cached = self._cache.get(name)
        if cached is not None and cached[1].path is not None:
            # Hot path: one stat of the file we already know, at most every recheck_s; anything unusual
            # takes the slow path.
            now = time.monotonic()
            if now - self._checked.get(name, -math.inf) < self.recheck_s:
                return cached[1]
            try:
                if os.stat(cached[1].path).st_mtime_ns == cached[0]:
                    self._checked[name] = now
                    return cached[1]
            except OSError:
                pass
        if name == "default" and self._no_default_file is not None:
            # (the built-in default: the folder looked at again at most every recheck_s, as a file is)
            now = time.monotonic()
            if now - self._checked.get(name, -math.inf) < self.recheck_s:
                return self._builtin_default
            if self._folder_mtime() == self._no_default_file:
                self._checked[name] = now
                return self._builtin_default
        validate_policy_name(name)
        folder_mtime = self._folder_mtime()
        path = self._path_for(name)
        if path is None:
            if name == "default":
                self._no_default_file, self._checked[name] = folder_mtime, time.monotonic()
                return self._builtin_default
            raise NotFound(f"unknown policy {name!r}; available: {', '.join(self.names()) or 'default'}",
                           code="unknown_policy")
        mtime = os.stat(path).st_mtime_ns
        self._checked[name] = time.monotonic()
        if cached and cached[0] == mtime and cached[1].path == path:
            return cached[1]
        try:
            loaded = load_policy_file(path)
        except ConfigError as exc:
            if cached:
                log.error("policy %s: keeping the last good version: %s", name, exc)
                self._cache[name] = (mtime, cached[1])
                return cached[1]
            raise
        self._cache[name] = (mtime, loaded)
        if cached:
            log.info("policy %s reloaded from %s", name, path)
        return loaded

    def _folder_mtime(self) -> int | None:
        try:
            return os.stat(self.folder).st_mtime_ns if self.folder is not None else None
        except OSError:
            return None

    def names(self) -> list[str]:
        if self.folder is None or not self.folder.is_dir():
            return ["default"]
        found = {p.stem for p in self.folder.iterdir() if p.suffix in (".yaml", ".yml")}
        return sorted(found | {"default"})

    def check_all(self) -> list[str]:
        """Load every policy at start so a broken file fails loudly before serving."""
        problems = []
        for name in self.names():
            try:
                self.get(name)
            except ConfigError as exc:
                problems.append(str(exc))
        return problems
