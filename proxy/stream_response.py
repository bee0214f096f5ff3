"""A streamed response that watches for the client leaving with one plain task (proxy/client_watch.py),
where Starlette's StreamingResponse runs an anyio task group per response."""

from __future__ import annotations

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from proxy.client_watch import client_watch


class StreamedResponse(StreamingResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        spec = tuple(map(int, scope.get("asgi", {}).get("spec_version", "2.0").split(".")))
        if scope["type"] != "http" or spec >= (2, 4):
            await super().__call__(scope, receive, send)  # (there `send` raises for a departed client)
            return
        with client_watch(receive) as watch:
            async def sending(message: Message) -> None:
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    watch.ended = True
                await send(message)

            await self.stream_response(sending)
        if self.background is not None:
            await self.background()
