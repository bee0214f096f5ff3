"""The archive's spool: append-only, checksummed files in `<data_dir>/spool/` that hold every submitted
item from `submit` until it is committed, so nothing acknowledged is lost (kill -9 included): segments,
records set aside because they could not be written (`rejected-*`), records that came after close
(`late-*`), and the replay of whatever an earlier run left there."""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

log = logging.getLogger("ctxproxy.archive")

SEGMENT_BYTES = 64 * 1024 * 1024  # a spool segment is closed (and deleted once committed) past this,
# or past twice its bases (below) when they hold more, up to SEGMENT_CAP_BYTES
SEGMENT_CAP_BYTES = 512 * 1024 * 1024
# The current segment is emptied once all of it is committed and it holds more than this (and at least
# twice its bases, below): until then its committed records stay, as the base later records of their
# sessions are spooled relative to (spool_delta.py), behind a marker saying how many are committed.
TRUNCATE_BYTES = 8 * 1024 * 1024
_MARK = struct.Struct("<BQ")  # a marker payload: 0 (no archive item starts so), records committed

_FRAME = struct.Struct("<4sQI")  # magic, payload length, crc32
_MAGIC = b"CXS1"


class CorruptSpool(Exception):
    pass


def frame(payload: bytes) -> bytes:
    return _FRAME.pack(_MAGIC, len(payload), zlib.crc32(payload))


def read_frames(path: Path) -> Iterator[bytes]:
    """The payloads of a spool file. A frame cut short at the end (a write the process died in, never
    acknowledged) ends the file; anything else that does not check out raises CorruptSpool."""
    with open(path, "rb") as f:
        while True:
            head = f.read(_FRAME.size)
            if len(head) < _FRAME.size:
                return
            magic, length, crc = _FRAME.unpack(head)
            if magic != _MAGIC:
                raise CorruptSpool(f"{path}: bad frame at offset {f.tell() - _FRAME.size}")
            payload = f.read(length)
            if len(payload) < length:
                return
            if zlib.crc32(payload) != crc:
                raise CorruptSpool(f"{path}: checksum mismatch at offset {f.tell() - length - _FRAME.size}")
            yield payload


def write_all(fd: int, parts: list[bytes]) -> None:
    written, total = os.writev(fd, parts), sum(len(p) for p in parts)
    if written < total:  # short write (rare on regular files): finish the rest
        rest = b"".join(parts)[written:]
        while rest:
            rest = rest[os.write(fd, rest):]


def open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)


def append_framed(path: Path, payload: bytes) -> None:
    """One framed payload appended to its own spool file (a record submitted after close)."""
    fd = open_append(path)
    try:
        write_all(fd, [frame(payload), payload])
    finally:
        os.close(fd)


