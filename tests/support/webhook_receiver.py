"""A real HTTP receiver for webhook tests, run as a subprocess on a free 127.0.0.1 port.

``python -m tests.support.webhook_receiver LOG`` prints its port on stdout, then serves
until killed. Every request is appended to LOG (one JSON object a line: path, headers,
body, the status answered). What it answers depends on the path:

- ``/ok``: 200 at once;
- ``/fail/N``: 503 to the first N requests of that path, then 200;
- ``/slow/S``: 200 after S seconds (a slow receiver, within the sender's timeout);
- ``/late/N/S``: the first N requests answered after S seconds (later than the sender
  waits), then 200 at once;
- ``/hold``: 200 only once the file LOG + ``.release`` exists (a receiver that hangs);
- ``/flood``: 200, then a body of zeros without end, until the sender hangs up;
- ``/trickle``: 200 and a long Content-Length, then the body a byte at a time, ever;
- ``/trickle-head``: the status line and headers a byte at a time, ever.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_seen: dict[str, int] = {}
_lock = threading.Lock()


def main(log: Path) -> None:
    release = log.with_name(log.name + ".release")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return  # quiet: the LOG is the record

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = self.rfile.read(length)
            with _lock:
                n = _seen.get(self.path, 0) + 1
                _seen[self.path] = n
            if self._stream(self.path.strip("/")):
                return
            status = self._answer(n)
            entry = {
                "path": self.path,
                "n": n,
                "status": status,
                "headers": dict(self.headers.items()),
                "body": body.decode("utf-8"),
            }
            with _lock, log.open("a", encoding="utf-8") as out:
                out.write(json.dumps(entry) + "\n")
            try:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except OSError:
                pass  # the sender gave up on us (a late answer)

        def _stream(self, what: str) -> bool:
            """Answer a hostile path (flood, trickle) until the sender hangs up."""
            head = b"HTTP/1.0 200 OK\r\nContent-Length: 1000000\r\n\r\n"
            if what not in ("flood", "trickle", "trickle-head"):
                return False
            with _lock, log.open("a", encoding="utf-8") as out:
                out.write(json.dumps({"path": self.path, "status": 200}) + "\n")
            try:
                if what == "flood":
                    self.wfile.write(b"HTTP/1.0 200 OK\r\n\r\n")
                    while True:
                        self.wfile.write(bytes(65536))
                if what == "trickle":
                    self.wfile.write(head)
                    head = b"x" * 1_000_000
                for byte in head:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.05)
                while True:  # the trickle outlasts any head: never done sending
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass  # the sender hung up: what a bounded try does
            return True

        def _answer(self, n: int) -> int:
            parts = self.path.strip("/").split("/")
            match parts:
                case ["fail", count]:
                    return 503 if n <= int(count) else 200
                case ["slow", seconds]:
                    time.sleep(float(seconds))
                case ["late", count, seconds] if n <= int(count):
                    time.sleep(float(seconds))
                case ["hold"]:
                    while not release.exists():
                        time.sleep(0.01)
            return 200

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
