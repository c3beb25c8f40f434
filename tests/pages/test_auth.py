"""The page under `--auth`, tried as a guesser and as someone without a login would (lab/pages/auth.py)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest
from fastapi.routing import APIRoute
from starlette.routing import Mount

from lab.pages.auth import BASE_WAIT_S, FREE_FAILURES, Throttle
from storage.db import make_engine
from tests.seeded import copy_database
from tests.servers import free_port

USERS = [("alice", "secret"), ("bob", "hunter2")]


@pytest.fixture
def page(tmp_path, migrated_template):
    """The lab's page, served under `--auth` on a free port: (base URL, the Gradio Blocks)."""
    from lab.pages import web as app

    copy_database(migrated_template, tmp_path / "envlab.db")
    engine = make_engine(str(tmp_path / "envlab.db"))
    demo = app.build_demo(engine)
    port = free_port()
    app.launch(demo, "127.0.0.1", port, auth=USERS, block=False)
    yield f"http://127.0.0.1:{port}", demo
    demo.close()
    engine.dispose()


def post(url: str, data: bytes, opener=None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """A POST as the lab's own page sends it (with its Origin), unless `headers` says otherwise."""
    origin = "/".join(url.split("/")[:3])
    request = urllib.request.Request(url, data=data, headers={"Origin": origin, **(headers or {})})
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def login(base: str, user: str, password: str, opener=None) -> tuple[int, str]:
    return post(f"{base}/login", f"username={user}&password={password}".encode(), opener)


def test_thirty_wrong_passwords_are_held_back(page):
    """A guesser's 30 wrong passwords: the first `FREE_FAILURES` are checked (HTTP 400), every later one is
    answered "too many attempts, try again in N s" (HTTP 429) unchecked, the right password too; a wait that is
    kept lets one more guess through, and the next wait is twice as long. Another address is held back for
    the same user, and the user's own login works again once the wait is over."""
    base, _ = page
    answers = []
    started = time.perf_counter()
    for i in range(30):
        answers.append(login(base, "alice", f"guess-{i}"))
    took = time.perf_counter() - started
    assert [status for status, _ in answers] == [400] * FREE_FAILURES + [429] * (30 - FREE_FAILURES)
    held = [json.loads(body)["detail"] for _, body in answers[FREE_FAILURES:]]
    assert all(re.fullmatch(r"too many attempts, try again in 1 s", h) for h in held), held
    assert login(base, "alice", "secret")[0] == 429  # the right password waits like any other
    time.sleep(BASE_WAIT_S + 0.1)
    assert login(base, "alice", "guess-30")[0] == 400  # one more guess after the wait...
    status, body = login(base, "alice", "guess-31")
    assert (status, json.loads(body)["detail"]) == (429, "too many attempts, try again in 2 s")  # ...then twice as long
    # a guesser that kept every wait would wait 4 hours for 30 guesses (1 + 2 + ... + 512 s, then 15 min each)
    waits = sum(Throttle.wait_after(n) for n in range(FREE_FAILURES, 30))
    assert waits == 1023 + 15 * 900
    # the user is held back from any address (::1 is another client address than 127.0.0.1)
    assert login(base.replace("127.0.0.1", "localhost"), "alice", "x")[0] in (429,)
    print(f"\n30 wrong logins answered in {took:.2f} s: {FREE_FAILURES} checked, {30 - FREE_FAILURES} held back; "
          f"keeping every wait would take {waits / 3600:.0f} h")
    time.sleep(2.1)
    assert login(base, "alice", "secret")[0] == 200  # the wait over, the right password logs in


def test_failures_are_counted_per_address_across_users():
    throttle = Throttle(clock=lambda: 100.0)
    for user in ("alice", "bob", "carol", "dave", "erin"):
        throttle.failed(["addr:10.0.0.9", f"user:{user}"])
    assert throttle.held(["addr:10.0.0.9", "user:frank"]) == BASE_WAIT_S  # a new name from the same address
    assert throttle.held(["addr:10.0.0.8", "user:frank"]) == 0  # another address, another name
    throttle.succeeded(["addr:10.0.0.9", "user:frank"])
    assert throttle.held(["addr:10.0.0.9", "user:frank"]) == 0


def _flat(routes: list) -> list:
    """The app's routes, those of an included router (Gradio's `/gradio_api/...`) among them."""
    out = []
    for route in routes:
        inner = getattr(route, "original_router", None)
        out.extend(_flat(inner.routes) if inner is not None else [route])
    return out


def _path(route) -> str:
    return re.sub(r"\{[^}]*\}", "x", route.path)


def test_every_route_that_changes_state_asks_for_the_login(page):
    """Every route of the running app that takes a request which can change something (any method but GET,
    HEAD and OPTIONS), but the login itself, answers 401 without a login; the same request with a login is
    not refused for want of one."""
    base, demo = page
    routes = []
    for route in _flat(demo.app.routes):
        if isinstance(route, Mount) or not getattr(route, "methods", None):
            continue
        for method in sorted(route.methods - {"GET", "HEAD", "OPTIONS"}):
            if route.path not in ("/login", "/login/"):
                routes.append((method, _path(route)))
    assert ("POST", "/gradio_api/cancel") in routes and ("POST", "/gradio_api/reset") in routes
    assert ("POST", "/gradio_api/stream/x") in routes and len(routes) > 20
    refused = {}
    for method, path in routes:
        request = urllib.request.Request(f"{base}{path}", data=b"{}", method=method,
                                         headers={"Content-Type": "application/json", "Origin": base})
        try:
            urllib.request.urlopen(request, timeout=30)
            refused[(method, path)] = 200
        except urllib.error.HTTPError as err:
            refused[(method, path)] = err.code
    assert {k: v for k, v in refused.items() if v != 401} == {}
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    assert login(base, "bob", "hunter2", opener)[0] == 200
    status, _ = post(f"{base}/gradio_api/reset", json.dumps({"event_id": "x"}).encode(), opener,
                     {"Content-Type": "application/json"})
    assert status == 200
    assert all(isinstance(r, APIRoute | Mount) for r in _flat(demo.app.routes))


def _request(url: str, method: str = "GET", headers: dict[str, str] | None = None,
             data: bytes | None = None) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def test_no_second_field_no_forwarded_address_and_no_other_user_walks_around_the_throttle(page):
    """The three ways around the throttle a tester found: a decoy `username` before the real one, a new
    `X-Forwarded-For` per guess (believed from the loopback before), and a good login of one's own account
    clearing the address's count."""
    base, _ = page
    status, body = post(f"{base}/login", b"username=decoy&username=alice&password=guess")
    assert (status, json.loads(body)["detail"]) == (400, "the login form has 2 'username' fields: send one of each")
    answers = [post(f"{base}/login", f"username=decoy{i}&password=guess-{i}".encode(),
                    headers={"X-Forwarded-For": f"10.1.{i}.9"})[0] for i in range(1, 12)]
    # the refused form counted as the address's first failure: 4 more are checked, then the address waits
    assert answers == [400] * (FREE_FAILURES - 1) + [429] * (12 - FREE_FAILURES)


def test_a_good_login_clears_its_own_user_only():
    throttle = Throttle(clock=lambda: 100.0)
    for i in range(FREE_FAILURES - 1):
        throttle.failed(["addr:10.0.0.9", f"user:admin{i}"])
    throttle.succeeded(["user:bob"])  # what the guard clears when bob logs in from that address
    throttle.failed(["addr:10.0.0.9", "user:admin"])
    assert throttle.held(["addr:10.0.0.9", "user:carol"]) == BASE_WAIT_S


def test_only_the_labs_own_page_drives_it(page):
    """Another site's page: its preflight, its credentialed reads and writes, and a rebound DNS name are refused;
    a script that says the lab's Origin is not."""
    base, _ = page
    evil = {"Origin": "http://evil.example"}
    status, headers, _ = _request(f"{base}/config", "OPTIONS", {**evil, "Access-Control-Request-Method": "POST"})
    assert status == 403 and "access-control-allow-origin" not in {k.lower() for k in headers}
    assert _request(f"{base}/config", headers=evil)[0] == 403
    status, _, body = _request(f"{base}/gradio_api/queue/join", "POST", {**evil, "Content-Type": "application/json"},
                               b"{}")
    assert (status, json.loads(body)["detail"]) == (403, "a request from another site's page is refused")
    status, _, body = _request(f"{base}/gradio_api/queue/join", "POST", {"Content-Type": "application/json"}, b"{}")
    assert status == 403 and "Origin: http://<host>:<port>" in json.loads(body)["detail"]
    assert _request(f"{base}/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"})[0] == 403
    assert _request(f"{base}/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"})[0] == 200
    status, _, body = _request(f"{base}/", headers={"Host": "rebound.evil.example:7860"})
    assert (status, json.loads(body)["detail"]) == (
        403, "this lab does not answer to the host 'rebound.evil.example' (envlab serve --allowed-hosts names more)")
    assert _request(f"{base}/", headers={"Host": "localhost"})[0] == 200


