"""A scripted OpenAI-compatible chat-completions server on loopback, for the judge tests.

It speaks just enough of the protocol for the real ``openai`` client: ``POST
/v1/chat/completions`` answered with a ``chat.completion`` object, or an error status with
an OpenAI-style error body. What to answer is decided per request by a *responder*,
``responder(request) -> Reply | str``, where ``request`` carries the parsed body, the user
message, the Authorization header and ``attempt`` (how many earlier requests carried the
same messages), so scripts like "429 first, then 500, then the answer" hold whatever the
client's concurrency.

Safety: binds 127.0.0.1 on an ephemeral port, serves from a daemon thread, answers at most
``max_requests`` requests (then 400s that the client does not retry), and shuts itself down
after ``lifetime`` seconds even if a test forgets to. Every request is logged (``log``), with
whether a 200 answer was actually sent, which is what "paid for" means in the tests.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


@dataclass
class Reply:
    content: str | None = None  # the assistant message for a 200
    status: int = 200
    delay: float = 0.0  # seconds before answering (past the client's timeout = a timeout)
    headers: dict = field(default_factory=dict)
    message: str = "scripted error"  # error text for non-200 replies
    hold: bool = False  # wait until release() (or the lifetime ends), then answer 503


@dataclass
class Request:
    body: dict
    user: str  # the user message (the rendered judge prompt)
    key: str  # hash of the messages: the identity of one judgement
    attempt: int
    authorization: str


class JudgeServer:
    def __init__(self, responder: Callable[[Request], Reply | str], *, max_requests: int = 400, lifetime: float = 90.0):
        self.responder = responder
        self.max_requests = max_requests
        self.log: list[dict] = []
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}
        self._release = threading.Event()
        self._closed = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                server._handle(self, body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True
        self._lifetime = lifetime

    # lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> "JudgeServer":
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._release.set()
        self._timer.cancel()
        self._httpd.shutdown()
        self._httpd.server_close()

    def release(self) -> None:
        """Let held requests go (they get a 503)."""
        self._release.set()

    # views of the log ------------------------------------------------------------------
    def answered(self) -> list[dict]:
        with self._lock:
            return [r for r in self.log if r["answered"]]

    def held(self) -> list[dict]:
        with self._lock:
            return [r for r in self.log if r["held"]]

    # one request -----------------------------------------------------------------------
    def _handle(self, handler: BaseHTTPRequestHandler, body: dict) -> None:
        messages = body.get("messages") or []
        user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
        key = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:16]
        with self._lock:
            attempt = self._seen.get(key, 0)
            self._seen[key] = attempt + 1
            entry = {
                "key": key, "attempt": attempt, "time": time.time(), "status": None, "answered": False, "held": False,
                "authorization": handler.headers.get("Authorization", ""), "model": body.get("model"), "user": user,
            }  # fmt: skip
            self.log.append(entry)
            over = len(self.log) > self.max_requests
        if over:
            reply = Reply(status=400, message="test server: request budget exhausted")
        else:
            reply = self.responder(Request(body, user, key, attempt, entry["authorization"]))
            reply = Reply(content=reply) if isinstance(reply, str) else reply
        if reply.hold:
            with self._lock:
                entry["held"] = True
            self._release.wait(self._lifetime)
            reply = Reply(status=503, message="released")
        if reply.delay:
            time.sleep(reply.delay)
        entry["status"] = reply.status
        try:
            if reply.status == 200:
                payload = {
                    "id": f"chatcmpl-{key}-{attempt}", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "test"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": len(user.split()), "completion_tokens": 1, "total_tokens": len(user.split()) + 1},
                }  # fmt: skip
            else:
                payload = {"error": {"message": reply.message, "type": "test_error", "code": str(reply.status)}}
            data = json.dumps(payload).encode()
            handler.send_response(reply.status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            for name, value in reply.headers.items():
                handler.send_header(name, str(value))
            handler.end_headers()
            handler.wfile.write(data)
            handler.wfile.flush()
            if reply.status == 200:
                with self._lock:
                    entry["answered"] = not reply.delay or not self._client_gone(handler)
        except (BrokenPipeError, ConnectionResetError):
            pass

    @staticmethod
    def _client_gone(handler: BaseHTTPRequestHandler) -> bool:
        """After a delayed answer: did the client hang up (timed out) before it arrived?"""
        import select

        sock = handler.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return False
            return sock.recv(1, 0x2) == b""  # MSG_PEEK: EOF means the client closed
        except OSError:
            return True
