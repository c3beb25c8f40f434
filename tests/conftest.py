"""The tests' shared fixtures. Every storage test runs on a SQLite file and on a real PostgreSQL server.

The PostgreSQL server is a throwaway cluster started once per test session from Debian's
`postgresql` binaries (under /usr/lib/postgresql/*/bin), as the `postgres` user when the tests run
as root, with its data and unix socket in a temporary folder and TCP on 127.0.0.1 at a free port.
Each test gets a fresh database. Without the binaries the PostgreSQL tests skip, unless
ENVLAB_REQUIRE_POSTGRES=1 (CI sets it), which makes that a failure.

A database a test gets migrated (`engine`, `empty_lab`) or seeded (`lab`) is a copy of one that each test process
migrated or seeded once (`migrated_template`, `postgres_template`, `seeded_template`): SQLite's backup API, or
PostgreSQL's `CREATE DATABASE ... TEMPLATE`. Migrating takes about 0.6 s and seeding 2.2 s; a copy, milliseconds.

The Slurm cluster (`slurm_cluster`) is a one-node cluster started once per test session from Debian's
`slurmctld`, `slurmd` and `munge` (tests/slurm_cluster.py), as root, all its files in a temporary folder; its
daemons are stopped by the PIDs they wrote when the session ends. Without the binaries (or root) the Slurm tests
skip, unless ENVLAB_REQUIRE_SLURM=1 (CI sets it), which makes that a failure.

Shared fixtures: `lab`, a lab seeded through the real lab functions (tests/seeded.py; a module that needs
another kind of lab defines its own `lab`); `browser` and `page`, Debian's Chromium driven by Playwright
(skipped without it unless ENVLAB_REQUIRE_BROWSER=1); `served`, `transformers serve` on a tiny random model,
started once per session. What they run on is in tests/servers.py.

Property tests run under one Hypothesis profile: no per-example deadline and no "input generation is slow"
health check, since both measure the machine's load, not the code (a 300-digit integer takes a while to
draw on a busy 2-core machine). Every other health check stays on.
"""

from __future__ import annotations

import glob
import importlib.util
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings
from sqlalchemy import Engine, create_engine, text

from storage.db import make_engine, upgrade
from tests.seeded import copy_database, seed_lab, seeded_copy
from tests.servers import CHROMIUM_ARGS, TIMEOUT_MS, build_tiny_model, chromium_missing, chromium_path, free_port

