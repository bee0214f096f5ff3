"""The stamps and ids every exchange is given: the time text is datetime's own, whatever the instant and
in whatever order instants come; ids are 32 hex digits, never repeated, not even by a forked child."""

from __future__ import annotations

import os
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from proxy.archive_items import new_id, stamp, utc_now

INSTANTS = st.integers(min_value=0, max_value=4_102_444_800 * 10**9)  # up to 2100


def _by_datetime(ns: int) -> str:
    moment = datetime.fromtimestamp(ns // 10**9, UTC).replace(microsecond=ns // 1000 % 10**6)
    return moment.isoformat(timespec="milliseconds")


@given(st.lists(INSTANTS, min_size=1, max_size=20))
def test_a_stamp_is_what_datetime_writes(instants):
    # (several instants in a row: the second formatted last must never leak into the next one)
    for ns in [*instants, *(ns + 999_999_999 for ns in instants)]:
        assert stamp(ns) == _by_datetime(ns)


def test_utc_now_is_now():
    before = datetime.now(UTC).replace(microsecond=0)
    now = datetime.fromisoformat(utc_now())
    assert before <= now <= datetime.now(UTC)


def test_ids_are_32_hex_digits_never_repeated():
    ids = [new_id() for _ in range(3000)]  # (several batches)
    assert len(set(ids)) == len(ids)
    assert all(len(found) == 32 and int(found, 16) >= 0 for found in ids)


def test_a_forked_child_never_hands_out_the_parents_ids():
    new_id()  # a batch under way in the parent
    reading, writing = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        os.write(writing, "".join(new_id() for _ in range(300)).encode())
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading) as pipe:
        text = pipe.read()
    os.waitpid(child, 0)
    theirs = {text[at:at + 32] for at in range(0, len(text), 32)}
    ours = {new_id() for _ in range(300)}
    assert len(theirs) == 300 and not theirs & ours
