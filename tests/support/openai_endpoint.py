"""A stand-in OpenAI-compatible endpoint: ``python tests/support/openai_endpoint.py SEED``.

It binds 127.0.0.1 on a free port, prints ``PORT <n>``, and answers
``POST /v1/chat/completions`` the way the travel desk's scripted model would
(same seed, same playbook), in the chat-completions wire format, with the
token count in ``usage``. A request without ``Authorization: Bearer test-key``
gets 401; a request asking for the model ``broken`` gets a 500. It prints one
line per request (``model``, the status) and exits when its stdin closes.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio

from examples.booking import travel
from examples.llm import ScriptedModel

KEY = "test-key"
MODEL = ScriptedModel(int(sys.argv[1]) if len(sys.argv) > 1 else 1, {"travel": travel})
_lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        reply: dict[str, object]
        if self.path != "/v1/chat/completions":
            status, reply = 404, {"error": {"message": "no such route"}}
        elif self.headers.get("Authorization") != f"Bearer {KEY}":
            status, reply = 401, {"error": {"message": "invalid api key"}}
        elif body.get("model") == "broken":
            status, reply = 500, {"error": {"message": "the model fell over"}}
        else:
            completion = anyio.run(MODEL.complete, body["messages"])
            status = 200
            reply = {
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": completion.text}}
                ],
                "usage": {"total_tokens": completion.tokens},
            }
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        with _lock:
            print(json.dumps({"model": body.get("model"), "status": status}), flush=True)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()  # until the test closes our stdin
    server.shutdown()


if __name__ == "__main__":
    main()
