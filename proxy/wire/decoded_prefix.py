"""A resent history decoded past what is new.

A codec whose neutral messages are not its native ones (Anthropic Messages, OpenAI Responses) decodes every
native message of every request. Most of a resent history's native messages are the earlier body's very
objects (wire/resent.py), and each one's neutral messages are the same objects as last time
(wire/neutral_cache.py), but finding them message by message is still a walk over the whole history in Python
on every request (~3 µs a message). What the earlier body decoded to is kept beside its spans
(wire/splice.py); a body that shares its first `shared` messages takes their neutral messages and origins as
slices (copied in C) and decodes only the rest.

What a prefix holds is counted in the resent bodies' budget with its body: its lists, and what each neutral
message and its origin hold besides the native messages' own objects (counted with the body), measured once,
when it is decoded, and carried with it.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from typing import Any

from proxy.held_memory import held_beyond, reachable_ids
from proxy.wire import Message
from proxy.wire.splice import Spans


@dataclass(frozen=True)
class DecodedPrefix:
    start: int  # the first native message decoded (before it: the provider's, after a compaction)
    neutral: list[Message]  # what the native messages from `start` on decoded to, in order
    origins: list[Any]  # each neutral message's origin (the codec's), in the same order
    # ends[k]: how many of `neutral` come from native messages 0..k alone (a neutral message made of a run
    # of natives that k does not close is not counted); resume[k]: where decoding goes on when 0..k are
    # shared (None: always at k + 1; else at the start of the run still open at k)
    ends: list[int]
    resume: list[int] | None
    # held[i]: what the first i + 1 neutral messages and their origins hold (see above), a running total
    held: list[int] = field(compare=False, repr=False)

    @property
    def held_bytes(self) -> int:
        lists = (self.neutral, self.origins, self.ends, self.held) + ((self.resume,) if self.resume else ())
        return sum(map(sys.getsizeof, lists)) + (self.held[-1] if self.held else 0)

    def taken(self, shared: int) -> tuple[int, list[Message], list[Any], list[int], list[int] | None]:
        """For a body sharing the first `shared` natives: where its decoding goes on, the neutral messages
        and origins before that, and `ends` and `resume` up to there."""
        go_on = shared if self.resume is None else self.resume[shared - 1]
        end = self.ends[shared - 1]
        return (go_on, self.neutral[:end], self.origins[:end], self.ends[:go_on],
                None if self.resume is None else self.resume[:go_on])


def decoded_prefix(start: int, neutral: list[Message], origins: list[Any], ends: list[int],
                   resume: list[int] | None, earlier: tuple[DecodedPrefix, int] | None,
                   natives: list[Any]) -> DecodedPrefix:
    """A body's prefix, made of what it took from `earlier` (None: nothing) and the messages it decoded
    after that from `natives`: only those are measured."""
    taken = earlier[0].ends[earlier[1] - 1] if earlier is not None else 0
    held = earlier[0].held[:taken] if earlier is not None else []
    base = held[-1] if held else 0
    # (each message with its origin, counted as a tuple of the message and the origin's fields: about the
    # size of its slots, and what they hold)
    made = [(message, *map(origin.__getattribute__, origin.__slots__))
            for message, origin in zip(neutral[taken:], origins[taken:], strict=True)]
    held.extend(base + total for total in itertools.accumulate(held_beyond(made, reachable_ids(natives))))
    return DecodedPrefix(start, neutral, origins, ends, resume, held)


def earlier_prefix(spans: Spans | None) -> tuple[DecodedPrefix, int] | None:
    """The earlier body's decoded prefix and how many of its native messages this body shares, when
    there is one to take (a codec still checks that decoding starts where it did then)."""
    earlier = spans.derived_before() if spans is not None else None
    if earlier is None or not isinstance(earlier[0], DecodedPrefix):
        return None
    prefix, shared = earlier
    if not 0 < shared <= len(prefix.ends) or prefix.start >= shared:
        return None
    return prefix, shared
