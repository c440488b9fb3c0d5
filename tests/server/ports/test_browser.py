"""A real headless Chromium (Debian's ``chromium``) through the preview gateway, driven over the
DevTools protocol: the page a server in the sandbox serves loads through its preview URL with the
token given once (``?token=``, then the HttpOnly cookie: the address bar keeps no token and the
page's script cannot read it), its stylesheet and script load through the cookie, a WebSocket on
the same origin echoes 1,000 messages in order, and a screenshot shows what the page's canvas
drew. Without the token the browser gets the 401 page.

The browser reaches nothing but loopback: every other address goes to a proxy on a closed
loopback port, and its background services are off.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.server.conftest import Harness, ServerFactory
from tests.server.helpers import until
from tests.server.ports import png
from tests.server.ports.test_preview import PREVIEW, _site

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's chromium (scripts/bootstrap.sh installs it)"
)

PAGE = {
    "index.html": "<!doctype html><html><head><link rel=stylesheet href=style.css>"
    "<script src=app.js></script></head><body><canvas id=c width=64 height=64></canvas></body></html>",
    "style.css": "body { background: rgb(10, 20, 30); margin: 0 }",
    "app.js": """
window.onload = () => {
  const ctx = document.getElementById('c').getContext('2d');
  ctx.fillStyle = 'rgb(0, 128, 255)';
  ctx.fillRect(0, 0, 64, 64);
  const ws = new WebSocket(`ws://${location.host}/ws`);
  const got = [];
  ws.onopen = () => { for (let i = 0; i < 1000; i++) ws.send('m' + i); };
  ws.onmessage = (e) => {
    got.push(e.data);
    if (got.length === 1000) {
      const ordered = got.every((m, i) => m === 'm' + i);
      document.title = 'done ' + (ordered ? 'in-order' : 'out-of-order') + ' '
        + getComputedStyle(document.body).backgroundColor;
    }
  };
  ws.onerror = () => { document.title = 'websocket failed'; };
};
""",
}


class Browser:
    """One page of a headless Chromium, over its DevTools WebSocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        await self._ws.send_json({"id": msg_id, "method": method, "params": params})
        while True:
            message = json.loads(await self._ws.receive_str())
            if message.get("id") == msg_id:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    assert CHROMIUM is not None
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
        f"--user-data-dir={tmp_path / 'chromium'}", "--no-first-run", "--no-default-browser-check",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-default-apps", "--disable-domain-reliability", "--no-pings",
        "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<local>;*.localhost;127.0.0.1",
        "--window-size=320,240", "about:blank",
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        endpoint = ""
        async with asyncio.timeout(60):
            while not endpoint:
                line = (await proc.stderr.readline()).decode()
                assert line, "chromium exited before its DevTools endpoint was up"
                if line.startswith("DevTools listening on "):
                    endpoint = line.split()[-1]
        port = endpoint.split("/")[2].split(":")[1]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                pages = [t for t in await response.json() if t["type"] == "page"]
            async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=64 << 20) as ws:
                yield Browser(ws)
    finally:
        proc.kill()
        await proc.wait()


async def _title(browser: Browser, prefix: str) -> str:
    title = ""

    async def titled() -> bool:
        nonlocal title
        title = await browser.evaluate("document.title") or ""
        return title.startswith(prefix)

    await until(titled, f"a page title starting with {prefix!r}", timeout=60, interval=0.1)
    return title


async def test_a_page_with_its_assets_and_a_websocket_through_the_preview(
    make_server: ServerFactory, browser: Browser
) -> None:
    harness: Harness = await make_server(**PREVIEW)
    client, sid, port = await _site(harness)
    root = harness.tmp / "ws-alpha" / "site"
    for name, text in PAGE.items():
        (root / name).write_text(text)
    opened = await client.open_port(sid, port)

    await browser.call("Page.navigate", url=opened.url)  # no token: the 401 page
    assert await _title(browser, "401") == "401 Token needed"

    await browser.call("Page.navigate", url=f"{opened.url}index.html?token={opened.token}")
    assert await _title(browser, "done") == "done in-order rgb(10, 20, 30)"
    assert await browser.evaluate("location.href") == f"{opened.url}index.html"  # the token is gone
    assert await browser.evaluate("document.cookie") == ""  # HttpOnly: not the page's to read
    shot = await browser.call(
        "Page.captureScreenshot", format="png", clip={"x": 8, "y": 8, "width": 48, "height": 48, "scale": 1}
    )
    pixels = {p for row in png.decode(base64.b64decode(shot["data"])) for p in row}
    assert pixels == {(0, 128, 255)}, sorted(pixels)[:5]
