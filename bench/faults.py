"""Faults, hostile input and load against a real ctxproxy process (issue 8's figures).

Run: `.venv/bin/python bench/faults.py [--quick]`. Everything runs on loopback: a fake upstream with
fault modes (bench/fake_upstream.py; for the truncation and kill -9 parts, which cover all three wire
formats and live in bench/faults_wire.py, bench/fault_upstream.py) and ctxproxy as subprocesses, so RSS
is the proxy's own.
Prints: 5xx over fuzz cases, acknowledged-but-unarchived (and duplicated) exchanges after kill -9 per
route, silent truncations per route (the official openai / anthropic SDKs as clients), probe p99
while a 20 MB request and a recall over a 20 MB document run, recall p95, RSS around a 100 MB answer,
RSS after many long sessions.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import fault_upstream
from bench.faults_wire import kill_nine, print_kill, print_truncations, silent_truncations
from bench.services import BIN, Service, _spawn, free_port, start_fake, wait_ready
from tests.strategies_requests import mutated_requests

SMALL_POLICY = {"tool_results": {"threshold_tokens": 200}}
TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]


def start_proxy(workdir: Path, upstream: str, name: str, timeout_s: float = 30.0) -> Service:
    policies = workdir / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "small.yaml").write_text(yaml.safe_dump(SMALL_POLICY))
    config = workdir / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"log_level": "warning"}, "data_dir": str(workdir / f"{name}-data"),
        "upstream": {"base_url": f"{upstream}/v1", "anthropic_base_url": upstream, "timeout_s": timeout_s},
        "policies_dir": str(policies)}))
    port = free_port()
    exe = BIN / "ctxproxy"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "proxy"]
    proc, log = _spawn(name, [*argv, "serve", "--config", str(config), "--port", str(port)], workdir)
    service = Service(name, proc, f"http://127.0.0.1:{port}", log,
                      extra={"archive": str(workdir / f"{name}-data" / "archive.db"), "config": str(config)})
    wait_ready(service, "/healthz", 60)
    return service


def proc_status(pid: int) -> dict[str, float]:
    """Memory fields of /proc/<pid>/status in MB (VmRSS, VmHWM, RssAnon, RssFile)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in line)
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MB."""
    status = proc_status(pid)
    return status["VmRSS"], status["VmHWM"]


def anon_mb(pid: int) -> float:
    """Anonymous memory (heap): RSS without file pages the archive maps (page cache, reclaimable)."""
    return proc_status(pid)["RssAnon"]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def big_log(megabytes: int) -> str:
    line = "2026-11-22 12:00:00 INFO worker processed item {} path=src/app/mod.py status=ok\n"
    count = megabytes * 1024 * 1024 // len(line)
    return "".join(line.format(i) for i in range(count))


# ---------------------------------------------------------------------------------------- figures

def fuzz(proxy: Service, cases: int) -> dict[str, int]:
    statuses: dict[str, int] = {}
    with httpx.Client(base_url=proxy.base, timeout=60) as client:
        for n, body in enumerate(mutated_requests(seed=8, n=cases)):
            path = "/p/small/v1/chat/completions" if n % 2 else "/v1/chat/completions"
            response = client.post(path, content=body, headers={"content-type": "application/json",
                                                                "authorization": f"Bearer sk-fuzz-{n % 5}"})
            key = f"{response.status_code // 100}xx"
            statuses[key] = statuses.get(key, 0) + 1
    return statuses


def probes_during(proxy: Service, work, label: str) -> dict[str, float]:
    """Run `work` in a thread; meanwhile probe /healthz and another tenant's new session, back to back."""
    done = threading.Event()
    health: list[float] = []
    other: list[float] = []
    started = time.perf_counter()

    def run_work() -> None:
        try:
            work()
        finally:
            done.set()

    worker = threading.Thread(target=run_work)
    worker.start()
    with httpx.Client(base_url=proxy.base, timeout=120) as client:
        n = 0
        while not done.is_set():
            t0 = time.perf_counter()
            client.get("/healthz")
            health.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            client.post("/v1/chat/completions", headers={"authorization": f"Bearer sk-probe-{n}"},
                        json={"model": "gpt-4o", "messages": [{"role": "user", "content": f"probe {n}"}]})
            other.append((time.perf_counter() - t0) * 1000)
            n += 1
    worker.join()
    return {"label": label, "work_s": time.perf_counter() - started, "healthz_p99": pct(health, 0.99),
            "other_p99": pct(other, 0.99), "probes": len(health)}


