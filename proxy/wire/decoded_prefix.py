"""A resent history decoded past what is new.

A codec whose neutral messages are not its native ones (Anthropic Messages) decodes every native message
of every request. Most of a resent history's native messages are the earlier body's very objects
(wire/resent.py), and each one's neutral messages are the same objects as last time (wire/neutral_cache.py),
but finding them message by message is still a walk over the whole history in Python on every request
(~3 µs a message). What the earlier body decoded to is kept beside its spans (wire/splice.py); a body that
shares its first `shared` messages takes their neutral messages and origins as slices (copied in C) and
decodes only the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    resume: list[int] | None = None

    def taken(self, shared: int) -> tuple[int, list[Message], list[Any], list[int], list[int] | None]:
        """For a body sharing the first `shared` natives: where its decoding goes on, the neutral messages
        and origins before that, and `ends` and `resume` up to there."""
        go_on = shared if self.resume is None else self.resume[shared - 1]
        end = self.ends[shared - 1]
        return (go_on, self.neutral[:end], self.origins[:end], self.ends[:go_on],
                None if self.resume is None else self.resume[:go_on])


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