settings.register_profile("envlab", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("envlab")

_database_numbers = itertools.count()

# The modules that take longest, longest first (CI's durations). CI runs the tests in two processes, a module's
# tests in one (`pytest -n 2 --dist loadfile`), handing out modules in the order collected: the long ones first,
# then the many short ones fill in beside them, so neither process is left alone with a long module at the end.
LONGEST_FIRST = ["test_slurm", "test_experiment_e2e", "test_browser", "test_multi_agent_run", "test_stage", "test_llm",
                 "test_bench_page", "test_cli", "test_bench_app", "test_child", "test_experiment", "test_warmstart",
                 "test_bench_memory", "test_bench_experiment", "test_bench_stage_breakdown",
                 "test_bench_structured_engineer", "test_bench_probe", "test_bench_gemma_engineer"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: each module's own order kept


@pytest.fixture(autouse=True)
def _umask_given_back() -> Iterator[None]:
    """`envlab`'s entry points make the process's files private (`storage.db.keep_private`): a test that calls one
    in this process gives the umask back, so later tests (and the servers they start) make files as before."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


@pytest.fixture(autouse=True)
def _gradio_temp_given_back() -> Iterator[None]:
    """`envlab serve` points Gradio at a private folder under its runs root (`lab.pages.tempfiles.private_temp`, in
    `$GRADIO_TEMP_DIR`): a test that calls it in this process gives the setting back, so later tests' pages keep
    their files where they did."""
    before = os.environ.get("GRADIO_TEMP_DIR")
    yield
    if before is None:
        os.environ.pop("GRADIO_TEMP_DIR", None)
    else:
        os.environ["GRADIO_TEMP_DIR"] = before


@pytest.fixture(autouse=True)
def _ctrl_c_at_its_default() -> Iterator[None]:
    """Every test's children start with Ctrl+C at its default, as a terminal starts them. Something a test runs in
    this process can leave SIGINT ignored here, and an ignored signal stays ignored through exec (Python then leaves
    Ctrl+C ignored): a child's test of Ctrl+C would then wait for nothing."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


def _postgres_bin() -> Path | None:
    # Debian installs each major version beside the others; take the newest.
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: float(Path(p).parts[4]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).resolve().parent if on_path else None


def _no_postgres(reason: str) -> None:
    if os.environ.get("ENVLAB_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"ENVLAB_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The URL (without database name) of a PostgreSQL server that lives for the test session."""
    if importlib.util.find_spec("psycopg") is None:
        _no_postgres("the psycopg driver is not installed (pip install -e '.[dev]')")
    bindir = _postgres_bin()
    if bindir is None:
        _no_postgres(
            "PostgreSQL is not installed (no initdb/pg_ctl under /usr/lib/postgresql/*/bin or on PATH)"
        )
    as_user: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="envlab-pg-"))
    if os.geteuid() == 0:  # initdb refuses to run as root
        try:
            postgres = pwd.getpwnam("postgres")
        except KeyError:
            _no_postgres("running as root and there is no 'postgres' user to run the server")
        os.chown(base, postgres.pw_uid, postgres.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = base / "data", free_port()
    subprocess.run(
        [*as_user, bindir / "initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"],
        check=True,
        capture_output=True,
    )
    # Durability off: a test cluster is thrown away, and fsync would dominate the run time.
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
    started = subprocess.run(
        [*as_user, bindir / "pg_ctl", "-D", data, "-o", options, "-l", base / "log", "-w", "start"],
        capture_output=True,
        text=True,
    )
    if started.returncode != 0:
        log = (base / "log").read_text() if (base / "log").exists() else ""
        pytest.fail(f"PostgreSQL did not start: {started.stderr}\n{log}", pytrace=False)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run(
            [*as_user, bindir / "pg_ctl", "-D", data, "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[object]:
    """A one-node Slurm cluster for the test session (`tests.slurm_cluster.Cluster`); `SLURM_CONF` points every
    Slurm command of the session, and of the processes it starts, at it while it lives."""
    from tests import slurm_cluster

    if (why := slurm_cluster.missing()) is not None:
        if os.environ.get("ENVLAB_REQUIRE_SLURM") == "1":
            pytest.fail(f"ENVLAB_REQUIRE_SLURM=1 but {why}", pytrace=False)
        pytest.skip(why)
    try:
        cluster = slurm_cluster.start()
    except slurm_cluster.ClusterUnavailable as err:
        pytest.fail(f"the one-node Slurm cluster did not start: {err}", pytrace=False)
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        cluster.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database: a SQLite file, or a fresh database on the test PostgreSQL server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'envlab.db'}"
        return
    server = request.getfixturevalue("postgres_server")
    name = f"envlab_test_{os.getpid()}_{next(_database_numbers)}"
    admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{server}/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_template(postgres_server: str) -> str:
    """The name of a database on the test server migrated to head once per test process: a test's database is
    created from it (`CREATE DATABASE ... TEMPLATE`), not migrated again."""
    name = f"envlab_template_{os.getpid()}"
    admin = create_engine(f"{postgres_server}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    engine = make_engine(f"{postgres_server}/{name}")
    upgrade(engine)
    engine.dispose()  # a template database takes no connections while it is copied
    return name


@pytest.fixture
def engine(db_url: str, request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine on a database migrated to head: a copy of the test process's migrated database."""
    if db_url.startswith("sqlite:///"):
        copy_database(request.getfixturevalue("migrated_template"), Path(db_url.removeprefix("sqlite:///")))
    else:
        server, _, name = db_url.rpartition("/")
        template = request.getfixturevalue("postgres_template")
        admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE "{name}"'))
            connection.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        admin.dispose()
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch on one thread for a module's tests: models this small run fastest so, and on a shared 2-core machine
    two threads can be 20x slower (a module asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- a seeded lab, a browser, a served model


@pytest.fixture(scope="session")
def migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to head once per test process; each test gets a copy of it (migrating takes
    0.6 s, copying a few milliseconds)."""
    path = tmp_path_factory.mktemp("templates") / "migrated.db"
    engine = make_engine(str(path))
    upgrade(engine)
    engine.dispose()
    return path


@pytest.fixture(scope="session")
def seeded_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """`seed_lab`'s database, seeded once per test process, and its ids; each test gets a copy of it. Seeding
    stores rows only (no file beside the database), so a copy is the lab a fresh seeding gives."""
    path = tmp_path_factory.mktemp("templates") / "seeded.db"
    engine = make_engine(str(path))
    ids = seed_lab(engine)
    engine.dispose()
    return path, ids


@pytest.fixture
def lab(tmp_path: Path, seeded_template) -> Iterator[tuple[Engine, dict[str, int]]]:
    """A lab seeded through the real lab functions (tests/seeded.py): (engine, the seeded ids). A module whose
    tests need another kind of lab defines its own `lab`."""
    engine, ids = seeded_copy(seeded_template, tmp_path / "lab.db")
    yield engine, ids
    engine.dispose()


@pytest.fixture
def empty_lab(tmp_path: Path, migrated_template: Path) -> Iterator[Engine]:
    """An empty lab, migrated (its engine): for the tests that store what they need themselves."""
    copy_database(migrated_template, tmp_path / "lab.db")
    engine = make_engine(str(tmp_path / "lab.db"))
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless, driven by Playwright; skips without it unless ENVLAB_REQUIRE_BROWSER=1 (CI)."""
    reason = chromium_missing()
    if reason:
        if os.environ.get("ENVLAB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"ENVLAB_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    yield page
    context.close()


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, model name) of `transformers serve` running a tiny model on 127.0.0.1."""
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("openai") is None:
        pytest.skip("transformers serve needs the serving extra (fastapi, uvicorn, openai)")
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny-served"))
    port = free_port()
    log = (folder / "serve.log").open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(
        [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", str(folder),
         "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                pytest.fail(f"transformers serve exited ({server.returncode}):\n{(folder / 'serve.log').read_text()}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not answer /health:\n{(folder / 'serve.log').read_text()}")
            time.sleep(0.5)
        yield f"{base}/v1", str(folder)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
