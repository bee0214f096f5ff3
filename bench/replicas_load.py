"""bench/replicas.py's workload and meters: agent sessions and one-shot requests (the same bodies for
every target, fixed seeds), running a batch of them on aiohttp, and CPU seconds from /proc."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from procstat import TICKS

CHAT = "/v1/chat/completions"
HEADERS = {"authorization": "Bearer sk-bench", "content-type": "application/json"}
TOOLS = [{"type": "function", "function": {"name": name, "description": text, "parameters": {
    "type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}}}
    for name, arg, text in (("run", "cmd", "Run a shell command in the repository and return its output."),
                            ("read_file", "path", "Read a file of the repository."),
                            ("grep", "pattern", "Search the repository for a regular expression."))]
WORDS = ("def", "return", "self", "config", "value", "result", "import", "error", "path", "items", "request",
         "session", "token", "for", "in", "if", "else", "None", "True", "data", "=", "(", ")", "assert",
         "FAILED", "PASSED", "tests/test_app.py", "src/server.py", "line", "raise", "ValueError")
STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)

# ------------------------------------------------------------------------------------ traffic

def text(rng: random.Random, chars: int, prefix: str = "") -> str:
    """Log- or code-like lines, about `chars` long."""
    lines, size = [prefix] if prefix else [], len(prefix)
    while size < chars:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(4, 14)))
        line = f"{rng.randrange(1, 999):>4}  {words}"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


SYSTEM = "You are a coding agent working in a repository. Use the tools. " + text(random.Random(1), 2000)


# A third of the sessions on a 16k-token window: their histories outgrow it after ~15 turns and the default
# policy masks old results (decisions the ledger commits); on gpt-4o's 128k window it forwards them whole.
SMALL_WINDOW_MODEL = "gpt-3.5-turbo"


@dataclass
class SessionPlan:
    turns: int
    seed: int
    model: str = "gpt-4o"


def agent_plans(count: int, seed: int, min_turns: int, max_turns: int) -> list[SessionPlan]:
    rng = random.Random(seed)
    return [SessionPlan(rng.randint(min_turns, max_turns), rng.randrange(1 << 30),
                        SMALL_WINDOW_MODEL if rng.random() < 1 / 3 else "gpt-4o") for _ in range(count)]


def agent_turns(plan: SessionPlan) -> Iterator[bytes]:
    """The session's requests in order: each the whole history so far (the agent appends the model's tool
    call and the tool's result after each answer; the fake upstream's own answer is not what an agent
    would get, so the call is scripted). The same bytes for every target: what the policy decides must be
    the same too (ctxproxy_actions in the report)."""
    rng = random.Random(plan.seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {plan.seed:x}: " + text(rng, 300)}]
    for turn in range(plan.turns):
        yield orjson.dumps({"model": plan.model, "messages": messages, "tools": TOOLS})
        call_id = f"call_{plan.seed:x}_{turn}"
        name, arg = rng.choice((("run", "cmd"), ("read_file", "path"), ("grep", "pattern")))
        size = rng.randint(9_000, 12_000) if rng.random() < 0.15 else rng.randint(1_000, 4_000)
        arguments = orjson.dumps({arg: f"step {turn} of task {plan.seed:x}"}).decode()
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id,
             "content": text(rng, size, f"$ {name} #{turn} {call_id}")}]


def small_body(rng: random.Random, n: int) -> bytes:
    messages = [{"role": "user", "content": f"#{n} " + text(rng, rng.randint(60, 200))}]
    if rng.random() < 0.5:
        messages = [{"role": "system", "content": "Answer briefly."}, *messages]
    if rng.random() < 0.3:
        messages += [{"role": "assistant", "content": "Which file?"},
                     {"role": "user", "content": "server.py"}]
    body: dict[str, Any] = {"model": "gpt-4o", "messages": messages}
    if rng.random() < 0.25:
        body["stream"] = True
    return orjson.dumps(body)


# ------------------------------------------------------------------------------------ the load

@dataclass
class Batch:
    latencies: list[float] = field(default_factory=list)  # ms, successful requests
    errors: int = 0
    sent: int = 0
    seconds: float = 0.0
    steady_requests: int = 0  # completed while every worker was busy
    steady_seconds: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)  # what went wrong: status and body, or exception


Send = Callable[[bytes, str], Awaitable[bool]]  # (body, session id) -> answered 200
Job = Callable[[], Awaitable[None]]
Jobs = Callable[[Send], list[Job]]


async def run_batch(bases: list[str], concurrency: int, jobs: Jobs) -> Batch:
    """`concurrency` workers; each takes the next job until none is left. A request goes to the next of
    `bases` (round-robin per request)."""
    batch = Batch()
    turn = itertools.cycle(bases)
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    done_at: list[float] = []
    drained: list[float] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=HEADERS) as client:
        async def send(body: bytes, session_id: str) -> bool:
            batch.sent += 1
            started = time.perf_counter()
            base = next(turn)
            try:
                async with client.post(base + CHAT, data=body,
                                       headers={"x-ctxproxy-session": session_id}) as response:
                    payload = await response.read()
                    ok = response.status == 200 and (b"[DONE]" in payload[-64:] or payload[:1] == b"{")
                    failure = f"HTTP {response.status}: {payload[:160].decode(errors='replace')}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                ok, failure = False, f"{type(exc).__name__}: {exc}"[:200]
            now = time.perf_counter()
            if ok:
                batch.latencies.append((now - started) * 1000)
                done_at.append(now)
            else:
                batch.errors += 1
                batch.failures[failure] = batch.failures.get(failure, 0) + 1
                log(f"request to {base} failed: {failure}")
            return ok

        queue = jobs(send)
        queue.reverse()

        async def worker() -> None:
            while queue:
                await queue.pop()()
            if not drained:  # the first worker without a job: the steady phase is over
                drained.append(time.perf_counter())

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        ended = time.perf_counter()
    batch.seconds = ended - began
    end = drained[0] if drained else ended
    batch.steady_seconds = end - began
    batch.steady_requests = sum(1 for t in done_at if t <= end)
    return batch


def agent_jobs(plans: list[SessionPlan], label: str) -> Jobs:
    def make(send: Send) -> list[Job]:
        def job(plan: SessionPlan) -> Job:
            async def run() -> None:
                session_id = f"{label}-{uuid.uuid4().hex[:12]}"
                for body in agent_turns(plan):
                    await send(body, session_id)
            return run
        return [job(plan) for plan in plans]
    return make


def small_jobs(count: int, seed: int, label: str) -> Jobs:
    rng = random.Random(seed)
    bodies = [small_body(rng, n) for n in range(count)]

    def make(send: Send) -> list[Job]:
        def job(body: bytes) -> Job:
            async def run() -> None:
                await send(body, f"{label}-{uuid.uuid4().hex[:12]}")
            return run
        return [job(body) for body in bodies]
    return make


# ------------------------------------------------------------------------------------ CPU from /proc

def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()  # from field 3 (state) of proc(5) on


def tree_cpu_seconds(root: int) -> float:
    """utime+stime of `root` and every live process under it, plus what its exited (waited-for) children
    used (cutime+cstime): PostgreSQL's backends come and go under the postmaster."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / TICKS
    if root not in times:
        return 0.0
    root_fields = _stat_fields(root)
    total = times[root] + ((int(root_fields[13]) + int(root_fields[14])) / TICKS if root_fields else 0.0)
    for pid in times:
        ancestor = parents.get(pid)
        while ancestor and ancestor != root and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor == root and pid != root:
            total += times[pid]
    return total


def self_cpu_seconds() -> float:
    used = os.times()
    return used.user + used.system


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat's first line."""
    with open("/proc/stat") as handle:
        values = [int(v) for v in handle.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


@dataclass
class Meters:
    """CPU readers by component; `settle` waits until their sum stops moving."""

    readers: dict[str, Callable[[], float]]

    def read(self) -> dict[str, float]:
        return {name: reader() for name, reader in self.readers.items()}

    def settle(self, quiet: float = 0.4, tolerance: float = 0.03, limit: float = 20.0) -> dict[str, float]:
        deadline = time.monotonic() + limit
        before = last = now = self.read()
        while time.monotonic() < deadline:
            time.sleep(quiet)
            now = self.read()
            moved = sum(now.values()) - sum(last.values())
            moved -= now["load generator"] - last["load generator"]  # this loop itself
            if moved <= tolerance:
                return now
            last = now
        log(f"not quiet after {limit:.0f} s: " + ", ".join(
            f"{name} {now[name] - before[name]:.2f}" for name, _ in self.readers.items()))
        return last