def big_request(proxy: Service, document: str, session: str) -> None:
    body = {"model": "gpt-4o", "tools": TOOLS, "messages": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_big", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_big", "content": document},
        {"role": "user", "content": "what happened?"}]}
    response = httpx.post(f"{proxy.base}/v1/chat/completions", content=orjson.dumps(body), timeout=300,
                          headers={"authorization": "Bearer sk-big", "x-ctxproxy-session": session,
                                   "content-type": "application/json"})
    assert response.status_code == 200, response.text[:300]


def recall(proxy: Service, query: str, session: str, client: httpx.Client | None = None) -> float:
    """One /recall through the proxy, timed. Pass a client: `httpx.post` builds a client (and an SSL
    context) per call, ~20 ms of the benchmark's own that would be charged to the proxy."""
    own = client is None
    client = client or httpx.Client(timeout=120)
    try:
        t0 = time.perf_counter()
        response = client.post(f"{proxy.base}/v1/chat/completions", timeout=120,
                               headers={"authorization": "Bearer sk-big", "x-ctxproxy-session": session},
                               json={"model": "gpt-4o",
                                     "messages": [{"role": "user", "content": f"/recall {query}"}]})
        elapsed = (time.perf_counter() - t0) * 1000
    finally:
        if own:
            client.close()
    assert response.status_code == 200
    return elapsed


def long_sessions(proxy: Service, sessions: int, turns: int) -> None:
    def session(n: int) -> None:
        messages: list[dict] = [{"role": "system", "content": "You are a coding agent."},
                                {"role": "user", "content": f"task {n}: fix the failing test"}]
        with httpx.Client(base_url=proxy.base, timeout=60) as client:
            for turn in range(turns):
                call = f"call_{n}_{turn}"
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": call, "type": "function",
                     "function": {"name": "run", "arguments": '{"cmd":"ls"}'}}]})
                messages.append({"role": "tool", "tool_call_id": call,
                                 "content": f"output {turn}\n" + "src/module_file.py ok\n" * 60})
                response = client.post("/v1/chat/completions", content=orjson.dumps(
                    {"model": "gpt-4o", "tools": TOOLS, "messages": messages}),
                    headers={"x-ctxproxy-session": f"long-{n}", "authorization": "Bearer sk-long",
                             "content-type": "application/json"})
                assert response.status_code == 200, response.text[:300]

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(session, range(sessions)))


SESSIONS_OVERRIDE: tuple[int, int] | None = None
SECTIONS = ("fuzz", "truncation", "stall", "recall", "huge", "sessions", "kill")


def fresh(workdir: Path, fake: Service, name: str, **kwargs: float) -> Service:
    """A new proxy process (own data dir), so each figure starts from a clean RSS and archive."""
    return start_proxy(workdir, fake.base, name, **kwargs)


