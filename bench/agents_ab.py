"""Before and after on the agent sessions: a snapshot of ctxproxy, the checkout and the floor, interleaved.

Run: `python bench/agents_ab.py SNAPSHOT [--runs 4] [--shape claude|codex|chat] [--sessions 32]` with the
project's venv python, SNAPSHOT a folder holding an earlier `proxy/` package, e.g.
`mkdir /tmp/before && git archive HEAD~1 proxy | tar -x -C /tmp/before`.

Each run starts the three servers fresh (the fake upstream shared) and sends bench/claude_sessions.py's
sessions to all three in turn (bench/claude_sessions.measure), so a change in the machine's speed moves
them alike; one change's effect on CPU is a few per cent, well inside what one server measured after
another swings here. Printed per run: each server's CPU seconds, ctxproxy's ÷ the floor's, p50 ms.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import claude_sessions
from bench.services import Service, start_bare, start_ctxproxy, start_fake

NAMES = ("before", "after", "bare forwarder")


def one_run(snapshot: Path, shape: str, sessions: int) -> dict[str, dict[str, float]]:
    started: list[Service] = []
    with tempfile.TemporaryDirectory(prefix="ctxproxy-ab-") as tmp:
        workdir = Path(tmp)
        try:
            fake = start_fake(workdir)
            started.append(fake)
            found = claude_sessions.measure({
                "before": functools.partial(start_ctxproxy, workdir, fake.base, snapshot, name="before"),
                "after": functools.partial(start_ctxproxy, workdir, fake.base, name="after"),
                "bare forwarder": functools.partial(start_bare, workdir, fake.base)},
                started, sessions, shape=shape)
        finally:
            for service in reversed(started):
                service.stop(signal.SIGINT if service.name in ("before", "after") else signal.SIGTERM)
    for name in NAMES:
        if found[name]["errors"]:
            raise RuntimeError(f"{name}: {found[name]['errors']} errors, first: {found[name]['first_error']}")
    return {name: {"cpu_s": found[name]["cpu_s"], "p50_ms": found[name]["p50_ms"]} for name in NAMES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot", type=Path, help="a folder holding the earlier proxy/ package")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--shape", choices=("claude", "codex", "chat"), default="claude")
    parser.add_argument("--sessions", type=int, default=32)
    args = parser.parse_args()
    if not (args.snapshot / "proxy" / "__init__.py").is_file():
        parser.error(f"{args.snapshot} holds no proxy/ package")
    print("| run | before CPU s | after CPU s | floor CPU s | before ÷ floor | after ÷ floor | "
          "after ÷ before | p50 ms before / after / floor |\n|---:|---:|---:|---:|---:|---:|---:|---|")
    for run in range(1, args.runs + 1):
        found = one_run(args.snapshot.resolve(), args.shape, args.sessions)
        before, after, floor = (found[name]["cpu_s"] for name in NAMES)
        p50 = " / ".join(f"{found[name]['p50_ms']:.1f}" for name in NAMES)
        print(f"| {run} | {before:.2f} | {after:.2f} | {floor:.2f} | {before / floor:.2f} "
              f"| {after / floor:.2f} | {after / before:.3f} | {p50} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
