"""The page as a whole: `python app.py` serves it with a worker beside it, it builds on an empty database,
links open what they name. How `envlab serve` reads its logins is tested in tests/cli/test_cli.py; the tabs' view
functions in tests/pages/test_pages.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from lab.jobs.worker import KeptWorker, worker_status
from lab.pages import proposal, train
from lab.pages import web as app
from lab.study.experiments import experiment_runs
from storage.db import make_engine, upgrade
from tests.recorded import scripted_experiment


def test_a_link_opens_the_run_tab_episode_and_proposal_it_names(lab):
    engine, ids = lab
    assert app.linked(engine, {}) == {"run": ids["waiting"], "tab": None, "episode": None, "proposal": None}
    assert app.linked(engine, {"proposal": str(ids["accepted"])}) == {
        "run": ids["history"], "tab": "proposal", "episode": None, "proposal": ids["accepted"]}
    assert app.linked(engine, {"episode": str(ids["clash"])}) == {
        "run": ids["history"], "tab": "episode", "episode": ids["clash"], "proposal": None}
    assert app.linked(engine, {"run": str(ids["history"]), "episode": "x"})["run"] == ids["history"]


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _serving(url: str, proc: subprocess.Popen, seconds: float = 120) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            time.sleep(0.5)
    return False


@pytest.mark.parametrize("stop", ["SIGTERM", "Ctrl+C"])
def test_python_app_py_serves_the_lab_with_a_worker_and_stops_both(tmp_path: Path, stop: str):
    """The entry point end to end: `python app.py` migrates a fresh database, starts `envlab worker` beside
    the page and its probe lane (each with torch threads on every core but one), serves it, and on SIGTERM, or a
    Ctrl+C (SIGINT to the terminal's whole process group), stops the page and the workers it started, with no
    traceback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    root = Path(__file__).resolve().parents[2]  # the checkout, whose app.py is the entry point
    proc = subprocess.Popen([sys.executable, str(root / "app.py"), "--port", str(port), "--no-example",
                             "--db", str(tmp_path / "lab.db")],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                            env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    try:
        assert _serving(f"http://127.0.0.1:{port}/", proc), proc.stderr.read().decode()[-2000:] if proc.poll() else ""
        deadline = time.monotonic() + 30  # the workers start once the page serves
        while True:
            commands = {c: Path(f"/proc/{c}/cmdline").read_bytes() for c in _children(proc.pid)}
            workers = [c for c, line in commands.items() if b"lab.cli\x00worker" in line]
            if len(workers) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert sorted(b"--kinds\x00probe" in commands[c] for c in workers) == [False, True]  # the worker, the lane
        threads = f"OMP_NUM_THREADS={max(1, len(os.sched_getaffinity(0)) - 1)}".encode()
        assert all(threads in Path(f"/proc/{c}/environ").read_bytes().split(b"\x00") for c in workers)
        if stop == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{w}").exists() for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(Path(f"/proc/{w}").exists() for w in workers)  # reaped by the page on its way out
        assert "Traceback" not in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_restart_after_the_lab_was_killed_hands_its_job_back_at_once_and_starts_a_worker(tmp_path: Path, page):
    """The lab before this start was killed with its worker (SIGKILL, the machine restarted): its job, queued an
    hour ago, is still running in the database under a worker of this host that is gone, with a heartbeat seconds
    old, which read as a busy worker until it went stale, and no worker was started for it. `python app.py` hands it
    back to the queue before it serves, says so in one line, and starts a worker; the badge the page first shows in
    Chromium is true: the job waits for that worker, which is starting (not "no worker seems to be running", which
    a job queued that long ago reads as once nothing takes it). The job needs a GPU, which no worker here has, so it
    stays queued."""
    from datetime import timedelta

    from storage import queue
    from storage.db import session
    from storage.models import Job, JobKind
    from tests.servers import goto

    gone = subprocess.Popen(["true"])
    gone.wait()  # a process of this host that has ended: the killed worker
    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    with session(engine) as s:
        job = queue.enqueue(s, JobKind.STAGE, {"run_id": 1, "stage_index": 1}, needs_gpu=True)
        queue.claim(s, f"{socket.gethostname()}:{gone.pid}", gpu=True)
        queue.heartbeat(s, job.id, 5, 8, "evaluating on 8 validation boards")
        row = s.get(Job, job.id, populate_existing=True)
        row.created_at -= timedelta(hours=1)
        s.add(row)
        s.commit()
    busy = f"Worker busy: stage job {job.id}, step 5/8 (heartbeat"
    assert worker_status(engine)[1].startswith(busy)  # what the badge read before
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, str(root / "app.py"), "--port", str(port), "--no-example",
                             "--db", str(tmp_path / "lab.db")], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert _serving(f"http://127.0.0.1:{port}/", proc), proc.stderr.read().decode()[-2000:] if proc.poll() else ""
        goto(page, f"http://127.0.0.1:{port}/")
        badge = page.locator("#worker-status .worker")
        badge.get_by_text("1 job(s) queued, waiting for the worker this lab started, which is starting.").wait_for()
        assert badge.get_attribute("class") == "worker waiting"
        with session(engine) as s:
            back = s.get(Job, job.id)
        assert (back.status, back.worker, back.attempts, back.step, back.total) == ("queued", None, 0, 5, 8)
        assert back.log_tail.splitlines()[-1] == (f"-- handed back at step 5 of 8: its worker {socket.gethostname()}:"
                                                  f"{gone.pid} is gone from this host (the attempt is not counted)")
        workers = [c for c in _children(proc.pid) if b"lab.cli\x00worker" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(workers) == 2  # the worker (none was, though the heartbeat looked fresh) and the probe lane
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        said = proc.stderr.read().decode()
        assert (f"job {job.id} (stage) was left running at step 5 of 8 by a worker that is gone from this host: "
                "handed back to the queue, where a worker takes it up again") in said.splitlines()
        assert "already at work" not in said and "Traceback" not in said
    finally:
        if proc.poll() is None:
            proc.kill()
        engine.dispose()


def test_a_job_queued_long_ago_waits_for_the_worker_the_lab_started_while_it_starts(empty_lab):
    """The badge of a lab whose worker started a second ago, over a job queued an hour ago that nobody runs: it
    waits for that worker; two minutes after the worker started, or in a lab that started none, nobody runs it."""
    from datetime import timedelta

    from lab.jobs.worker import WORKER_START_S
    from storage import queue
    from storage.db import session
    from storage.models import JobKind

    with session(empty_lab) as s:
        job = queue.enqueue(s, JobKind.STAGE, {"run_id": 1, "stage_index": 1})
        job.created_at -= timedelta(hours=1)
        s.add(job)
        s.commit()
    kept = KeptWorker(lambda: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    try:
        starting = app.worker_badge(empty_lab, kept=kept)
        assert starting == ('<div class="worker waiting"><span class="dot"></span>1 job(s) queued, waiting for the '
                            'worker this lab started, which is starting.</div>')
        kept.started = time.monotonic() - WORKER_START_S - 1
        for started in (kept, None):
            badge = app.worker_badge(empty_lab, kept=started)
            assert badge.startswith('<div class="worker down"><span class="dot"></span>1 job(s) queued, the oldest '
                                    'for ')
            assert "no worker seems to be running" in badge
    finally:
        kept.proc.kill()
        kept.proc.wait()


def test_a_worker_made_later_starts_its_process_with_its_watch():
    """`envlab serve` makes its workers before the page is built (the badge reads them) and starts them once the page
    serves: a `KeptWorker` made `later` has no process until `start()`, and counts its start from then."""
    started: list[int] = []

    def process() -> subprocess.Popen:
        started.append(1)
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    kept = KeptWorker(process, later=True)
    assert (started, kept.proc) == ([], None)
    made = kept.started
    kept.start()
    try:
        assert started == [1] and kept.proc.poll() is None and kept.started > made
    finally:
        kept.stopping.set()
        kept.join()
        kept.proc.kill()
        kept.proc.wait()


def test_the_badge_says_plainly_that_the_worker_the_lab_started_was_left_down(empty_lab, monkeypatch):
    """The worker `envlab serve` started (a real process here, which exits at once) dies once more than it is started
    again within the window, and is left down: the badge says so in the line the command line printed, over an empty
    queue and over a job that waits (not that it waits for a worker that is starting: the last start was just now)."""
    from lab.jobs import worker
    from storage import queue
    from storage.db import session
    from storage.models import JobKind

    monkeypatch.setattr(worker, "RESTARTS", 2)
    kept = KeptWorker(lambda: subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]), poll_s=0.02)
    assert app.worker_badge(empty_lab, kept=kept).endswith("Worker idle: no jobs queued.</div>")
    kept.start()
    kept.join(timeout=60)
    down = ('<div class="worker down"><span class="dot"></span>The lab&#x27;s worker (pid '
            f'{kept.proc.pid}) exited with status 3; it died 3 times in 5 min, so it is not started again: nothing '
            'here runs its jobs; start one with <code>envlab worker</code>.</div>')
    assert app.worker_badge(empty_lab, kept=kept) == down
    with session(empty_lab) as s:
        queue.enqueue(s, JobKind.STAGE, {"run_id": 1, "stage_index": 1})
    assert app.worker_badge(empty_lab, kept=kept) == down


def test_the_demo_builds_on_an_empty_database(tmp_path: Path):
    engine = make_engine(str(tmp_path / "empty.db"))
    upgrade(engine)
    demo = app.build_demo(engine)
    assert demo.title == "envlab"
    assert worker_status(engine) == ("idle", "Worker idle: no jobs queued.")
    assert train.train_view(engine, None)["status"] == "No run is open."
    assert proposal.proposal_view(engine, None).status.startswith("No proposal yet")
    engine.dispose()


def test_the_lab_starts_where_gradio_cannot_reach_its_own_page_in_time(tmp_path: Path, monkeypatch):
    """On a loaded machine Gradio's one check of its own page (a HEAD of `/`, a single 3 s wait) fails and
    `launch` raises; the lab does not ask. Gradio's check is made to fail as it does under load: Gradio alone
    refuses to start, the lab serves its page."""
    import gradio.networking

    from tests.servers import free_port

    asked: list[str] = []

    def times_out(url: str) -> bool:
        asked.append(url)
        return False

    monkeypatch.setattr(gradio.networking, "url_ok", times_out)
    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    demo = app.build_demo(engine)
    with pytest.raises(ValueError, match="When localhost is not accessible"):
        demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    demo.close()
    asked.clear()
    port = free_port()
    app.launch(demo, port=port, block=False)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as answer:
            assert answer.status == 200
            assert b"envlab" in answer.read()
        assert asked == []
    finally:
        demo.close()
        engine.dispose()


def test_the_poll_draws_the_tab_shown_that_is_drawn_for_no_run(lab):
    """A tab opened as the page loads can reach the server before the page's first answer: it is drawn for no run,
    and that answer marks nothing drawn. The next poll draws it for the open run; a tab drawn for it is left."""
    engine, ids = lab
    demo = app.build_demo(engine, own_worker=False)
    fns = {f.fn.__name__: f for f in demo.fns.values() if f.fn is not None}
    follow, outputs = fns["follow"].fn, fns["follow"].outputs
    status = next(c for c in outputs if getattr(c, "elem_id", None) == "train-status")
    drawn = outputs[1]  # `drawn`, after `seen`
    seen = (app.lab_version(engine), ids["history"])
    for has in ({}, {"train": None}, {"train": ids["waiting"], "review": ids["history"]}):
        out = follow(ids["history"], "train", None, None, seen, has, None, None, None)  # no experiment on Compare
        assert out[status].startswith(f"Run #{ids['history']} **curriculum** is ")
        assert out[drawn] == {**has, "train": ids["history"]}
    left = follow(ids["history"], "train", None, None, seen, {"train": ids["history"]}, None, None, None)
    assert status not in left and drawn not in left
    shown_elsewhere = follow(ids["history"], "runs", None, None, seen, {}, None, None, None)  # a tab no run fills
    assert status not in shown_elsewhere and drawn not in shown_elsewhere


def test_the_poll_redraws_the_compare_tab_drawn_before_a_stage_ended_that_the_page_first_read(empty_lab):
    """The Compare tab can be drawn before the page's first answer, and a stage end between the two; that answer
    reads the lab with the stage ended. The poll compares what the tab was drawn from (`drawn_at`), not what the
    page last read: it redraws the tab, and leaves a tab drawn from the lab as it is."""
    import gradio as gr

    experiment = scripted_experiment(empty_lab, name="watched", seeds=1, stages=1)
    run_id = experiment_runs(empty_lab, experiment.id)[-1].id
    demo = app.build_demo(empty_lab, own_worker=False)
    fns = {f.fn.__name__: f for f in demo.fns.values() if f.fn is not None}
    follow, outputs = fns["follow"].fn, fns["follow"].outputs
    summary = next(c for c in outputs if getattr(c, "elem_id", None) == "compare-summary")
    now = app.lab_version(empty_lab)
    seen = (now, run_id)  # the page's first answer read the lab as it is now
    before = (now.runs, (now.stages[0], now.stages[1] - 1), "")  # the tab, drawn one stage end earlier (no import)
    out = follow(run_id, "compare", None, None, seen, {}, experiment.id, None, before)
    assert out[summary].startswith("**watched**: 2 of 2 runs done.\n"), out[summary]
    assert [v for c, v in out.items() if isinstance(c, gr.State) and v == (now.runs, now.stages, "")]  # drawn_at, now
    assert summary not in follow(run_id, "compare", None, None, seen, {}, experiment.id, None,
                                 (now.runs, now.stages, ""))
    assert summary not in follow(run_id, "runs", None, None, seen, {}, experiment.id, None, before)  # not shown


def _page_tabs(demo) -> list[tuple[str, str]]:
    import gradio as gr

    return [(b.label, b.id) for b in demo.blocks.values() if isinstance(b, gr.Tab) and b.parent.elem_id == "tabs"]


def test_the_page_has_a_tab_for_each_entry_of_the_registry_in_its_order(tmp_path: Path):
    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    assert _page_tabs(app.build_demo(engine)) == [
        ("Runs", "runs"), ("Stage review", "review"), ("Episode", "episode"), ("Proposal", "proposal"),
        ("Train", "train"), ("Playground", "playground"), ("Leaderboard", "leaderboard"), ("Compare", "compare")]
    assert app.LAZY == ("review", "proposal", "train")  # the tabs a run fills: those the registry gives a drawing
    assert app.INTRO.endswith("**Playground** → try boards and plans · **Leaderboard** → benchmark tables · "
                              "**Compare** → an experiment's engineers side by side.")
    engine.dispose()


def test_a_new_tab_is_one_entry_of_the_registry(tmp_path: Path, monkeypatch):
    """A tab added to `TABS` alone is built on the page, after the others, by its module's function, and the page
    notes it as the tab shown when it is opened, as it does every tab."""
    import gradio as gr

    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    built = []

    def notes(page) -> gr.Markdown:
        built.append(page.engine)
        return gr.Markdown("noted", elem_id="notes")

    monkeypatch.setattr(app, "TABS", (*app.TABS, app.TabSpec("notes", "Notes", "what a person noted", notes)))
    demo = app.build_demo(engine)
    assert _page_tabs(demo)[-1] == ("Notes", "notes") and len(_page_tabs(demo)) == 9
    assert built == [engine] and "notes" in {b.elem_id for b in demo.blocks.values()}
    tab_id = next(b._id for b in demo.blocks.values() if isinstance(b, gr.Tab) and b.id == "notes")
    assert [(f.js, f.targets) for f in demo.fns.values() if f.js == "() => 'notes'"] == [
        ("() => 'notes'", [(tab_id, "select")])]
    engine.dispose()