def run_section(name: str, workdir: Path, fake: Service, quick: bool) -> None:
    if name in ("kill", "truncation"):
        faulty = fault_upstream.start(workdir)
        try:
            if name == "kill":
                for mid_load in (False, True):
                    label = "in the middle of the load" if mid_load else "right after the last answer"
                    print_kill(label, kill_nine(start_proxy, workdir, faulty.base, 200 if quick else 1000,
                                                "killed-mid" if mid_load else "killed", mid_load))
            else:
                proxy = fresh(workdir, faulty, name, timeout_s=2.0)
                try:
                    print_truncations(silent_truncations(proxy, 3 if quick else 25, big_log(1)[:40_000]))
                finally:
                    proxy.stop()
        finally:
            faulty.stop()
        return
    proxy = fresh(workdir, fake, name, timeout_s=2.0)
    try:
        start_rss, _ = rss_mb(proxy.proc.pid)
        start_anon = anon_mb(proxy.proc.pid)
        if name == "fuzz":
            statuses = fuzz(proxy, 300 if quick else 2000)
            print(f"fuzz: {sum(statuses.values())} cases, status classes {statuses}; "
                  f"5xx = {statuses.get('5xx', 0)}")
        elif name == "stall":
            document = big_log(20)
            stall = probes_during(proxy, lambda: big_request(proxy, document, "big-1"), "20 MB request")
            print(f"during a 20 MB request ({stall['work_s']:.1f} s, {stall['probes']} probes): /healthz p99 "
                  f"{stall['healthz_p99']:.1f} ms, other tenant p99 {stall['other_p99']:.1f} ms")
        elif name == "recall":
            big_request(proxy, big_log(20), "big-1")
            words = ["worker", "status", "processed", "module", "item 12345", "path", "INFO", "mod.py"]
            rec = probes_during(proxy, lambda: [recall(proxy, w, "big-1") for w in words * 3],
                                "recalls over 20 MB")
            print(f"during 24 recalls over the 20 MB document ({rec['work_s']:.2f} s, "
                  f"{rec['probes']} probes): /healthz p99 {rec['healthz_p99']:.1f} ms, "
                  f"other tenant p99 {rec['other_p99']:.1f} ms")
            with httpx.Client(timeout=120) as client:  # kept alive, as an agent's SDK client is
                latencies = [recall(proxy, words[i % len(words)], "big-1", client) for i in range(80)]
            print(f"recall (/recall end to end) with the 20 MB document archived: p50 "
                  f"{statistics.median(latencies):.1f} ms, p95 {pct(latencies, 0.95):.1f} ms")
            direct = direct_recall(Path(proxy.extra["archive"]), words)
            print(f"recall (ArchiveReader.recall in process, same archive): p50 "
                  f"{statistics.median(direct):.1f} ms, p95 {pct(direct, 0.95):.1f} ms")
        elif name == "huge":
            httpx.post(f"{proxy.base}/v1/chat/completions", timeout=300,
                       headers={"x-fake-mode": "huge", "x-fake-size": str(100 * 1024 * 1024)},
                       json={"model": "gpt-4o", "messages": [{"role": "user", "content": "huge"}]})
            wait_archived(Path(proxy.extra["archive"]), 1)  # settled: the writer has committed it too
            after, peak = rss_mb(proxy.proc.pid)
            print(f"100 MB upstream answer: RSS at start {start_rss:.0f} MB, peak {peak:.0f} MB (high-water "
                  f"mark), settled {after:.0f} MB ({after - start_rss:+.0f} MB); anonymous memory "
                  f"{start_anon:.0f} -> {anon_mb(proxy.proc.pid):.0f} MB")
        elif name == "sessions":
            sessions, turns = SESSIONS_OVERRIDE or ((10, 40) if quick else (100, 200))
            long_sessions(proxy, sessions, turns)
            end_rss, peak = rss_mb(proxy.proc.pid)
            print(f"{sessions} sessions x {turns} turns: RSS at start {start_rss:.0f} MB, after "
                  f"{end_rss:.0f} MB ({end_rss - start_rss:+.0f} MB), peak {peak:.0f} MB; anonymous memory "
                  f"{start_anon:.0f} -> {anon_mb(proxy.proc.pid):.0f} MB")
    finally:
        proxy.stop()


def wait_archived(archive: Path, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sqlite3.connect(archive) as db:
            if db.execute("select count(*) from exchanges").fetchone()[0] >= count:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{archive}: fewer than {count} exchanges after {timeout:.0f} s")


def direct_recall(archive: Path, words: list[str]) -> list[float]:
    """The search alone, as bench/recall.py measures it (the proxy has stopped writing by now)."""
    from proxy.reader import ArchiveReader
    from proxy.session import tenant_of

    reader = ArchiveReader(archive)
    tenant = tenant_of({"authorization": "Bearer sk-big"})
    latencies = []
    for i in range(80):
        t0 = time.perf_counter()
        reader.recall(tenant, "big-1", "default", words[i % len(words)])
        latencies.append((time.perf_counter() - t0) * 1000)
    reader.close()
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller counts, for a smoke run")
    parser.add_argument("--only", choices=SECTIONS, action="append", help="run only these sections")
    parser.add_argument("--sessions", type=int, nargs=2, metavar=("N", "TURNS"),
                        help="the long-sessions figure with N sessions of TURNS turns")
    args = parser.parse_args()
    global SESSIONS_OVERRIDE
    SESSIONS_OVERRIDE = tuple(args.sessions) if args.sessions else None
    with tempfile.TemporaryDirectory(prefix="ctxproxy-faults-") as tmp:
        workdir = Path(tmp)
        fake = start_fake(workdir)
        print(f"## ctxproxy faults ({'quick' if args.quick else 'full'} run)\n")
        try:
            for name in args.only or SECTIONS:
                run_section(name, workdir, fake, args.quick)
        finally:
            fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
