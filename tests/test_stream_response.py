"""StreamedResponse: the body from the request's task, the client's leaving watched by one plain task."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.background import BackgroundTask
from starlette.types import Message

from proxy.stream_response import StreamedResponse

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


class Client:
    """An ASGI server's side: what was sent, and a disconnect the test releases."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.leave = asyncio.Event()
        self.complete = asyncio.Event()

    async def receive(self) -> Message:
        # As uvicorn: waits until the client leaves or the response is complete, then says disconnect.
        leaving = asyncio.ensure_future(self.leave.wait())
        done = asyncio.ensure_future(self.complete.wait())
        try:
            await asyncio.wait((leaving, done), return_when=asyncio.FIRST_COMPLETED)
        finally:
            leaving.cancel()
            done.cancel()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete.set()

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def test_a_whole_stream_is_sent_and_its_background_runs() -> None:
    ran: list[str] = []

    async def run() -> Client:
        client = Client()

        async def chunks() -> AsyncIterator[bytes]:
            for part in (b"a", b"b", b"c"):
                await asyncio.sleep(0)  # (each a turn of the loop: the watcher runs meanwhile)
                yield part
        response = StreamedResponse(chunks(), background=BackgroundTask(lambda: ran.append("background")))
        await response(SCOPE, client.receive, client.send)
        # A completed response reads as a disconnect to the watcher: nothing may be cancelled by it.
        await asyncio.sleep(0)
        assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
        return client

    client = asyncio.run(run())
    assert client.body() == b"abc" and client.sent[0]["type"] == "http.response.start"
    assert ran == ["background"]


def test_the_client_leaving_cancels_the_body_which_cleans_up_and_the_call_returns() -> None:
    seen: list[str] = []

    async def run() -> Client:
        client = Client()
        forever = asyncio.Event()

        async def chunks() -> AsyncIterator[bytes]:
            try:
                yield b"first"
                client.leave.set()  # the client goes while the body waits for the upstream
                await forever.wait()
                yield b"never"
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            finally:
                await asyncio.sleep(0)  # a cleanup that awaits (closing the upstream) still runs
                seen.append("cleaned up")
        # (a guard only: without the watcher the body would wait forever)
        await asyncio.wait_for(StreamedResponse(chunks())(SCOPE, client.receive, client.send), 30)
        seen.append("returned")
        assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
        return client

    client = asyncio.run(run())
    assert seen == ["cancelled", "cleaned up", "returned"]
    assert client.body() == b"first"


def test_a_cancel_from_elsewhere_goes_through() -> None:
    async def run() -> None:
        client = Client()
        started = asyncio.Event()

        async def chunks() -> AsyncIterator[bytes]:
            started.set()
            await asyncio.Event().wait()
            yield b""
        task = asyncio.ensure_future(StreamedResponse(chunks())(SCOPE, client.receive, client.send))
        await started.wait()
        task.cancel()  # e.g. the server shutting down: not the client's leaving
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
