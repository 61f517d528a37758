"""A minimal client of the Chrome DevTools Protocol over ``--remote-debugging-pipe``, for the tests only.

Headless Chromium reads protocol messages from file descriptor 3 and writes its answers to file
descriptor 4, each message one JSON object ended by a NUL byte: no port, no websocket library.
Enough of the protocol for the documentation tests: open a page, wait for its load event, evaluate
JavaScript (awaiting promises) and take a screenshot of a region.
"""

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time

#: Flags that work in a container as root, without a display or a GPU. Every request to another host
#: goes to a closed local port and fails, so a page must render offline (loopback bypasses the proxy).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--proxy-server=127.0.0.1:9",
)


def find_chromium():
    """The Chromium executable on the PATH, or ``None``."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class ProtocolError(RuntimeError):
    """Chromium answered a command with an error, or JavaScript threw."""


class Chromium:
    """A headless Chromium with one page, driven through the DevTools pipe.

    :param executable: the Chromium binary.
    :param profile: a fresh, empty directory for the browser profile.
    :param width, height: the size of the window (CSS pixels).
    """

    def __init__(self, executable, profile, width=1200, height=1600, timeout=60.0):
        self.timeout = timeout
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()

        def pipes_as_3_and_4():
            # In the child, before exec: copies above 9 first (so that neither end is already 3 or
            # 4), then dup2, which makes 3 and 4 inheritable; every other descriptor of ours is not.
            read_end = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
            write_end = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        args = [executable, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]
        self.process = subprocess.Popen(
            [*args, "--remote-debugging-pipe", "about:blank"],
            preexec_fn=pipes_as_3_and_4,
            close_fds=False,  # close_fds would close 3 and 4 after preexec_fn; non-inheritable ones close anyway
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._out, self._in = to_browser_w, from_browser_r
        self._buffer = b""
        self._last_id = 0
        self._events = []
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            self.send("Page.enable", session=self.session)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ protocol
    def _message(self, deadline):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            if select.select([self._in], [], [], left)[0]:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise ProtocolError(f"Chromium closed the pipe (exit code {self.process.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, params=None, session=None, timeout=None):
        """Send one command and return its result (events that arrive meanwhile are kept)."""
        self._last_id += 1
        message = {"id": self._last_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            answer = self._message(deadline)
            if answer.get("id") == self._last_id:
                if "error" in answer:
                    raise ProtocolError(f"{method}: {answer['error']}")
                return answer["result"]
            self._events.append(answer)

    def wait_for(self, event, timeout=None):
        """Wait for the next ``event`` (e.g. ``"Page.loadEventFired"``) and return its parameters."""
        for k, seen in enumerate(self._events):
            if seen.get("method") == event:
                return self._events.pop(k).get("params", {})
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            message = self._message(deadline)
            if message.get("method") == event:
                return message.get("params", {})
            self._events.append(message)

    # ------------------------------------------------------------------ page
    def open(self, url):
        """Load ``url`` in the page and wait for its load event."""
        self._events = [e for e in self._events if e.get("method") != "Page.loadEventFired"]
        self.send("Page.navigate", {"url": url}, session=self.session)
        self.wait_for("Page.loadEventFired")

    def emulate(self, width, height, mobile=True):
        """Lay pages out as a phone's screen of ``width`` x ``height`` CSS pixels (a window cannot be made
        narrower than about 500 pixels); takes effect on the next :meth:`open`."""
        params = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}
        self.send("Emulation.setDeviceMetricsOverride", params, session=self.session)

    def evaluate(self, expression):
        """The JSON-serialisable value of a JavaScript expression; a promise is awaited."""
        params = {"expression": expression, "awaitPromise": True, "returnByValue": True}
        answer = self.send("Runtime.evaluate", params, session=self.session)
        if "exceptionDetails" in answer:
            raise ProtocolError(json.dumps(answer["exceptionDetails"])[:2000])
        return answer["result"].get("value")

    def screenshot(self, x, y, width, height):
        """PNG bytes of the region of the page (CSS pixels from the top left of the document)."""
        clip = {"x": x, "y": y, "width": width, "height": height, "scale": 1}
        params = {"format": "png", "clip": clip, "captureBeyondViewport": True}
        return base64.b64decode(self.send("Page.captureScreenshot", params, session=self.session)["data"])

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except (ProtocolError, TimeoutError, OSError):
            self.process.kill()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