class Spool:
    """Append-only segment files `<data_dir>/spool/NNNNNNNNNNNN.log` holding every submitted item until
    it is committed: a segment is truncated (current) or deleted (older) once all its items are.
    Not thread-safe: the writer calls it under its own lock."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder = folder
        self.leftovers = spool_files(folder)
        numbers = [int(p.stem) for p in self.leftovers if p.stem.isdigit()]
        self.segment = max(numbers, default=0) + 1
        self.fd: int | None = open_append(self._path(self.segment))
        self.size = 0
        self.records = 0  # records appended to the current segment since it was started or emptied
        self.epoch = 0  # bumped whenever the current segment starts afresh (rotated or emptied)
        # Bytes of the whole records in this epoch that the sessions' bases go back to (kept by
        # spool_delta.Bases). Emptying or rotating the segment makes each of those sessions spool its
        # history whole again, so it waits until at least as many other bytes were written: several
        # long sessions whose histories together pass the size would otherwise be emptied out again
        # right after, every turn spooled whole.
        self.base_bytes = 0
        self.pending: Counter[int] = Counter({self.segment: 0})
        self.done: Counter[int] = Counter()  # records committed, by segment
        self._set_aside: int | None = None  # rejected-*.log of this run, opened on first use

    def _path(self, segment: int) -> Path:
        return self.folder / f"{segment:012d}.log"

    def append(self, payload: bytes) -> int:
        if self.fd is None:
            raise OSError("spool is closed")
        if self.size >= self._rotate_at():
            self._rotate()
        write_all(self.fd, [frame(payload), payload])
        self.size += _FRAME.size + len(payload)
        self.pending[self.segment] += 1
        self.records += 1
        return self.segment

    @property
    def full(self) -> bool:
        """The next append starts a new segment (and a new epoch)."""
        return self.fd is not None and self.size >= self._rotate_at()

    def _rotate_at(self) -> int:
        return max(SEGMENT_BYTES, min(2 * self.base_bytes, SEGMENT_CAP_BYTES))

    def rotate_if_full(self) -> None:
        if self.full:
            self._rotate()

    def _rotate(self) -> None:
        assert self.fd is not None
        os.close(self.fd)
        if self.pending[self.segment] == 0:
            self._unlink(self.segment)
        self.segment += 1
        self.fd = open_append(self._path(self.segment))
        self.size = self.records = self.base_bytes = 0
        self.epoch += 1
        self.pending[self.segment] = 0

    def set_aside(self, payload: bytes) -> None:
        """Keep a record that could not be written in `rejected-*.log`, replayed first at the next start."""
        if self._set_aside is None:
            self._set_aside = open_append(self.folder / f"rejected-{time.time_ns()}.log")
        write_all(self._set_aside, [frame(payload), payload])

    def committed(self, segments: Iterable[int | None]) -> None:
        """Records committed (in the order they were appended): a segment whose records are all
        committed goes (the current one once past TRUNCATE_BYTES); else it is marked with how many are."""
        touched: set[int] = set()
        for segment in segments:
            if segment is not None:
                self.pending[segment] -= 1
                self.done[segment] += 1
                touched.add(segment)
        for segment in [s for s, n in self.pending.items() if n <= 0]:
            if segment != self.segment:
                self._unlink(segment)
                touched.discard(segment)
            elif self.size >= max(TRUNCATE_BYTES, 2 * self.base_bytes) and self.fd is not None:
                os.ftruncate(self.fd, 0)  # O_APPEND: the next item goes to offset 0
                self.size = self.records = self.done[segment] = self.base_bytes = 0
                self.epoch += 1
                touched.discard(segment)
        for segment in touched:  # replay skips what a marker says is committed (it is only a base)
            mark = _MARK.pack(0, self.done[segment])
            if segment == self.segment and self.fd is not None:
                write_all(self.fd, [frame(mark), mark])
                self.size += _FRAME.size + len(mark)
            else:
                append_framed(self._path(segment), mark)

    def _unlink(self, segment: int) -> None:
        self.pending.pop(segment, None)
        self.done.pop(segment, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(segment).unlink()

    def close(self) -> None:
        if self._set_aside is not None:
            os.close(self._set_aside)
            self._set_aside = None
        if self.fd is None:
            return
        os.close(self.fd)
        self.fd = None
        if all(n <= 0 for n in self.pending.values()):
            self._unlink(self.segment)


def spool_files(folder: Path) -> list[Path]:
    """Leftover spool files in replay order: set-aside records first, then segments, then late ones."""
    order = {"rejected": 0, "late": 2}
    found = [p for p in folder.glob("*.log") if p.is_file()]
    return sorted(found, key=lambda p: (order.get(p.stem.split("-")[0], 1), p.name))


def replay_file(path: Path, commit: Callable[[list[bytes]], None], *, batch_items: int,
                batch_bytes: int, prepare: Callable[[bytes], bytes] | None = None) -> int:
    """Hand the payloads of a leftover spool file to `commit`, in batches of at most `batch_items` (or
    about `batch_bytes`), then delete the file. Records a marker says were committed are only shown to
    `prepare` (which turns each record into what `commit` takes: a record spooled relative to an
    earlier one made whole). A corrupt file is kept as `*.corrupt` once what could be read before the
    damage is committed. Returns how many payloads were committed."""
    records, committed, damage = _records(path)
    batch: list[bytes] = []
    size = count = 0
    for index, payload in enumerate(records):
        whole = prepare(payload) if prepare is not None else payload
        if index < committed:
            continue
        batch.append(whole)
        size += len(whole)
        count += 1
        if len(batch) >= batch_items or size >= batch_bytes:
            commit(batch)
            batch, size = [], 0
    commit(batch)
    if damage is not None:
        kept = path.with_suffix(".corrupt")
        log.error("archive: %s; the file is kept as %s", damage, kept)
        path.rename(kept)
    else:
        path.unlink()
    return count


def _records(path: Path) -> tuple[list[bytes], int, Exception | None]:
    """A spool file's records, how many of them (from the start) its last marker says are committed,
    and the damage that stopped the reading, if any (the file is read whole first: at most a segment)."""
    records: list[bytes] = []
    committed = 0
    try:
        for payload in read_frames(path):
            if payload[:1] == b"\x00" and len(payload) == _MARK.size:
                committed = _MARK.unpack(payload)[1]
            else:
                records.append(payload)
    except (CorruptSpool, OSError) as exc:
        return records, committed, exc
    return records, committed, None
