"""One ctxproxy process per data dir: an exclusive flock on `<data_dir>/ctxproxy.lock`, holding the pid
of the process that owns it, so a second one is refused with a ConfigError that names the holder."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from proxy.errors import ConfigError


class DataDirLock:
    """An exclusive flock on `<data_dir>/ctxproxy.lock`: one ctxproxy process per data dir."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = data_dir / "ctxproxy.lock"
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if not isinstance(exc, BlockingIOError):  # e.g. no locks on this file system
                os.close(self.fd)
                raise
            holder = os.pread(self.fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(self.fd)
            self.fd = None
            raise ConfigError(
                f"another ctxproxy process is using {data_dir} (pid {holder}); one process per data_dir: "
                "stop it, or give this one its own data_dir (replicas share one archive through "
                "archive.url: postgresql://..., each with its own data_dir)",
                code="data_dir_in_use") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    @staticmethod
    def check(data_dir: Path) -> None:
        """Raise the ConfigError now if another process holds `data_dir` (for a clean CLI message before
        the server starts; the writer takes the lock for real)."""
        DataDirLock(data_dir).release()

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
