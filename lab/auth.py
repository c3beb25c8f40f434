"""The page's login, kept: failed logins are throttled per client address and per user, and every request that
can change something needs the login, whichever of Gradio's routes it goes to.

`Guard` is an ASGI middleware the page's app is built with (`app.launch` passes it in Gradio's `app_kwargs`).
Under `--auth` it

- answers a login (`POST /login`) that comes while its address or its user name is held back with HTTP 429
  and "too many attempts, try again in N s", without checking the password; after `FREE_FAILURES` failed
  logins an address or a user waits `BASE_WAIT_S`, then twice as long after each further failure, up to
  `MAX_WAIT_S`; a good login clears its address and user;
- refuses, with HTTP 401, every request but a GET or HEAD that carries no login (Gradio's own `/cancel`,
  `/reset` and `/stream/...` take none), the login itself excepted.

The address is the TCP peer's: behind a proxy every user shares the proxy's (each user name is still held back
on its own).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

FREE_FAILURES = 5  # failed logins before any wait (typing mistakes)
BASE_WAIT_S = 1.0  # the first wait; it doubles with each failure after it
MAX_WAIT_S = 15 * 60.0
FORGET_S = 24 * 3600.0  # failures this old no longer count
MAX_KEYS = 100_000  # addresses and users remembered at most (the oldest go first)
LOGIN_PATHS = ("/login", "/login/")
READ_ONLY = ("GET", "HEAD", "OPTIONS")
MAX_LOGIN_BODY = 64 * 1024


@dataclass
class _Record:
    failures: int = 0
    until: float = 0.0  # held back until this time (time.monotonic)
    last: float = 0.0


@dataclass
class Throttle:
    """Failed logins per key (`addr:<address>`, `user:<name>`), and how long each key is held back."""

    clock: Callable[[], float] = time.monotonic
    records: dict[str, _Record] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def wait_after(failures: int) -> float:
        """Seconds a key is held back after its `failures`-th failed login in a row."""
        if failures < FREE_FAILURES:
            return 0.0
        return min(BASE_WAIT_S * 2 ** (failures - FREE_FAILURES), MAX_WAIT_S)

    def held(self, keys: list[str]) -> float:
        """Seconds until every one of `keys` may try again (0: now)."""
        now = self.clock()
        with self.lock:
            return max([0.0, *(r.until - now for k in keys if (r := self.records.get(k)) is not None)])

    def failed(self, keys: list[str]) -> None:
        now = self.clock()
        with self.lock:
            for key in keys:
                record = self.records.pop(key, None) or _Record()
                if now - record.last > FORGET_S:
                    record = _Record()
                record.failures += 1
                record.last = now
                record.until = now + self.wait_after(record.failures)
                self.records[key] = record  # the most recent last: the oldest are forgotten first
            while len(self.records) > MAX_KEYS:
                self.records.pop(next(iter(self.records)))

    def succeeded(self, keys: list[str]) -> None:
        with self.lock:
            for key in keys:
                self.records.pop(key, None)


def too_many(seconds: float) -> str:
    return f"too many attempts, try again in {max(1, math.ceil(seconds))} s"


class Guard:
    """The ASGI middleware of the module docstring, in front of a Gradio app (which it finds in the request's
    scope: its `auth`, `tokens` and `cookie_id`)."""

    def __init__(self, app: Callable[..., Awaitable[None]], throttle: Throttle | None = None):
        self.app = app
        self.throttle = throttle or Throttle()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gradio = scope.get("app")
        if scope["type"] != "http" or getattr(gradio, "auth", None) is None:
            return await self.app(scope, receive, send)
        if scope["path"] in LOGIN_PATHS and scope["method"] == "POST":
            return await self._login(scope, receive, send)
        if scope["method"] not in READ_ONLY and not _logged_in(gradio, scope):
            return await _answer(send, 401, {"detail": {"error": "Not authenticated"}})
        return await self.app(scope, receive, send)

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, more = b"", True
        while more and len(body) <= MAX_LOGIN_BODY:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if len(body) > MAX_LOGIN_BODY:
            return await _answer(send, 413, {"detail": "the login form is too large"})
        user = (parse_qs(body.decode("latin-1")).get("username") or [""])[0].strip()
        keys = [f"addr:{(scope.get('client') or ('?',))[0]}", f"user:{user}"]
        if (wait := self.throttle.held(keys)) > 0:
            return await _answer(send, 429, {"detail": too_many(wait)}, {"retry-after": str(math.ceil(wait))})
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()  # a disconnect, if anything
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                if message["status"] == 200:
                    self.throttle.succeeded(keys)
                elif 400 <= message["status"] < 500:
                    self.throttle.failed(keys)
            await send(message)

        await self.app(scope, replay, watch)


def _logged_in(gradio: Any, scope: Scope) -> bool:
    cookies = {}
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, val = part.strip().partition("=")
                cookies[key] = val
    tokens = getattr(gradio, "tokens", {})
    cookie_id = getattr(gradio, "cookie_id", "")
    return any(cookies.get(f"{kind}-{cookie_id}") in tokens for kind in ("access-token", "access-token-unsecure"))


async def _answer(send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
           *((k.encode(), v.encode()) for k, v in (headers or {}).items())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})
