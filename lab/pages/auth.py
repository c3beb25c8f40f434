"""The page's guard: only the lab's own page drives the lab, failed logins are throttled per client and per user, and
every request that can change something, or hold a connection open, needs the login.

`Guard` is an ASGI middleware put in front of everything else the page's app runs (`app.launch`). Always, with or
without a login (`--auth-file`), it refuses with HTTP 403

- a request whose Host is not one of the lab's names (`--allowed-hosts`; localhost names and `--host`'s by default),
  so a page of another site that rebinds its DNS name to 127.0.0.1 reaches nothing;
- a request that carries another site's Origin (a cross-origin fetch, its CORS preflight included), or that another
  site's page sent (`Sec-Fetch-Site` cross-site or same-site) other than a plain navigation to a page;
- a request that can change something (any method but GET and HEAD) that carries neither the lab's own Origin nor
  `Sec-Fetch-Site: same-origin`: a browser always sends one of them, so a script that drives the lab says
  `Origin: http://<host>:<port>` as the page does.

Under a login it also

- reads the login form exactly as the login check does: a second `username` or `password` field is refused (400);
- answers a login that comes while its client address or its user name is held back with HTTP 429 and "too many
  attempts, try again in N s", without checking the password; after `FREE_FAILURES` failed logins an address or a
  user waits `BASE_WAIT_S`, then twice as long after each further failure, up to `MAX_WAIT_S`; a good login clears
  its own user's count only (an address that guesses at others stays held back). The address is the TCP peer's;
  `X-Forwarded-For` is believed only from the proxies named by `--forwarded-allow-ips` (none by default);
- refuses, with HTTP 401, every request but a GET or HEAD that carries no login, the login itself excepted, and
  the GETs that hold a connection open (heartbeats, event streams);
- logs out by POST only (`GET /logout` answers 405);
- caps the connections one client address holds open at once (`MAX_OPEN_PER_CLIENT`; HTTP 429 past it).

Cookies the app sets are `SameSite=Lax`: a request another site starts never carries the login.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

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
LOGOUT_PATHS = ("/logout", "/logout/")
READ_ONLY = ("GET", "HEAD")
MAX_LOGIN_BODY = 64 * 1024
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
ANY_ADDRESS = ("0.0.0.0", "::", "")
# GETs that hold their connection open: Gradio's heartbeats and event streams.
HELD_OPEN = re.compile(r"^/gradio_api/(heartbeat/|queue/data|stream/)")
MAX_OPEN_PER_CLIENT = 64  # connections one address holds open at once (a page holds 2 or 3; many tabs, a few more)


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


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names the lab answers to: localhost's, the bound address (and, bound to every address, this
    machine's name and addresses), and `extra` (`--allowed-hosts`; `*` answers to any)."""
    names = set(LOCAL_HOSTS) | {h.strip().lower().strip("[]") for h in extra if h.strip()}
    if bind in ANY_ADDRESS:
        host = socket.gethostname()
        names |= {host.lower(), socket.getfqdn().lower()}
        with contextlib.suppress(OSError):  # a name that does not resolve adds no address
            names |= {str(info[4][0]).lower() for info in socket.getaddrinfo(host, None)}
    else:
        names.add(bind.lower().strip("[]"))
    return frozenset(names)


def host_name(authority: str) -> str:
    """The host of a Host header or an Origin's `host:port`, lower case, without port or IPv6 brackets."""
    netloc = urlsplit(f"//{authority}").hostname if authority else None
    return (netloc or "").lower()