def test_the_login_cookie_is_lax_and_logout_is_a_post(page):
    base, demo = page
    jar = urllib.request.HTTPCookieProcessor()
    opener = urllib.request.build_opener(jar)
    response = opener.open(urllib.request.Request(f"{base}/login", data=b"username=bob&password=hunter2",
                                                  headers={"Origin": base}), timeout=30)
    cookies = response.headers.get_all("set-cookie")
    assert len(cookies) == 2 and all(c.endswith("SameSite=Lax") and "samesite=none" not in c.lower()
                                     for c in cookies)
    assert len(demo.server_app.tokens) == 1
    try:
        opener.open(urllib.request.Request(f"{base}/logout"), timeout=30)
        raise AssertionError("GET /logout answered")
    except urllib.error.HTTPError as err:
        assert (err.code, json.loads(err.read())["detail"]) == (405, "log out with POST")
    assert len(demo.server_app.tokens) == 1
    opener.open(urllib.request.Request(f"{base}/logout", data=b"", headers={"Origin": base}), timeout=30)
    assert demo.server_app.tokens == {}


def test_connections_held_open_need_the_login_and_are_capped_per_client(page, monkeypatch):
    import lab.pages.auth

    base, _ = page
    status, _, _ = _request(f"{base}/gradio_api/heartbeat/anything")
    assert status == 401
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    assert login(base, "alice", "secret", opener)[0] == 200
    monkeypatch.setattr(lab.pages.auth, "MAX_OPEN_PER_CLIENT", 2)
    held = [opener.open(f"{base}/gradio_api/heartbeat/s{i}", timeout=30) for i in range(2)]
    try:
        opener.open(f"{base}/gradio_api/heartbeat/s3", timeout=30)
        raise AssertionError("a third connection was held open")
    except urllib.error.HTTPError as err:
        assert (err.code, json.loads(err.read())["detail"]) == (429, "2 connections held open already")
    finally:
        for response in held:
            response.close()
