"""Headless Chromium driven over the DevTools protocol, for what ``--dump-dom`` cannot do:
type into the page, click, choose an option, wait for a condition, and read the page's own
timings in real time (``--dump-dom`` runs on virtual time, where ``performance.now()`` says
nothing about how long drawing took).

Chromium listens on a loopback port it picks itself (``--remote-debugging-port=0``, read
back from ``DevToolsActivePort`` in its profile); one page is attached in flat session mode.
Every wait is bounded."""

from __future__ import annotations

import base64
import itertools
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.ui.browser import BASE_FLAGS, TIMEOUT_S, chromium, fresh_profile

__all__ = ["Page", "browser"]

# One protocol call (a navigation, a screenshot of a tall page) on two busy cores.
_CALL_TIMEOUT_S = 30.0


class Page:
    """One browser tab. Methods raise AssertionError with the page's message when a script
    throws or a wait runs out."""

    def __init__(self, socket: ClientConnection, session: str) -> None:
        self._socket = socket
        self._session = session
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One protocol command; its result (events arriving meanwhile are dropped)."""
        call_id = next(self._ids)
        message: dict[str, Any] = {"id": call_id, "method": method, "params": params}
        if self._session:  # a page's session; none for the browser itself
            message["sessionId"] = self._session
        self._socket.send(orjson.dumps(message).decode())
        deadline = time.monotonic() + _CALL_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no answer to {method} within {_CALL_TIMEOUT_S} s"
            answer = orjson.loads(self._socket.recv(timeout=left))
            if answer.get("id") != call_id:
                continue
            assert "error" not in answer, f"{method} failed: {answer['error']}"
            return dict(answer.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        """The expression's value (a JSON-able one), promises awaited."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        details = result.get("exceptionDetails")
        assert details is None, f"{expression!r} threw: {details}"
        return result["result"].get("value")

    def wait_for(self, expression: str, *, within_s: float = 10.0) -> Any:
        """Poll until ``expression`` is truthy; its value."""
        deadline = time.monotonic() + within_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"{expression!r} not true within {within_s} s"
            time.sleep(0.02)

    def goto(self, url: str) -> None:
        """Navigate and wait until the document and its deferred script have run."""
        self.call("Page.navigate", url=url)
        # The navigation entry names the URL loaded, even once the page rewrites its own.
        self.wait_for(
            "document.readyState === 'complete' && "
            f"performance.getEntriesByType('navigation')[0]?.name === {_js(url)}"
        )

    def type(self, selector: str, text: str) -> None:
        """Focus the element and insert ``text`` as typed (one ``input`` event)."""
        self._focus(selector)
        self.call("Input.insertText", text=text)

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element, scrolled into view first."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({_js(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return {x: r.left + r.width / 2, y: r.top + r.height / 2}; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box["x"],
                y=box["y"],
                button="left",
                clickCount=1,
            )

    def choose(self, selector: str, value: str) -> None:
        """Pick an option of a ``<select>`` as the keyboard would: the value, then ``change``."""
        self._focus(selector)
        self.evaluate(
            f"(() => {{ const e = document.querySelector({_js(selector)}); e.value = {_js(value)};"
            " e.dispatchEvent(new Event('change', {bubbles: true})); })()"
        )

    def screenshot(self, path: Path, *, width: int, height: int) -> bytes:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(data)
        return data

    def _focus(self, selector: str) -> None:
        found = self.evaluate(
            f"(() => {{ const e = document.querySelector({_js(selector)});"
            " if (!e) return false; e.focus(); return document.activeElement === e; })()"
        )
        assert found, f"no focusable element {selector}"


def _js(value: str) -> str:
    return orjson.dumps(value).decode()


@contextmanager
def browser(workdir: Path) -> Iterator[Page]:
    """Headless Chromium with a fresh profile under ``workdir`` and one blank page; closed,
    with all its processes, on exit."""
    profile, env = fresh_profile(workdir)
    command = [
        chromium(),
        *BASE_FLAGS,
        f"--user-data-dir={profile}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",
        "about:blank",
    ]
    log = (workdir / "chromium.log").open("wb")
    # Its own session, so that the whole process group (renderers, helpers) goes at the end.
    process = subprocess.Popen(command, stdout=log, stderr=log, env=env, start_new_session=True)
    try:
        port, path = _devtools_address(profile, process)
        with connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=10) as socket:
            root = Page(socket, "")
            target = root.call("Target.createTarget", url="about:blank")["targetId"]
            session = root.call("Target.attachToTarget", targetId=target, flatten=True)
            yield Page(socket, session["sessionId"])
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=TIMEOUT_S)
        log.close()


def _devtools_address(profile: Path, process: subprocess.Popen[bytes]) -> tuple[int, str]:
    """The port and browser endpoint Chromium writes once it listens."""
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"chromium exited with {process.returncode} before listening")
        lines = active.read_text().splitlines() if active.is_file() else []
        if len(lines) >= 2:
            return int(lines[0]), lines[1]
        time.sleep(0.05)
    pytest.fail(f"chromium did not open its DevTools port within {TIMEOUT_S} s")
