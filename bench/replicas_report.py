"""bench/replicas.py's tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from report import sig3, table

# ------------------------------------------------------------------------------------ report

COMPONENTS = ("proxies", "postgres", "fake upstream", "load generator")


def print_report(result: dict[str, Any]) -> None:
    print(f"## ctxproxy replicas ({result['mode']}; python {result['python']}, {result['cpus']} cpus, "
          f"loopback, fake upstream, PostgreSQL {Path(result['postgres']).parent.name}; "
          f"{result['rounds']} round(s) interleaved; {result['wall_s']:.0f} s)\n")
    agent = result["agent"]
    print(f"agent: {', '.join(map(str, agent['sessions_per_batch']))} sessions a batch of "
          f"{agent['turns'][0]}-{agent['turns'][1]} turns, history growing ~3.7 KB a turn; small: "
          f"{result['small_requests_per_batch']} one-shot requests a batch. req/s: while every worker was "
          "busy; req/s all: every request over the whole batch.\n")
    rows = result["rows"]
    print(table(["scenario", "concurrency", "target", "requests", "req/s", "req/s all", "p50 ms", "p99 ms",
                 "errors"],
                [[r["scenario"], str(r["concurrency"]), r["target"], str(r["requests"]), sig3(r["rps"]),
                  sig3(r["rps_all"]), sig3(r["p50_ms"]), sig3(r["p99_ms"]), str(r["errors"])] for r in rows],
                left=3))
    print("\nCPU seconds per 1,000 requests (utime+stime from /proc, read when every process is quiet before "
          "and after the batch, so background work counts; the load generator during the batch only); "
          "ceiling = CPUs x 1,000 ÷ total, the req/s these costs allow on an otherwise idle machine:\n")
    print(table(["scenario", "concurrency", "target", *COMPONENTS, "total", "ceiling req/s"],
                [[r["scenario"], str(r["concurrency"]), r["target"],
                  *(sig3(r["cpu_per_1000"].get(c)) for c in COMPONENTS), sig3(r["cpu_per_1000_total"]),
                  sig3(r["ceiling_rps"])] for r in rows], left=3))
    print("\nWhere the CPUs went during the batches (cores: CPU seconds ÷ batch seconds; other = the "
          "machine's non-idle time from /proc/stat minus every process above: work not this benchmark's):\n")
    print(table(["scenario", "concurrency", "target", "proxies (each)", "postgres", "fake upstream",
                 "load generator", "other", "machine busy %", "waited for quiet s"],
                [[r["scenario"], str(r["concurrency"]), r["target"],
                  sig3(r["cores"].get("proxies")) + each(r["replica_cores"]),
                  *(sig3(r["cores"].get(c)) for c in COMPONENTS[1:]), sig3(r["other_cores"]),
                  sig3(r["busy_pct"]), sig3(r["quiet_wait_s"])] for r in rows], left=3))
    batches = result.get("batches") or []
    if batches:
        print(f"\nEvery batch in the order run (req/s while every worker was busy; a batch during which "
              f"other work used more than {result['max_other']} cores was run again, at most "
              f"{result['retries']} time(s); the least disturbed attempt is kept, in the tables above):\n")
        print(table(["round", "scenario", "concurrency", "target", "attempt", "req/s", "other cores", "kept"],
                    [[str(b["round"]), b["scenario"], str(b["concurrency"]), b["target"], str(b["attempt"]),
                      sig3(b["rps"]), sig3(b["other_cores"]), "yes" if b["kept"] else "no"] for b in batches],
                    left=4))
    failed = [(b, text, n) for b in batches for text, n in (b.get("failures") or {}).items()]
    if failed:
        print("\nFailed requests (every attempt):\n")
        for b, text, n in failed:
            print(f"- round {b['round']} {b['scenario']} c={b['concurrency']} {b['target']} attempt "
                  f"{b['attempt']}: {n} x {text}")
    print("\nArchive after a clean stop (SIGINT) — exchanges vs requests sent (warm-up included):\n")
    print(table(["target", "requests sent", "exchanges", "distinct ids", "equal", "exit codes"],
                [[a["target"], str(a["sent"]), str(a.get("exchanges", a.get("error"))),
                  str(a.get("distinct_ids", "-")), "yes" if a.get("equal") else "NO",
                  " ".join(map(str, a["exit_codes"]))] for a in result["archives"]]))
    kept = [b for b in batches if b["kept"]]
    decided: dict[str, dict[str, int]] = {}
    for b in kept:
        into = decided.setdefault(b["target"], {})
        for action, n in (b.get("actions") or {}).items():
            into[action] = into.get(action, 0) + n
    print("\nWhat the default policy did in the kept batches (ctxproxy_actions from /metrics, replicas "
          "summed; the kept batches of every target carry the same bodies) and ctxproxy_added_seconds' "
          "mean over the whole run (handler time outside the upstream call):\n")
    for archive in result["archives"]:
        actions = ", ".join(f"{k} {v}" for k, v in sorted(decided.get(archive["target"], {}).items())) or "-"
        added = (archive.get("metrics") or {}).get("added_mean_ms")
        print(f"- {archive['target']}: {actions}; added mean {sig3(added)} ms")
    same = len({orjson.dumps(d, option=orjson.OPT_SORT_KEYS) for d in decided.values()}) <= 1
    print(f"\nThe same decisions on every target for the same requests: {'yes' if same else 'NO'}")
    for archive in result["archives"]:
        database = archive.get("database")
        if database:
            print(f"PostgreSQL database of {archive['target']} (pg_stat_database, whole run): "
                  + ", ".join(f"{k} {v}" for k, v in database.items()))
    print(f"\nctxproxy source: {result['ctxproxy_src']}; archive.pool_size {result['pool_size']}")


def each(values: list[float]) -> str:
    return " (" + " / ".join(sig3(v) for v in values) + ")" if len(values) > 1 else ""
