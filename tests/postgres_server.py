"""A throwaway PostgreSQL server for the tests: Debian's `postgresql` package (initdb/pg_ctl) run in a
temporary folder, reachable on a unix socket in that folder and, optionally, on 127.0.0.1:<free port> so
that other processes (proxy replicas) can connect too. fsync is off: the server is the tests' alone and
is thrown away (`stop`), so durability across a crash of the server itself is not what it is for.

As root (CI containers), initdb refuses to run, so initdb and pg_ctl run as the `postgres` user (which the
package creates) through `runuser`, in a folder owned by that user; otherwise they run directly.

    server = PostgresServer.start(tcp=True)
    url = server.create_database("t1")   # postgresql://ctx@/t1?host=/tmp/ctxpg-...&port=...
    server.url("t1", tcp=True)           # postgresql://ctx@127.0.0.1:<port>/t1
    server.stop()
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

USER = "ctx"  # the superuser initdb creates; trust authentication, no password
SETTINGS = """
# ctxproxy tests: a throwaway server
listen_addresses = '{listen}'
unix_socket_directories = '{socket_dir}'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
"""
INSTALL_HINT = ("install Debian's postgresql package: run ./scripts/test as root (it installs it) "
                "or `apt-get install -y postgresql`")
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class PostgresNotInstalled(RuntimeError):
    """No initdb/pg_ctl on PATH nor under /usr/lib/postgresql/*/bin (or, as root, no `postgres` user)."""


def find_bin_dir() -> Path:
    """The folder holding initdb and pg_ctl: the one on PATH, else the newest /usr/lib/postgresql/<v>/bin."""
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    versioned = [path for path in Path("/usr/lib/postgresql").glob("*/bin") if path.parent.name.isdigit()]
    candidates += sorted(versioned, key=lambda path: int(path.parent.name), reverse=True)
    for folder in candidates:
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            return folder
    raise PostgresNotInstalled(f"PostgreSQL is not installed (no initdb/pg_ctl on PATH nor under "
                               f"/usr/lib/postgresql/*/bin): {INSTALL_HINT}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PostgresServer:
    """One running server; `start` makes it, `stop` removes it and its folder."""

    def __init__(self, bin_dir: Path, folder: Path, port: int, tcp: bool, as_postgres: bool) -> None:
        self.bin_dir = bin_dir
        self.folder = folder  # holds data/, the server's log and its unix socket
        self.port = port      # TCP port when tcp, else only the number in the socket's file name
        self.tcp = tcp
        self.as_postgres = as_postgres
        self.started_in_s = 0.0

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    @classmethod
    def start(cls, tcp: bool = False, timeout_s: int = 60) -> PostgresServer:
        """initdb + pg_ctl start -w in a fresh temporary folder. Raises PostgresNotInstalled (before
        touching anything) when PostgreSQL is missing, RuntimeError with the server's log when it fails."""
        began = time.monotonic()
        bin_dir = find_bin_dir()
        as_postgres = os.geteuid() == 0
        if as_postgres:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresNotInstalled(f"running as root but there is no `postgres` user to run the "
                                           f"server as: {INSTALL_HINT}") from None
            if shutil.which("runuser") is None:
                raise PostgresNotInstalled("running as root but `runuser` (util-linux) is missing")
        # /tmp, not a deep pytest folder: a unix socket's path is limited to ~107 bytes.
        folder = Path(tempfile.mkdtemp(prefix="ctxpg-", dir="/tmp" if os.path.isdir("/tmp") else None))
        server = cls(bin_dir, folder, free_port() if tcp else 5432, tcp, as_postgres)
        try:
            if as_postgres:
                os.chown(folder, owner.pw_uid, owner.pw_gid)
            server._run("initdb", "-D", str(server.data), "-A", "trust", "-U", USER, "--no-sync",
                        "--encoding=UTF8", "--locale=C.UTF-8", timeout_s=timeout_s)
            with open(server.data / "postgresql.conf", "a") as conf:
                conf.write(SETTINGS.format(listen="127.0.0.1" if tcp else "", socket_dir=folder))
            for attempt in range(3):
                try:
                    server._pg_ctl_start(timeout_s)
                    break
                except RuntimeError:
                    # Another process may have taken the free port between the probe and the bind.
                    if not tcp or attempt == 2 or "already in use" not in server._log_text():
                        raise
                    server.port = free_port()
        except BaseException:
            server.stop()
            raise
        server.started_in_s = time.monotonic() - began
        return server

    def _pg_ctl_start(self, timeout_s: int) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", f"-p {self.port}",
                  "-w", "-t", str(timeout_s), "start", timeout_s=timeout_s + 10)

    def _run(self, program: str, *args: str, timeout_s: int) -> None:
        command = [str(self.bin_dir / program), *args]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        # The server's own output goes to its log (-l): pg_ctl's child never holds our pipes open.
        done = subprocess.run(command, cwd=self.folder, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr.strip() or done.stdout}"
                               f"\n--- {self.log} ---\n{self._log_text()}")

    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no log)"

    def url(self, dbname: str = "postgres", tcp: bool = False) -> str:
        """libpq URL of a database: over the unix socket, or over TCP (only when started with tcp)."""
        if tcp:
            if not self.tcp:
                raise ValueError("this server was started without tcp=True")
            return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"
        return f"postgresql://{USER}@/{dbname}?host={self.folder}&port={self.port}"

    def _admin(self, statement: str, name: str) -> None:
        import psycopg
        from psycopg import sql

        if not _NAME.fullmatch(name):
            raise ValueError(f"database name {name!r}: use [a-z_][a-z0-9_]*, at most 63 characters")
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(sql.SQL(statement).format(sql.Identifier(name)))

    def create_database(self, name: str) -> str:
        """A new, empty database; its URL over the unix socket (`url(name, tcp=True)` for TCP)."""
        self._admin("CREATE DATABASE {}", name)
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop it, closing the connections still open on it (a test's pool that was not closed)."""
        self._admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", name)

    def stop(self) -> None:
        """Stop the server at once (no checkpoint: the data is thrown away) and remove its folder."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout_s=60)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
