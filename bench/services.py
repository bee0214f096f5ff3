"""Subprocesses for the overhead benchmark: the fake upstream, the bare forwarder, ctxproxy, LiteLLM's proxy.

Each runs in its own process (own GIL) on a loopback port, logs to a file in the work dir, and is
stopped by its pid only.
"""

from __future__ import annotations

import compileall
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BIN = Path(sys.executable).parent  # the venv's bin/ when run with the venv's python


class ServiceError(RuntimeError):
    """A service did not come up; the message carries the tail of its log."""


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    base: str  # http://127.0.0.1:<port>
    log: Path
    extra: dict[str, str] = field(default_factory=dict)
    spawned: float = field(default_factory=time.perf_counter)  # when its process was started (cold start)

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Signal our own process by pid, wait, and kill it only if it ignores the signal."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None,
           stdout: int | None = None, unset: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], Path]:
    log = workdir / f"{name}.log"
    handle = log.open("wb")
    full_env = {k: v for k, v in os.environ.items() if k not in unset}
    full_env.update({"PYTHONUNBUFFERED": "1", **(env or {})})
    proc = subprocess.Popen(argv, cwd=workdir, env=full_env, stdin=subprocess.DEVNULL,
                            stdout=stdout or handle, stderr=handle)
    handle.close()  # the child keeps its own copy of the descriptor
    return proc, log


def wait_ready(service: Service, path: str, timeout: float) -> None:
    """Poll GET `path` until 200; fail early (with the log) if the process dies; stop it on failure."""
    try:
        _poll(service, path, timeout)
    except BaseException:
        service.stop(signal.SIGKILL, timeout=10)
        raise


def _poll(service: Service, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if service.proc.poll() is not None:
                raise ServiceError(f"{service.name} exited with code {service.proc.returncode}:\n"
                                   f"{service.log_tail()}")
            try:
                if client.get(service.base + path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.02)  # fine-grained: the cold start is measured through this
    raise ServiceError(f"{service.name} not ready after {timeout:.0f}s:\n{service.log_tail()}")


def _start_reporting(name: str, script: str, args: list[str], workdir: Path) -> Service:
    """A bench script that binds port 0 itself and reports it on stdout (`PORT n`): no port race."""
    spawned = time.perf_counter()
    proc, log = _spawn(script.removesuffix(".py"), [sys.executable, str(HERE / script), *args, "--port", "0"],
                       workdir, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()  # blocks until "PORT n" or EOF
    if not line.startswith("PORT "):
        proc.kill()
        raise ServiceError(f"{name} did not report a port ({line!r}):\n{log.read_text()}")
    service = Service(name, proc, f"http://127.0.0.1:{int(line.split()[1])}", log, spawned=spawned)
    wait_ready(service, "/healthz", 20)
    return service


def start_fake(workdir: Path) -> Service:
    return _start_reporting("fake upstream", "fake_upstream.py", [], workdir)


def start_bare(workdir: Path, upstream: str) -> Service:
    """The floor: bench/bare_forwarder.py, a 40-line Starlette + httpx forwarder to `upstream`."""
    return _start_reporting("bare forwarder", "bare_forwarder.py", ["--upstream", upstream], workdir)


PASSTHROUGH_POLICY = {
    "tool_results": {"enabled": False},
    "budget": {"enabled": False},
    "window": {"enabled": False},
    "pinned": {"files": []},  # pinned has no `enabled`: no files means nothing pinned
    "summary": {"enabled": False},
    "working_memory": {"enabled": False},
    "folded": {"enabled": False},
}


def start_ctxproxy(workdir: Path, upstream: str, src: Path | None = None, *, name: str = "ctxproxy",
                   archive: dict[str, object] | None = None) -> Service:
    """`src`: a folder holding a `proxy/` package to run instead of the installed one (a snapshot).
    `name`: its config, log and data_dir are `<name>.yaml`, `<name>.log`, `<name>-data` (several proxies
    in one work dir); `archive`: the config's `archive` section (e.g. a PostgreSQL `url`), else SQLite."""
    policies = workdir / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "passthrough.yaml").write_text(yaml.safe_dump(PASSTHROUGH_POLICY))
    data_dir = workdir / f"{name}-data"
    config = workdir / f"{name}.yaml"
    # The Messages route's upstream, where the proxy has one (a --src snapshot may predate it).
    messages = "anthropic_base_url" in ((src or REPO) / "proxy" / "config.py").read_text()
    config.write_text(yaml.safe_dump({
        "server": {"log_level": "warning"},
        "upstream": {"base_url": f"{upstream}/v1", **({"anthropic_base_url": upstream} if messages else {})},
        "data_dir": str(data_dir),
        "policies_dir": str(policies),
        **({"archive": archive} if archive else {}),
    }))
    # Cached bytecode, as a user's start finds it (scripts/ctxproxy compiles the package when
    # PYTHONDONTWRITEBYTECODE keeps Python from writing it; the floor's packages come compiled by pip).
    compileall.compile_dir(str((src or REPO) / "proxy"), quiet=1)
    port = free_port()
    spawned = time.perf_counter()
    exe = BIN / "ctxproxy"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "proxy"]
    env = {"PYTHONPATH": str(src)} if src else None  # sys.path wins over the editable-install finder
    proc, log = _spawn(name, [*argv, "serve", "--config", str(config), "--port", str(port)], workdir, env=env)
    # The Responses route, where the proxy has one (it shares the chat route's upstream).
    responses = "/v1/responses" in ((src or REPO) / "proxy" / "app.py").read_text()
    service = Service(name, proc, f"http://127.0.0.1:{port}", log, spawned=spawned,
                      extra={"archive": str(data_dir / "archive.db"), "messages": "yes" if messages else "",
                             "responses": "yes" if responses else ""})
    wait_ready(service, "/healthz", 60)
    return service


# Everything LiteLLM would otherwise fetch from the internet at start, read from its bundled copies.
LITELLM_OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "True",
    "LITELLM_LOG": "WARNING",  # also sets uvicorn's level, so no per-request access log line
}


def start_litellm(workdir: Path, upstream: str) -> Service:
    """LiteLLM's proxy, no database; it refuses to start without a master key, so it gets a strong one."""
    config = workdir / "litellm.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "gpt-4o", "litellm_params": {
            "model": "openai/gpt-4o", "api_base": f"{upstream}/v1", "api_key": "dummy"}}],
        "litellm_settings": {"telemetry": False},
    }))
    key = "sk-" + secrets.token_hex(32)
    env = {**LITELLM_OFFLINE_ENV, "LITELLM_MASTER_KEY": key}
    port = free_port()
    exe = BIN / "litellm"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "litellm.proxy.proxy_cli"]
    proc, log = _spawn("litellm", [*argv, "--config", str(config), "--host", "127.0.0.1",
                                   "--port", str(port)], workdir, env=env,
                      unset=("DATABASE_URL", "DIRECT_URL", "REDIS_HOST", "REDIS_URL"))  # no DB, no cache
    service = Service("litellm", proc, f"http://127.0.0.1:{port}", log, extra={"key": key})
    wait_ready(service, "/health/liveliness", 120)
    return service
