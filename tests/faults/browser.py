"""A real browser on a page behind a login: headless Chromium, driven through its DevTools
protocol over a pipe (`--remote-debugging-pipe`: no port, no extra package), answering the
server's HTTP login challenge as a person answers the browser's login prompt."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _Pipe:
    """Chromium's end of the protocol: JSON messages, each ended by a NUL byte."""

    def __init__(self, to_browser: int, from_browser: int) -> None:
        self.to_browser, self.from_browser = to_browser, from_browser
        self.buffer = b""
        self.next_id = 0

    def send(self, method: str, session: str | None = None, **params: object) -> int:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        return self.next_id

    def messages(self, seconds: float) -> Iterator[dict]:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if not select.select([self.from_browser], [], [], 0.2)[0]:
                continue
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium exited")
            self.buffer += chunk
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                yield json.loads(raw)


DOM = "document.documentElement.outerHTML"


def page_after_login(
    url: str,
    user: str,
    password: str,
    showing: tuple[str, ...],
    timeout_s: float = 60,
    expression: str = DOM,
) -> str:
    """The page's DOM once it shows every text of `showing` (else at `timeout_s`), opened
    without the login in its address: Chromium is challenged and answers with `user` and
    `password`, then keeps them for the page's own requests, as after a login prompt.
    `expression`: what is read of the page instead of its DOM (a JavaScript string)."""
    exe = chromium()
    assert exe is not None, "no Chromium"
    to_r, to_w = os.pipe()  # the browser reads its commands on fd 3
    from_r, from_w = os.pipe()  # and writes its answers on fd 4

    def fds() -> None:
        os.dup2(to_r, 3)
        os.dup2(from_w, 4)

    # its helper processes may still write the profile as it ends: its cleanup is lenient
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1600,1000",
             f"--user-data-dir={profile}",
             "--remote-debugging-pipe", "about:blank"],
            pass_fds=(3, 4), preexec_fn=fds, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_r)
        os.close(from_w)
        pipe = _Pipe(to_w, from_r)
        session: str | None = None
        login = {"response": "ProvideCredentials", "username": user, "password": password}

        def handle(message: dict) -> None:
            method, params = message.get("method"), message.get("params", {})
            if method == "Fetch.requestPaused":
                pipe.send("Fetch.continueRequest", session, requestId=params["requestId"])
            elif method == "Fetch.authRequired":
                pipe.send(
                    "Fetch.continueWithAuth", session,
                    requestId=params["requestId"], authChallengeResponse=login,
                )  # fmt: skip

        def call(method: str, **params: object) -> dict:
            sent = pipe.send(method, session, **params)
            for message in pipe.messages(30):
                handle(message)
                if message.get("id") == sent:
                    assert "error" not in message, message
                    return message["result"]
            raise TimeoutError(method)

        try:
            target = call("Target.createTarget", url="about:blank")["targetId"]
            session = call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            call("Fetch.enable", handleAuthRequests=True)
            call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout_s
            while True:
                got = call("Runtime.evaluate", expression=expression)
                dom = got["result"].get("value", "")
                if all(text in dom for text in showing) or time.monotonic() > deadline:
                    return dom
                for message in pipe.messages(0.5):
                    handle(message)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the browser and its helper processes
            proc.wait()
            os.close(to_w)
            os.close(from_r)
