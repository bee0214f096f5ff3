"""A seeded archive for the dashboard tests and screenshots: real requests through a real proxy.

Session `build-1` (policy w16k, gpt-4o) has a big tool result summarized, an internal round (the model
reads the original back with read_tool_result), then enough tool turns that old results are masked and
whole exchanges evicted into the auto-summary. Session `chat-2` (default policy, gpt-4o-mini) is a short
chat whose archived text holds markup.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from proxy.app import build_app
from proxy.config import load_config
from tests.conftest import RunningProxy, write_config
from tests.servers import FakeUpstream, ServerThread, Step

PRICING = {"gpt-4o": {"input": 2.5, "output": 10, "cache_read": 1.25},
           "gpt-4o-mini": {"input": 0.15, "output": 0.6, "cache_read": 0.075}}
WINDOW_POLICY = {"budget": {"max_input_tokens": 16000}, "window": {"max_tokens": 3000}}
FACT = "the staging deploy key is KX-7731-ALPHA"
MARKUP = "<script>document.title='pwned'</script><b>bold?</b>"
BIG = "\n".join([f"build step {i}: compiled src/module_{i}.c in {i * 3} ms" for i in range(300)]
                + [FACT, f"warning: odd output {MARKUP}"]
                + [f"link step {i}: ok" for i in range(100)])
PIN = "Build with make -j8. <img src=x onerror=alert(1)>"
SESSION, CHAT = "build-1", "chat-2"
KEY = "sk-ui-tenant-1"


def tool_turn(k: int) -> list[dict[str, Any]]:
    call = {"id": f"call_{k}", "type": "function",
            "function": {"name": "bash", "arguments": orjson.dumps({"cmd": f"make step{k}"}).decode()}}
    output = "\n".join(f"step {k} line {i}: compiled module_{i} ok" for i in range(30))
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{k}", "content": output},
            {"role": "assistant", "content": f"Step {k} done."},
            {"role": "user", "content": f"Continue with step {k + 1}."}]


def read_back(call_id: str) -> dict[str, Any]:
    return {"id": "int_read", "type": "function", "function": {
        "name": "read_tool_result", "arguments": orjson.dumps({"call_id": call_id}).decode()}}


@dataclass
class Seeded:
    proxy: RunningProxy
    summarized: str  # exchange id of the request whose big result was summarized (it has an internal round)
    evicting: str  # exchange id of a request that evicted exchanges
    masking: str  # exchange id of a request that forwarded a masked placeholder


def start_proxy(root: Path, upstream_url: str, extra: dict[str, Any] | None = None) -> RunningProxy:
    config_path = write_config(root, upstream_url, {"pricing": PRICING, **(extra or {})})
    (root / "policies" / "w16k.yaml").write_text(yaml.safe_dump(WINDOW_POLICY))
    config = load_config(config_path)
    server = ServerThread(build_app(config)).__enter__()
    return RunningProxy(server.url, server, config_path, config.data_dir, config.policies_dir,
                        config.archive.url)


def seed(proxy: RunningProxy, fake: FakeUpstream) -> Seeded:
    fake.reset()
    proxy.state.pins.add(proxy.state.policies.get("w16k"), PIN, name="conventions")
    client = proxy.client(api_key=KEY, base_url=f"{proxy.url}/p/w16k/v1")
    headers = {"x-ctxproxy-session": SESSION}
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a build agent."},
                                      {"role": "user", "content": "Build every module."}]
    client.chat.completions.create(model="gpt-4o", messages=messages, extra_headers=headers)
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": "call_big", "type": "function",
                      "function": {"name": "read_file", "arguments": '{"path": "build.log"}'}}]},
                 {"role": "tool", "tool_call_id": "call_big", "content": BIG}]
    fake.then(Step(tool_calls=[read_back("call_big")]), Step(content="The build log is long; all steps ok."))
    client.chat.completions.create(model="gpt-4o", messages=messages, extra_headers=headers)
    messages += [{"role": "assistant", "content": "The build log is long; all steps ok."},
                 {"role": "user", "content": "Now run every step."}]
    for k in range(36):
        messages += tool_turn(k)
        if k % 4 == 3:
            client.chat.completions.create(model="gpt-4o", messages=messages, extra_headers=headers)
    chat = proxy.client(api_key="sk-ui-tenant-2")
    talk = [{"role": "user", "content": f"Remember: build 4417 failed on arm64. {MARKUP}"}]
    for _ in range(2):
        answer = chat.chat.completions.create(model="gpt-4o-mini", messages=talk,
                                              extra_headers={"x-ctxproxy-session": CHAT})
        talk += [{"role": "assistant", "content": answer.choices[0].message.content},
                 {"role": "user", "content": "And what next?"}]
    proxy.flush()
    summarized = next(proxy.query("select id from exchanges where summaries > 0 and internal_rounds > 0"))
    evicting = next(proxy.query("select id from exchanges where evictions > 0 order by rowid"))
    reader = proxy.state.reader
    masking = next(row for row in proxy.query("select id, forwarded_leaf from exchanges order by rowid")
                   if any(str(m.get("content")).startswith("[summarized: call_id=")
                          for m in reader.chain(row["forwarded_leaf"])))
    return Seeded(proxy, summarized["id"], evicting["id"], masking["id"])