class Guard:
    """The ASGI middleware of the module docstring, in front of a Gradio app (which it finds in the request's
    scope: its `auth`, `tokens` and `cookie_id`)."""

    def __init__(self, app: Callable[..., Awaitable[None]], hosts: frozenset[str] = LOCAL_HOSTS,
                 throttle: Throttle | None = None):
        self.app = app
        self.hosts = hosts
        self.throttle = throttle or Throttle()
        self.open: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        if (refused := self._refusal(scope, headers)) is not None:
            return await _answer(send, 403, {"detail": refused})
        send = _lax_cookies(send)
        gradio = scope.get("app")
        if scope["type"] != "http" or getattr(gradio, "auth", None) is None:
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        if path in LOGIN_PATHS and method == "POST":
            return await self._login(scope, receive, send)
        if path in LOGOUT_PATHS:
            if method != "POST":
                return await _answer(send, 405, {"detail": "log out with POST"}, {"allow": "POST"})
            scope = {**scope, "method": "GET"}  # Gradio's own logout route, reached only this way
        logged_in = _logged_in(gradio, scope)
        if not logged_in and (method not in READ_ONLY or HELD_OPEN.match(path)):
            return await _answer(send, 401, {"detail": {"error": "Not authenticated"}})
        if not HELD_OPEN.match(path):
            return await self.app(scope, receive, send)
        client = _client(scope)
        if self.open[client] >= MAX_OPEN_PER_CLIENT:
            return await _answer(send, 429, {"detail": f"{MAX_OPEN_PER_CLIENT} connections held open already"})
        self.open[client] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.open[client] -= 1
            if not self.open[client]:
                del self.open[client]

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> str | None:
        """Why the request is refused whatever its login (None: it is not)."""
        host = host_name(headers.get("host", ""))
        if "*" not in self.hosts and host not in self.hosts:
            return f"this lab does not answer to the host {host[:100]!r} (envlab serve --allowed-hosts names more)"
        origin, site = headers.get("origin"), headers.get("sec-fetch-site")
        if origin is not None and urlsplit(origin).netloc.lower() != headers.get("host", "").lower():
            return "a request from another site's page is refused"
        if site in ("cross-site", "same-site") and headers.get("sec-fetch-mode") != "navigate":
            return "a request from another site's page is refused"
        changes = scope["type"] == "websocket" or scope["method"] not in READ_ONLY
        if changes and origin is None and site != "same-origin":
            return ("a request that can change something must come from the lab's own page: send the header "
                    "Origin: http://<host>:<port>")
        return None

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, more = b"", True
        while more and len(body) <= MAX_LOGIN_BODY:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if len(body) > MAX_LOGIN_BODY:
            return await _answer(send, 413, {"detail": "the login form is too large"})
        form = parse_qsl(body.decode("latin-1"), keep_blank_values=True)
        fields = Counter(name for name, _ in form)
        if twice := sorted(name for name in ("username", "password") if fields[name] > 1):
            self.throttle.failed([f"addr:{_client(scope)}"])  # a form no page sends: a guesser's, counted
            return await _answer(send, 400, {"detail": f"the login form has {fields[twice[0]]} {twice[0]!r} "
                                                       "fields: send one of each"})
        user = dict(form).get("username", "").strip()
        user_key = f"user:{user}"
        keys = [f"addr:{_client(scope)}", user_key]
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
                    self.throttle.succeeded([user_key])
                elif 400 <= message["status"] < 500:
                    self.throttle.failed(keys)
            await send(message)

        await self.app(scope, replay, watch)


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (the first of repeated ones)."""
    out: dict[str, str] = {}
    for name, value in scope.get("headers", []):
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def _client(scope: Scope) -> str:
    return str((scope.get("client") or ("?",))[0])


def _lax_cookies(send: Send) -> Send:
    """`send` with every cookie the app sets made `SameSite=Lax` (Gradio sets its login cookie `SameSite=none`)."""
    async def lax(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [(k, _lax(v) if k.lower() == b"set-cookie" else v)
                                  for k, v in message.get("headers", [])]
        await send(message)

    return lax


def _lax(cookie: bytes) -> bytes:
    parts = [p for p in cookie.split(b";") if not p.strip().lower().startswith(b"samesite")]
    return b";".join([*parts, b" SameSite=Lax"])


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
    # A refusal closes its connection: a client refused many times over holds nothing open on the server.
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
           (b"connection", b"close"),
           *((k.encode(), v.encode()) for k, v in (headers or {}).items())]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})
