"""The web lab end to end in a real headless browser: Debian's Chromium driven by Playwright.

The page is served on 127.0.0.1 at a free port over a temporary SQLite database that `tests.seeded.seed_lab`
fills through the real lab functions. Needs `pip install playwright` and `apt-get install chromium` (never
`playwright install`, which downloads a browser); without them the tests skip, unless ENVLAB_REQUIRE_BROWSER=1
(CI), which makes that a failure.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from sqlmodel import select

from envsim.config import EnvConfig
from lab.archive import export_run, read_manifest
from lab.jobs.worker import WorkerOptions, run_worker
from lab.loop import create_run
from lab.pages import web as app
from lab.proposals import decide
from lab.replay import GIF_WIDTHS
from storage.db import make_engine, session
from storage.models import Decision, Proposal, Run, Stage, utcnow
from storage.payloads import StagePayload
from storage.settings import RunSettings
from tests.page_walk import ERRORS_SEEN, open_run_pick
from tests.seeded import record_evaluation, seed_lab, seeded_copy
from tests.servers import TIMEOUT_MS, free_port, goto


@pytest.fixture
def lab(tmp_path: Path, seeded_template) -> Iterator[tuple[str, object, dict[str, int]]]:
    """The page on a seeded database (a copy of the seeded lab): (its URL, the engine, the seeded ids)."""
    engine, ids = seeded_copy(seeded_template, tmp_path / "lab.db")
    demo = app.build_demo(engine)
    port = free_port()
    app.launch(demo, port=port, block=False)
    yield f"http://127.0.0.1:{port}/", engine, ids
    demo.close()
    engine.dispose()


def plotted(page, elem_id: str, name: str) -> list[tuple[float, float]]:
    """The (row, col) points of the trace `name` that Plotly drew in the plot `elem_id`."""
    xy = page.evaluate("""([id, name]) => {
        const t = document.querySelector(`#${id} .js-plotly-plot`).data.find(t => t.name === name);
        return [Array.from(t.y), Array.from(t.x)];
    }""", [elem_id, name])
    return list(zip(*xy, strict=True))


def wait_plotted(page, elem_id: str, name: str, expected: list[tuple[int, int]]) -> None:
    page.wait_for_function("""([id, name, want]) => {
        const div = document.querySelector(`#${id} .js-plotly-plot`);
        const t = div && div.data && div.data.find(t => t.name === name);
        return t && JSON.stringify(Array.from(t.y).map((y, i) => [y, t.x[i]])) === JSON.stringify(want);
    }""", arg=[elem_id, name, [list(c) for c in expected]])


def decisions(engine) -> list[Decision]:
    with session(engine) as s:
        return list(s.exec(select(Decision).order_by(Decision.id)))


def edit_cell(page, table_id: str, row: int, col: int, value: str) -> None:
    """Type into one cell of an editable Gradio table (row and column counted from 0, header excluded)."""
    from playwright.sync_api import TimeoutError as Late

    cell = page.locator(f'#{table_id} [data-testid="cell-{row}-{col}"]')
    field = cell.locator("textarea, input").first
    for attempt in range(3):  # a double click that lands before the table's handlers are attached opens nothing
        cell.dblclick()
        try:
            field.wait_for(timeout=5_000)
            break
        except Late:
            if attempt == 2:
                raise
    field.fill(value)
    field.press("Enter")


# ---------------------------------------------------------------- the tests


def test_create_a_run(lab, page):
    url, engine, _ = lab
    goto(page, url)
    page.locator("#new-name textarea, #new-name input").first.fill("browser run")
    counts = page.locator("#new-agent-counts input, #new-agent-counts textarea").first
    counts.fill("2,x")
    page.click("#create-run")
    page.locator("#create-msg").get_by_text("✗ Not created: Agent counts: '2,x' is not agent counts").wait_for()
    counts.fill("3,2")
    page.click("#create-run")
    page.locator("#train-msg").get_by_text("Created run #3").wait_for()  # the page moves on to the Train tab
    page.locator("#train-status").get_by_text("Run #3 browser run is active").wait_for()
    with session(engine) as s:
        run = s.get(Run, 3)
        assert s.get(Run, 4) is None  # the refused form stored nothing
    assert (run.name, run.engineer, run.settings.stages) == ("browser run", "heuristic", 3)
    assert (run.settings.agent_counts, run.settings.validation_agents) == ((2, 3), (3, 4, 5))  # the box's default
    page.get_by_role("tab", name="Runs").click()
    page.locator("#runs-table").get_by_text("browser run").wait_for()


@pytest.mark.parametrize("answers, loaded", [([204, 200], True), ([204, 204, 204], False), ([500], True)])
def test_a_load_chromium_aborts_is_asked_again_up_to_three_times(page, answers: list[int], loaded: bool):
    """`tests.servers.goto`, which every browser test loads the page with: a navigation Chromium aborts (a 204
    answer ends it with net::ERR_ABORTED, as a load cut short does) is asked again, three tries in all, then the
    error is raised; a page that loads, even with an error status, is asked for once."""
    from playwright.sync_api import Error

    asked: list[str] = []

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/x":  # the browser's own asks (its icon)
                self.send_response(404)
                self.end_headers()
                return
            status = answers[min(len(asked), len(answers) - 1)]
            asked.append(self.path)
            self.send_response(status)
            self.end_headers()
            if status != 204:
                self.wfile.write(b"<p>here</p>")

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        there = f"http://127.0.0.1:{server.server_address[1]}/x"
        if loaded:
            goto(page, there)
            assert page.locator("p").inner_text() == "here"
        else:
            with pytest.raises(Error, match="net::ERR_ABORTED"):
                goto(page, there)
        assert asked == ["/x"] * len(answers)
    finally:
        server.shutdown()


def test_names_and_a_note_show_as_typed_and_fetch_nothing(lab, page):
    """Runs named as an image in HTML and in Markdown, and a decision note in both, planted beside a tiny HTTP
    listener: the Runs tab, the Train tab of each run and the decision show each as typed, and the listener is
    asked for nothing (a name rendered as Markdown made every viewer's browser fetch its address)."""
    url, engine, ids = lab
    asked: list[str] = []

    class Listener(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    there = f"http://127.0.0.1:{server.server_address[1]}"
    names = [f'<img src="{there}/img">', f"![x]({there}/md)"]
    with session(engine) as s:
        run_ids = [create_run(s, name=name, config=EnvConfig.default(), settings=RunSettings(stages=1),
                              engineer="fixed").id for name in names]
    note = "<b>x</b> **y**"
    with session(engine) as s:
        decide(s, ids["pending"], "reject", "eve", note=note)
    try:
        goto(page, url)
        page.get_by_role("tab", name="Runs").click()
        for name in names:
            page.locator("#runs-table [role=gridcell]", has_text=name).first.wait_for()
        page.get_by_role("tab", name="Train").click()
        for run_id, name in zip(run_ids, names, strict=True):
            open_run_pick(page, f"#{run_id} ")
            page.locator("#train-status").get_by_text(f"Run #{run_id} {name} is active").wait_for()
        open_run_pick(page, f"#{ids['waiting']} ")
        page.get_by_role("tab", name="Proposal").click()
        page.locator("#proposal-status").get_by_text("by eve at").wait_for()
        assert f"“{note}”" in page.locator("#proposal-status").inner_text()
        assert page.locator("#proposal-status b, #proposal-status img, #train-status img").count() == 0
        assert asked == []
    finally:
        server.shutdown()
        server.server_close()


def test_an_imported_rationale_shows_as_typed_with_no_image_form_or_link(lab, page):
    """A proposal's rationale and error as an archive from elsewhere may carry them: Markdown and HTML images of a
    tiny listener's address, a link, and a login form. The Proposal tab shows each as typed: no image, form, input
    or link comes of them, and the listener is asked for nothing."""
    url, engine, ids = lab
    asked: list[str] = []

    class Listener(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Listener)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    there = f"http://127.0.0.1:{server.server_address[1]}"
    said = (f"Fewer holes. ![x]({there}/md) <img src={there}/img> [see]({there}/link) {there}/bare\n"
            f'<form action="{there}/steal" method="post"><input name=password type=password><button>Log in</button>'
            "</form>")
    with session(engine) as s:
        row = s.get(Proposal, ids["pending"])
        row.rationale = said
        s.add(row)
        s.commit()
    try:
        goto(page, url)
        open_run_pick(page, f"#{ids['waiting']} ")
        page.get_by_role("tab", name="Proposal").click()
        page.locator("#rationale").get_by_text("Fewer holes.").wait_for()
        shown = page.locator("#rationale").inner_text()
        assert f"![x]({there}/md) <img src={there}/img> [see]({there}/link) {there}/bare" in shown
        assert f'<form action="{there}/steal" method="post"><input name=password type=password>' in shown
        assert page.locator("#rationale img, #rationale form, #rationale input, #rationale a, "
                            "#rationale button").count() == 0
        remote = page.evaluate("(there) => [...document.images].map(i => i.src).filter(s => s.startsWith(there))",
                               there)
        assert remote == [] and page.locator("form").count() == 0
        assert asked == []
    finally:
        server.shutdown()
        server.server_close()


def test_the_plan_box_takes_at_most_its_bound(lab, page):
    url, _, _ = lab
    goto(page, url)
    page.get_by_role("tab", name="Playground").click()
    assert page.locator("#pg-plan textarea").get_attribute("maxlength") == str(64 * 1024)


def test_open_a_failed_episode_from_the_gallery_and_step_the_replay(lab, page):
    url, _, ids = lab
    goto(page, f"{url}?run={ids['history']}")
    page.get_by_role("tab", name="Stage review").click()
    page.locator("#gallery [role=gridcell]", has_text="vertex_conflict").first.click()
    page.get_by_text(f"Episode {ids['clash']}").first.wait_for()
    wait_plotted(page, "replay", "agent 0", [(0, 1)])  # t = 0: the starts
    assert plotted(page, "replay", "agent 1") == [(1, 0)]
    page.locator("#replay-step input[type=range]").focus()
    page.keyboard.press("ArrowRight")  # t = 1: both agents in (1,1), the conflict marked there
    wait_plotted(page, "replay", "agent 0", [(1, 0.82)])  # side by side in (1, 1)
    assert plotted(page, "replay", "agent 1") == [(1, 1.18)]
    assert plotted(page, "replay", "events") == [(1, 1)]
    assert plotted(page, "replay", "solver's plan") == [(0, 1), (1, 1)]  # the ghost waits a step first
    page.get_by_text("At this step: t=1: agents 0 and 1 collide at (1, 1)").wait_for()
    page.click("#replay-play")  # plays on to the end (t = 2) and stops
    wait_plotted(page, "replay", "agent 1", [(1, 2)])
    page.locator("#replay-play").get_by_text("Play").wait_for()
    assert "RIGHT RIGHT" in page.locator("#raw-answer textarea").input_value()
    with page.expect_download() as download:  # one click: the GIF was made when the episode opened
        page.click("#replay-gif")
    assert download.value.suggested_filename.endswith(".gif")
    with Image.open(download.value.path()) as gif:
        assert gif.n_frames == 3  # t = 0, 1, 2
    with page.expect_download() as download:  # and the standalone HTML replay, made then too
        page.click("#replay-html")
    name = download.value.suggested_filename
    assert name.startswith("replay-") and name.endswith(".html")
    assert "Plotly.addFrames" in Path(download.value.path()).read_text()


def test_the_episode_tab_opened_first_shows_the_runs_first_failure(lab, page):
    """A fresh page, the Episode tab opened before any episode: it draws the open run's first failed episode (the
    latest stage's, smallest size first), says which, and offers its files."""
    url, _, ids = lab
    goto(page, f"{url}?run={ids['history']}")
    page.get_by_role("tab", name="Episode").click()
    try:
        page.get_by_text(f"Run #{ids['history']}'s first failed episode at stage 1").wait_for()
    except PlaywrightTimeout as e:  # what the tab shows instead, and any error the page put up, to say why
        toasts = page.locator('[data-testid="toast-body"]').all_inner_texts()
        raise AssertionError(f"the tab shows {page.locator('#episode-header').inner_text()!r}; toasts {toasts}; "
                             f"run picked {page.locator('#run-pick input').input_value()!r}") from e
    page.get_by_text(f"Episode {ids['clash']}").first.wait_for()
    assert page.locator("#episode-id input").input_value() == str(ids["clash"])
    wait_plotted(page, "replay", "agent 0", [(0, 1)])  # t = 0: the starts of the crossing board
    page.locator("#replay-gif:not([disabled])").wait_for()
    with page.expect_download() as download:
        page.click("#replay-gif")
    with Image.open(download.value.path()) as gif:
        assert gif.n_frames == 3 and gif.width == GIF_WIDTHS[0]  # the crossing board, t = 0, 1, 2


GIF_BUTTON_SAFE = """width => { const el = document.getElementById('replay-gif');
    const button = el && (el.tagName === 'BUTTON' ? el : el.querySelector('button'));
    return !!button && (button.disabled || button.textContent.includes(`(${width} px)`)); }"""


def test_a_gif_width_picked_then_downloaded_at_once_gives_a_file_of_that_width(lab, page):
    """Each width picked and the GIF button clicked at once, without a pause: the file is the width the dropdown
    shows at the moment of the click (the button is disabled until the new file is made, so the click waits)."""
    url, _, ids = lab
    goto(page, f"{url}?run={ids['history']}")
    page.get_by_role("tab", name="Episode").click()
    page.get_by_text(f"Episode {ids['clash']}").first.wait_for()  # the tab opens on the run's first failure
    page.locator("#replay-gif:not([disabled])").get_by_text(f"Download GIF ({GIF_WIDTHS[0]} px)").wait_for()
    for width in (*GIF_WIDTHS[1:], GIF_WIDTHS[0]):  # 720, 960, then back to 480
        page.locator("#gif-width input").click()
        page.get_by_role("option", name=str(width), exact=True).click()
        # at once, in the browser: the old file cannot be had (disabled, or already the new file when the server was
        # quicker than this check)
        assert page.evaluate(GIF_BUTTON_SAFE, width)
        with page.expect_download() as download:
            page.click("#replay-gif")
        with Image.open(download.value.path()) as gif:
            assert gif.width == width, (width, gif.width)


def test_import_a_run_file_and_export_it_again(lab, page, tmp_path: Path):
    from playwright.sync_api import expect

    url, engine, _ = lab
    elsewhere = make_engine(str(tmp_path / "elsewhere.db"))  # seeded afresh: its runs' uuids are not the lab's
    file = export_run(elsewhere, seed_lab(elsewhere)["waiting"], tmp_path / "from-elsewhere.zip")
    elsewhere.dispose()
    goto(page, url)
    page.locator("#import-file input[type=file]").set_input_files(str(file))
    page.locator("#import-msg").get_by_text("from-elsewhere.zip imported as run #3 llm engineer").wait_for()
    expect(page.locator("#run-pick input")).to_have_value("#3 llm engineer (waiting)")  # opened above the tabs
    page.locator("#import-file input[type=file]").set_input_files(str(file))  # twice: refused, and said why
    page.locator("#import-msg").get_by_text("✗ Not imported").wait_for()
    page.click("#export-run")  # the imported run is the open one
    page.locator("#export-msg").get_by_text("✓ Run #3 exported").wait_for()
    with page.expect_download() as download:
        page.locator("#export-file a").first.click()
    assert read_manifest(download.value.path())["run"]["name"] == "llm engineer"


def test_an_invalid_edit_is_refused_then_a_valid_one_applied(lab, page):
    url, engine, ids = lab
    goto(page, f"{url}?proposal={ids['pending']}")
    page.get_by_text(f"Proposal #{ids['pending']}").first.wait_for()
    page.get_by_text("Edit before applying").click()
    edit_cell(page, "edit-config", 1, 2, "0.8")  # hole_ratio of size 4
    page.locator("#edit-check").get_by_text("✗ This edit cannot be applied: hole_ratio[4] = 0.8 is outside "
                                            "0..0.5.").wait_for()
    assert page.locator("#submit-edit").is_disabled()  # it cannot be sent while invalid
    assert [d.proposal_id for d in decisions(engine)] == [ids["accepted"]]
    page.locator('#edit-config [data-testid="cell-1-2"]').get_by_text("0.8").wait_for()  # the edit stays as typed
    edit_cell(page, "edit-config", 1, 2, "0.45")
    page.click("#submit-edit")
    page.get_by_text(f"Proposal #{ids['pending']} edited by local").wait_for()
    d = decisions(engine)[-1]
    assert (d.proposal_id, d.action, d.user, d.config.hole_ratio[4]) == (ids["pending"], "edit", "local", 0.45)
    page.get_by_text("edited by local at").wait_for()  # the page says who decided what and when


def test_accept_a_proposal_while_a_second_tab_is_told_it_lost(lab, page, browser):
    url, engine, ids = lab
    goto(page, f"{url}?proposal={ids['second']}")
    other = browser.new_page()
    goto(other, f"{url}?proposal={ids['second']}")
    for p in (page, other):
        p.get_by_text("Waiting for a decision").wait_for(timeout=TIMEOUT_MS)
    page.click("#accept")
    page.get_by_text(f"Proposal #{ids['second']} accepted by local").wait_for()
    # The second tab either clicks before its poll has seen the decision, and is told who won, or its poll gets
    # there first: it says who decided and holds the buttons. Either way it cannot decide again.
    from playwright.sync_api import TimeoutError as Late

    try:
        other.click("#reject", timeout=1000)
    except Late:  # the poll disabled it meanwhile
        pass
    else:
        other.locator("#decision-msg").get_by_text("Someone decided first").or_(
            other.locator("#proposal-status").get_by_text("accepted by local")).first.wait_for(timeout=TIMEOUT_MS)
    other.locator("#proposal-status").get_by_text("accepted by local").wait_for(timeout=TIMEOUT_MS)
    assert other.locator("#reject").is_disabled()
    other.close()
    assert [(d.proposal_id, d.action) for d in decisions(engine)][-1] == (ids["second"], "accept")


def test_queue_a_stage_and_watch_its_progress_to_done(lab, page):
    """A real worker (`run_worker`) runs the queued stage job. Its `stage` handler is written here: it
    reports six steps and records an evaluation instead of training, since training is tested elsewhere."""
    url, engine, ids = lab
    run_id = ids["waiting"]

    def stage(engine, job, progress):
        for step in range(1, 7):
            progress(step, 6, f"step {step} of 6")
            time.sleep(0.6)
        k = StagePayload.of(job).stage_index
        record_evaluation(engine, run_id, k)
        with session(engine) as s:
            row = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == k)).one()
            row.status, row.finished_at = "done", utcnow()
            s.add(row)
            s.commit()
        return {"stage_index": k}

    goto(page, f"{url}?proposal={ids['pending']}")
    page.click("#accept")
    page.get_by_text("Next: queued stage 1").wait_for()
    page.get_by_role("tab", name="Train").click()
    bar = page.locator("#job-progress")
    page.locator('#job-progress[data-status="queued"]').wait_for()
    stop = threading.Event()
    worker = threading.Thread(target=run_worker, args=(engine, {"stage": stage}, WorkerOptions(poll_s=0.2, stop=stop)),
                              daemon=True)
    worker.start()
    try:
        seen = set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            state = (bar.get_attribute("data-status"), bar.get_attribute("data-step"))
            seen.add(state)
            if state == ("done", "6"):
                break
            time.sleep(0.1)
        assert ("done", "6") in seen
        assert any(status == "running" and 0 < int(step) < 6 for status, step in seen), seen
        page.get_by_text("Stage 1 results").wait_for()
        assert "step 6 of 6" in page.locator("#log-tail textarea").input_value()
    finally:
        stop.set()
        worker.join(timeout=10)


def test_with_auth_a_decision_records_who_logged_in(browser, tmp_path: Path, seeded_template):
    engine, ids = seeded_copy(seeded_template, tmp_path / "lab.db")
    demo = app.build_demo(engine)
    port = free_port()
    app.launch(demo, port=port, auth=[("ann", "secret")], block=False)
    page = browser.new_page()
    try:
        goto(page, f"http://127.0.0.1:{port}/?proposal={ids['pending']}")
        page.get_by_label("username").fill("ann")
        page.get_by_label("password").fill("secret")
        page.get_by_role("button", name="Login").click()
        page.click("#accept", timeout=TIMEOUT_MS)
        page.get_by_text(f"Proposal #{ids['pending']} accepted by ann").wait_for(timeout=TIMEOUT_MS)
        assert (decisions(engine)[-1].user, decisions(engine)[-1].action) == ("ann", "accept")
    finally:
        page.close()
        demo.close()
        engine.dispose()


def test_a_proposal_stored_by_another_process_appears_without_a_refresh(lab, page):
    """The page follows the database by itself: a worker elsewhere stores a proposal, and the Proposal tab
    lists it, selects it and flags it above the tabs, with no click."""
    url, engine, ids = lab
    goto(page, f"{url}?run={ids['history']}")
    page.get_by_role("tab", name="Proposal").click()
    page.locator("#proposal-status").get_by_text(f"Proposal #{ids['second']}").wait_for()
    with session(engine) as s:  # another person, in another tab
        decide(s, ids["second"], "reject", "carol")
    page.locator("#proposal-status").get_by_text("rejected by carol").wait_for()
    script = ("import sys; from lab.loop import advance; from storage.db import make_engine; "
              "from tests.seeded import propose; e = make_engine(sys.argv[1]); "
              "print(propose(e, int(sys.argv[2]))); advance(e, int(sys.argv[2]))")
    done = subprocess.run([sys.executable, "-c", script, str(engine.url.database), str(ids["history"])],
                          capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2])
    newer = int(done.stdout.split()[-1])
    page.locator("#waiting").get_by_text(f"Proposal #{newer}").wait_for()  # flagged above every tab
    page.locator("#proposal-status").get_by_text(f"Proposal #{newer}").wait_for()  # and selected
    page.locator("#proposal-status").get_by_text("Waiting for a decision").wait_for()
    from playwright.sync_api import expect
    expect(page.locator("#proposal-pick input")).to_have_value(
        f"#{newer} for stage 2: waits for your decision")
    page.get_by_role("tab", name="Runs").click()
    page.locator("#runs-table").get_by_text(f"proposal #{newer} (stage 2)").wait_for()


def test_an_edit_says_what_it_stores_while_typed_and_after(lab, page):
    url, engine, ids = lab
    goto(page, f"{url}?proposal={ids['pending']}")
    page.get_by_text("Waiting for a decision").wait_for()
    page.get_by_text("Edit before applying").click()
    edit_cell(page, "edit-config", 0, 0, "-3")  # a bad size: said once, and no decision but Reject meanwhile
    page.locator("#edit-check").get_by_text("✗ This edit cannot be applied: size -3 is outside 2..32.").wait_for()
    assert page.locator("#accept").is_disabled() and page.locator("#submit-edit").is_disabled()
    assert page.locator("#reject").is_enabled()
    cell = page.locator('#edit-config [data-testid="cell-0-0"]')  # the bad cell is outlined in red
    assert cell.evaluate("c => getComputedStyle(c).backgroundColor") == "rgb(253, 226, 226)"
    edit_cell(page, "edit-config", 0, 0, "3")
    edit_cell(page, "edit-config", 0, 1, "0.9")  # data_ratio[3]: the shares now sum to 1.65
    page.locator("#edit-check").get_by_text("data_ratio[3] 0.5455 (you typed 0.9), data_ratio[4] 0.4545 "
                                            "(you typed 0.75)").wait_for()
    assert page.locator("#submit-edit").is_enabled()
    page.click("#submit-edit")
    page.locator("#decision-msg").get_by_text(f"Proposal #{ids['pending']} edited by local; stored: "
                                              "data_ratio[3] 0.5455 (you typed 0.9)").wait_for()
    assert decisions(engine)[-1].config.data_ratio == {3: 0.9 / 1.65, 4: 0.75 / 1.65}
    page.locator('#edit-config [data-testid="cell-0-1"]').get_by_text("0.5455").wait_for()  # what was stored
    page.locator("#diff [role=gridcell]", has_text="✎ 0.5455").first.wait_for()


def test_one_click_rescales_the_typed_shares(lab, page):
    url, engine, ids = lab
    goto(page, f"{url}?proposal={ids['pending']}")
    page.get_by_text("Waiting for a decision").wait_for()
    page.get_by_text("Edit before applying").click()
    edit_cell(page, "edit-config", 0, 1, "0.25")
    edit_cell(page, "edit-config", 1, 1, "0.25")  # the shares sum to 0.5
    page.locator("#edit-check").get_by_text("the data_ratio shares you typed sum to 0.5").wait_for()
    page.click("#rescale")
    page.locator('#edit-config [data-testid="cell-0-1"]').get_by_text("0.5").wait_for()
    page.locator("#edit-check").get_by_text("The data_ratio shares summed to 0.5: each is divided by it.").wait_for()
    page.locator('#edit-config [data-testid="cell-1-1"]').get_by_text("0.5", exact=True).wait_for()
    assert [d.proposal_id for d in decisions(engine)] == [ids["accepted"]]  # nothing stored until applied


def test_an_agent_mix_typed_in_its_table_is_stored_and_the_next_stage_trains_on_both_counts(lab, page):
    """The agent mix edited in its table (2=0.5, 3=0.5, after a share out of range is marked on its row) with 4
    training boards, applied: the decision and the stage it queues carry the mix, and a worker trains that stage of
    the tiny policy (one GRPO step over all four boards) on two boards of each count, as its log on the Train tab
    says. The tiny policy writes two-agent plans only, so its three-agent boards score 0: expected."""
    from lab.jobs.worker import run_worker as work
    from storage.models import Job, TrainingLog
    from training.stage import run_stage_job

    url, engine, ids = lab
    run_id = ids["waiting"]
    with session(engine) as s:  # stage 0 evaluated the tiny policy as shipped; its stage 1 at a tiny budget
        stage0 = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 0)).one()
        stage0.checkpoint = "tiny"
        run = s.get(Run, run_id)
        run.settings = run.settings.model_copy(update={
            "grpo": {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 8}, "validation_boards": 1})
        s.add_all([stage0, run])
        s.commit()
    goto(page, f"{url}?proposal={ids['pending']}")
    page.locator("#proposal-status").get_by_text("Waiting for a decision").wait_for()
    page.get_by_text("Edit before applying").click()
    edit_cell(page, "edit-agents", 1, 1, "1.5")  # agent_ratio[3]: out of range, marked on its row
    page.locator("#edit-check").get_by_text("✗ This edit cannot be applied: agent_ratio[3] = 1.5 is outside "
                                            "0..1.").wait_for()
    cell = page.locator('#edit-agents [data-testid="cell-1-1"]')
    assert cell.evaluate("c => getComputedStyle(c).backgroundColor") == "rgb(253, 226, 226)"
    assert page.locator("#submit-edit").is_disabled()
    edit_cell(page, "edit-agents", 1, 1, "0.5")
    edit_cell(page, "edit-agents", 0, 1, "0.5")
    page.locator("#edit-instances input").fill("4")
    stored = "agent_ratio[2] 0.5, agent_ratio[3] 0.5, num_instances 4"
    page.locator("#edit-check").get_by_text(f"will store: {stored}").wait_for()
    assert page.locator("#submit-edit").is_enabled()
    page.click("#submit-edit")
    page.locator("#decision-msg").get_by_text(f"Proposal #{ids['pending']} edited by local; stored: {stored}. "
                                              "Next: queued stage 1").wait_for()
    page.locator('#edit-agents [data-testid="cell-1-1"]').get_by_text("0.5").wait_for()  # the mix as stored
    d = decisions(engine)[-1]
    assert (d.proposal_id, d.action, d.config.agent_ratio, d.config.num_instances) == (
        ids["pending"], "edit", {2: 0.5, 3: 0.5}, 4)
    with session(engine) as s:
        stage = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 1)).one()
        job = s.exec(select(Job).where(Job.run_id == run_id, Job.kind == "stage").order_by(Job.id.desc())).first()
    assert stage.config == d.config and (job.status, job.payload) == ("queued", {"run_id": run_id, "stage_index": 1})
    assert work(engine, {"stage": run_stage_job}, WorkerOptions(once=True, poll_s=0.01)) == 1
    with session(engine) as s:
        job, stage = s.get(Job, job.id), s.get(Stage, stage.id)
        [step] = s.exec(select(TrainingLog).where(TrainingLog.run_id == run_id, TrainingLog.stage_index == 1)).all()
    trained = "generated 4/4 training boards (2 agents: 2, 3 agents: 2)"
    assert (job.status, stage.status, step.step, step.metrics["epoch"]) == ("done", "done", 1, 1.0), job.error
    assert trained in job.log_tail
    page.get_by_role("tab", name="Train").click()
    page.wait_for_function("t => (document.querySelector('#log-tail textarea') || {}).value?.includes(t)", arg=trained,
                           timeout=TIMEOUT_MS)


def test_measure_says_the_checkpoint_is_absent_measures_stage0_and_the_decision_keeps_what_was_shown(lab, page):
    from storage.models import Job
    from training.probe import run_probe_job

    url, engine, ids = lab
    goto(page, f"{url}?proposal={ids['second']}")
    page.get_by_text(f"Proposal #{ids['second']}").first.wait_for()
    page.get_by_text("Measure on the policy").click()
    page.click("#measure")
    page.locator("#measure-status").get_by_text("checkpoint is not on this machine").wait_for()
    page.click("#measure-stage0")
    page.locator("#measure-status").get_by_text("on the stage-0 policy").wait_for()
    with session(engine) as s:  # a tiny budget for the test: 2 boards per size, 2 answers each
        job = s.exec(select(Job).where(Job.kind == "probe")).one()
        job.payload = {**job.payload, "boards": 2, "answers": 2}
        s.add(job)
        s.commit()
    assert run_worker(engine, {"probe": run_probe_job}, WorkerOptions(once=True, poll_s=0.01))
    page.locator("#measure-table").get_by_text("boards with signal").last.wait_for()  # the panel's timer polled it
    page.click("#accept")
    page.get_by_text(f"Proposal #{ids['second']} accepted by local").wait_for()
    with session(engine) as s:
        keys = sorted(s.get(Job, job.id).result["probes"].values())
    assert sorted(decisions(engine)[-1].probes) == keys and len(keys) >= 2


def open_run(page, label: str) -> None:
    """Pick a run in the "Open run" dropdown above the tabs, as a person does."""
    page.locator("#run-pick input").click()
    page.get_by_role("option", name=label).click()


def test_a_note_is_stored_with_its_own_decision_only(lab, page):
    """Reject one proposal with a note, then accept another: the note went with the rejection, the box is empty
    for the next decision, and the accept stores no reason of its own."""
    from playwright.sync_api import expect

    url, engine, ids = lab
    goto(page, f"{url}?proposal={ids['pending']}")
    page.locator("#proposal-status").get_by_text("Waiting for a decision").wait_for()
    note = page.locator("#decision-note textarea")
    note.fill("too easy: every size solved")
    page.click("#reject")
    page.locator("#decision-msg").get_by_text(f"Proposal #{ids['pending']} rejected by local").wait_for()
    expect(note).to_have_value("")  # emptied by the decision
    note.fill("typed, then another proposal opened")
    open_run(page, f"#{ids['history']} curriculum (waiting)")
    page.locator("#proposal-status").get_by_text(f"Proposal #{ids['second']}").wait_for()
    expect(note).to_have_value("")  # emptied when another proposal opens
    page.click("#accept")
    page.locator("#decision-msg").get_by_text(f"Proposal #{ids['second']} accepted by local").wait_for()
    stored = {d.proposal_id: (d.action, d.note) for d in decisions(engine)}
    assert stored[ids["pending"]] == ("reject", "too easy: every size solved")
    assert stored[ids["second"]] == ("accept", "")


def test_a_note_typed_while_the_page_loads_is_kept_for_its_decision(lab, page, monkeypatch):
    """The page's first answer comes late (its read of the link is slowed down); meanwhile a person opens the
    Proposal tab and types a note. The answer draws the proposal around the note without emptying the box: the
    note is stored with the rejection."""
    from playwright.sync_api import expect

    url, engine, ids = lab
    read_link = app.linked

    def slow_link(*args, **kwargs):
        time.sleep(3)
        return read_link(*args, **kwargs)

    monkeypatch.setattr(app, "linked", slow_link)
    goto(page, f"{url}?proposal={ids['pending']}")
    page.get_by_role("tab", name="Proposal").click()
    note = page.locator("#decision-note textarea")
    note.fill("typed before the page had drawn")
    page.locator("#proposal-status").get_by_text("Waiting for a decision").wait_for()
    expect(note).to_have_value("typed before the page had drawn")
    page.click("#reject")
    page.locator("#decision-msg").get_by_text(f"Proposal #{ids['pending']} rejected by local").wait_for()
    expect(note).to_have_value("")
    assert [(d.action, d.note) for d in decisions(engine) if d.proposal_id == ids["pending"]] == [
        ("reject", "typed before the page had drawn")]


PLOTLY_FETCHED = "() => performance.getEntriesByType('resource').some(e => /\\/PlotlyPlot-[^/]*\\.js$/.test(e.name))"


@pytest.mark.parametrize("warmed", [True, False], ids=["as-served", "without-the-warm-up"])
def test_plotly_is_loaded_before_any_plot_and_no_run_history_is_kept(lab, page, monkeypatch, warmed):
    """The page loads Gradio's Plotly bundle once it is idle after its load, with no plot drawn yet (without the
    warm-up in its head, it does not: Gradio imports it for the first plot), and Gradio's run history, which would
    rewrite every event's inputs and outputs into the browser's storage, is off: nothing is kept there."""
    url, engine, ids = lab
    if not warmed:  # the page served again, without the script in its head
        monkeypatch.setattr(app, "plotly_warmup", lambda: "")
        demo = app.build_demo(engine)
        port = free_port()
        app.launch(demo, port=port, block=False)
        url = f"http://127.0.0.1:{port}/"
    try:
        goto(page, url)  # the Runs tab: no plot on it
        page.locator("#run-pick input").wait_for()
        if warmed:
            page.wait_for_function(PLOTLY_FETCHED, timeout=TIMEOUT_MS)
        else:
            time.sleep(3)
        assert page.evaluate(PLOTLY_FETCHED) is warmed
        assert page.evaluate("() => document.querySelectorAll('.js-plotly-plot').length") == 0
        open_run(page, f"#{ids['waiting']} ")
        page.get_by_role("tab", name="Train").click()
        page.locator("#train-status").get_by_text(f"Run #{ids['waiting']} ").wait_for()
        assert page.evaluate("() => Object.keys(localStorage).filter(k => k.startsWith('gradio:run-history'))") == []
    finally:
        if not warmed:
            demo.close()




TEXTS_SEEN = """() => { window.__texts = new Set();
  setInterval(() => { for (const id of ['proposal-status', 'worker-status', 'decision-msg', 'measure-status']) {
    const e = document.getElementById(id); if (e) window.__texts.add(e.innerText); } }, 20); }"""


def test_the_status_lines_show_no_timer_text_as_the_page_loads_and_polls(lab, page):
    """Gradio draws an event's timer text ("0.1s", "processing | 0.1/0.2s", "queue: 1/1") on its outputs even with
    its progress hidden: the page's load and its polls (three of them) leave every status line as written."""
    url, engine, ids = lab
    page.add_init_script(f"({TEXTS_SEEN})()")
    goto(page, f"{url}?proposal={ids['second']}")
    page.locator("#proposal-status").get_by_text(f"Proposal #{ids['second']}").wait_for()
    time.sleep(3 * app.POLL_S + 0.5)
    texts = page.evaluate("Array.from(window.__texts)")
    assert any(t.startswith(f"Proposal #{ids['second']} by the heuristic engineer") for t in texts)
    assert [t for t in texts if re.search(r"\d\.\ds|queue:|processing", t)] == []


def test_switching_runs_while_a_worker_writes_shows_no_error(lab, page):
    """Twenty switches of the open run while a writer beside the page keeps storing decisions and proposals, about
    one of each a second (so the poll, every 2 s, redraws the tabs meanwhile): each switch opens the run in every
    tab, and not one error box appears."""
    from playwright.sync_api import expect

    from tests.seeded import propose

    url, engine, ids = lab
    stop = threading.Event()

    def writes() -> None:  # a rejection and the engineer's next proposal, over and over
        pending = ids["second"]
        while not stop.is_set():
            with session(engine) as s:
                decide(s, pending, "reject", "bot")
            pending = propose(engine, ids["history"])
            time.sleep(1.0)

    page.add_init_script(f"({ERRORS_SEEN})()")
    goto(page, f"{url}?proposal={ids['second']}")  # the Proposal tab, whose dropdown changes most
    page.locator("#proposal-status").get_by_text(f"Proposal #{ids['second']}").wait_for()
    writer = threading.Thread(target=writes, daemon=True)
    writer.start()
    try:
        labels = {ids["history"]: "curriculum", ids["waiting"]: "llm engineer"}
        for turn in range(20):
            run_id = (ids["history"], ids["waiting"])[turn % 2]
            page.locator("#run-pick input").click()
            page.get_by_role("option", name=f"#{run_id} {labels[run_id]}", exact=False).first.click()
            if run_id == ids["waiting"]:  # its one proposal
                expect(page.locator("#proposal-pick input")).to_have_value(
                    f"#{ids['pending']} for stage 1: waits for your decision", timeout=TIMEOUT_MS)
            else:  # the one the writer stored last, or the one before it
                page.locator("#proposal-status").get_by_text("after stage 1, for stage 2").wait_for()
    except Exception:
        print("errors seen:", page.evaluate("window.__errors")[:10], "open run:",
              page.locator("#run-pick input").input_value())
        raise
    finally:
        stop.set()
        writer.join(timeout=30)
    time.sleep(2 * app.POLL_S)  # a poll or two after the last switch
    assert page.evaluate("window.__errors") == []
    with session(engine) as s:
        assert len(list(s.exec(select(Decision).where(Decision.user == "bot")))) >= 3  # the writer did write


def counted(calls: list[str], name: str, expected: int, quiet_s: float = 1.0) -> int:
    """How many times the server ran `name`, once it has run `expected` times (or a minute has passed) and then
    nothing more for `quiet_s`: on a busy machine an event's answer can come seconds after the click."""
    deadline = time.monotonic() + 60
    while calls.count(name) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = len(calls)
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        time.sleep(0.05)
        if len(calls) != seen:
            seen, quiet_since = len(calls), time.monotonic()
    return calls.count(name)


def test_each_action_asks_the_server_once_and_hidden_tabs_wait_until_opened(browser, page, tmp_path: Path,
                                                                           seeded_template):
    """A run picked, a failure row clicked and a tab opened each run one event on the server (Gradio's dropdown
    fires `input` twice per pick: the page listens to `select`); a run picked draws the tab shown, and the other
    tabs a run fills are drawn for it when opened (Stage review's four plots in the answer after its gallery); the
    Playground and the Leaderboard are drawn when first opened, not as the page loads, and a board being worked on
    stays when the Playground is opened again."""
    engine, ids = seeded_copy(seeded_template, tmp_path / "lab.db")
    demo = app.build_demo(engine)
    calls: list[str] = []

    def called(fn, args) -> None:
        name = fn.__qualname__.split(".<locals>.")[-1]
        # Gradio fires a State's change as the browser mounts it (at a moment of its own: as the page loads, or as
        # its tab is first opened), here with nothing due: that answer draws nothing and is not counted
        if not (name == "ReviewTab.plots" and args == (None,)):
            calls.append(name)

    for block_fn in demo.fns.values():  # each event's function counted (its signature kept for Gradio)
        if block_fn.fn is None:  # an event run in the browser only (the tab shown, noted as a tab is clicked)
            continue
        block_fn.fn = functools.wraps(block_fn.fn)(
            lambda *args, _fn=block_fn.fn, **kwargs: (called(_fn, args), _fn(*args, **kwargs))[1])
    port = free_port()
    app.launch(demo, port=port, block=False)
    try:
        goto(page, f"http://127.0.0.1:{port}/?run={ids['history']}")
        page.get_by_role("tab", name="Train").click()
        page.locator("#train-status").get_by_text(f"Run #{ids['history']} ").wait_for()
        assert counted(calls, "on_load", 1) == 1
        assert not {"PlaygroundTab.first_visit", "LeaderboardTab.opened"} & set(calls)  # not drawn yet

        calls.clear()
        page.locator("#run-pick input").click()
        page.get_by_role("option", name=f"#{ids['waiting']} ", exact=False).first.click()
        page.locator("#train-status").get_by_text(f"Run #{ids['waiting']} ").wait_for()
        assert counted(calls, "picked", 1) == 1

        # The pick drew the tab shown; the Proposal tab is drawn for the run picked when opened, once
        calls.clear()
        page.get_by_role("tab", name="Proposal").click()
        page.locator("#proposal-status").get_by_text(f"Proposal #{ids['pending']} ").wait_for()
        page.get_by_role("tab", name="Train").click()  # each tab opened asks once (here: already drawn)
        page.get_by_role("tab", name="Proposal").click()
        assert counted(calls, "opened", 3) == 3
        assert page.locator("#train-status").get_by_text(f"Run #{ids['waiting']} ").count() == 1
        assert page.locator("#proposal-status").get_by_text(f"Proposal #{ids['pending']} ").count() == 1

        calls.clear()
        goto(page, f"http://127.0.0.1:{port}/?run={ids['history']}")
        page.locator("#run-pick input").wait_for()
        assert counted(calls, "on_load", 1) == 1  # the page's first answer in, as a person sees the page first
        page.get_by_role("tab", name="Stage review").click()  # the gallery, then its four plots in the next answer
        page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')]"
                               ".filter(d => d.data && d.data.length && d.offsetParent).length === 4")
        page.locator("#gallery [role=gridcell]", has_text="vertex_conflict").first.wait_for()
        assert counted(calls, "ReviewTab.plots", 1) == 1, calls
        calls.clear()
        page.locator("#gallery [role=gridcell]", has_text="vertex_conflict").first.click()
        wait_plotted(page, "replay", "agent 0", [(0, 1)])
        assert counted(calls, "open_from_gallery", 1) == 1 and "EpisodeTab.show" not in calls  # one answer

        calls.clear()
        page.get_by_role("tab", name="Playground").click()
        page.locator("#pg-board-plot .js-plotly-plot").wait_for()
        assert counted(calls, "PlaygroundTab.first_visit", 1) == 1
        page.fill("#pg-board textarea", "A..\n...\n..a")
        page.get_by_role("button", name="Read board").click()
        page.wait_for_function("() => [...document.querySelector('#pg-board-plot .js-plotly-plot').data]"
                               ".some(t => t.name === 'agent 0' && t.x.length === 1 && t.x[0] === 0)")
        page.get_by_role("tab", name="Leaderboard").click()
        page.locator("#lb-reference").wait_for()
        assert counted(calls, "LeaderboardTab.opened", 1) == 1
        page.get_by_role("tab", name="Playground").click()
        time.sleep(1)
        assert page.locator("#pg-board textarea").input_value() == "A..\n...\n..a"  # the board worked on stays
    finally:
        demo.close()
        engine.dispose()


# ---------------------------------------------------------------- a restart of `envlab serve` mid-stage

RESTART_GRPO = {"max_steps": 500, "num_generations": 2, "per_device_train_batch_size": 4, "save_steps": 1}
STAGE_WAIT_S = 240  # for a worker's child to start and train (it imports the training stack; 20-40 s here)
BUTTON_IDS = {"queue": "queue-next", "resume": "resume", "cancel": "cancel"}

BUTTONS_SHOWN = """ids => ids.map(id => { const b = document.getElementById(id);
    return b && [b.innerText.trim(), !b.disabled, ['primary', 'secondary', 'stop'].find(v => b.classList.contains(v))];
})"""


def serve(db: Path, runs: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """`envlab serve` on `db` (its worker and probe lane beside it), in a session of its own as a terminal starts
    it, its output in `log`; returns it and its URL once it answers."""
    port = free_port()
    env = {**os.environ, "ENVLAB_RUNS": str(runs), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    # As a terminal starts it: SIGINT at its default. A test process may have it ignored (an ignored signal stays
    # ignored through exec, and Python then leaves Ctrl+C ignored), so the command resets it before it execs.
    command = [sys.executable, "-m", "lab.cli", "serve", "--no-example", "--port", str(port), "--db", str(db)]
    terminal = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                "os.execv(sys.executable, sys.argv[1:])")
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", terminal, *command], env=env, cwd=db.parent, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url, deadline = f"http://127.0.0.1:{port}/", time.monotonic() + STAGE_WAIT_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    pytest.fail(f"envlab serve did not answer ({proc.poll()}):\n{log.read_text()[-3000:]}")


def stop_serving(proc: subprocess.Popen) -> None:
    """The page stopped as a test's cleanup: SIGTERM, then SIGKILL to its whole session after a minute."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_job(engine, job_id: int, ready, what: str):
    """The job's row once `ready(row)` holds, within STAGE_WAIT_S (the worker's child starts cold)."""
    from storage.models import Job

    deadline = time.monotonic() + STAGE_WAIT_S
    while True:
        with session(engine) as s:
            row = s.get(Job, job_id)
        if ready(row):
            return row
        assert time.monotonic() < deadline, f"{what}: job {job_id} is {row.status} at step {row.step}:\n{row.log_tail}"
        time.sleep(0.3)


def wait_buttons(page, status) -> None:
    """The Train tab's three run buttons as `train.button_states(status)` gives them: each label, whether it can be
    pressed, and its variant."""
    from lab.pages import train

    labels = {"queue": "Queue what comes next", "resume": "Resume (retry what failed)", "cancel": "Cancel this run"}
    want = [[labels[name], state["interactive"], state["variant"]]
            for name, state in train.button_states(status).items()]
    ids = [BUTTON_IDS[name] for name in train.button_states(status)]
    try:
        page.wait_for_function(f"([ids, want]) => JSON.stringify(({BUTTONS_SHOWN})(ids)) === JSON.stringify(want)",
                               arg=[ids, want])
    except Exception:
        print("buttons shown:", page.evaluate(BUTTONS_SHOWN, ids), "wanted:", want)
        raise


def test_ctrl_c_mid_stage_hands_the_job_back_and_the_next_start_resumes_it_on_the_train_tab(page, tmp_path: Path,
                                                                                           seeded_template):
    """`envlab serve` trains stage 1 of a run (the tiny policy, a TRL checkpoint every GRPO step) in its worker and
    is stopped by Ctrl+C (SIGINT to its process group) mid-stage: its output says once that the job was handed back
    and shows no traceback; the job is queued again with its last checkpoint, the stage reads queued, not failed.
    Started again on the same database, the page's new worker takes the job by itself and the stage resumes from
    that checkpoint: the Train tab says the stage is running, the run's buttons are those of an active run, the
    worker's badge is busy with a fresh heartbeat (no stale line). Cancelled from the tab, the job stops at its next
    step and the buttons are those of a cancelled run."""
    from playwright.sync_api import expect

    from storage.models import Job, RunStatus
    from tests.stage_beside import queue_stage

    db, runs = tmp_path / "lab.db", tmp_path / "runs"
    engine, ids = seeded_copy(seeded_template, db)
    run_id = queue_stage(engine, ids, RESTART_GRPO)
    with session(engine) as s:
        job_id = s.exec(select(Job.id).where(Job.run_id == run_id, Job.kind == "stage", Job.target == 1)).one()

    first, _ = serve(db, runs, tmp_path / "serve-1.log")
    try:
        claimed = wait_job(engine, job_id, lambda j: j.status == "running" and j.step >= 1 and j.result, "training")
        assert claimed.heartbeat_at is not None and claimed.worker.startswith(f"{socket.gethostname()}:")
        os.killpg(first.pid, signal.SIGINT)  # Ctrl+C: the terminal's SIGINT to the page's process group
        try:
            assert first.wait(timeout=90) == 0
        except subprocess.TimeoutExpired:  # say where the page is: it prints every thread's stack on SIGUSR1
            os.kill(first.pid, signal.SIGUSR1)
            time.sleep(2)
            pytest.fail("envlab serve did not stop within 90 s of Ctrl+C; its threads:\n"
                        + (tmp_path / "serve-1.log").read_text()[-6000:])
    finally:
        stop_serving(first)
    said = (tmp_path / "serve-1.log").read_text()
    assert said.count("handed back to the queue") == 1 and f"job {job_id} (stage) handed back to the queue" in said, \
        said[-3000:]
    assert "Traceback" not in said and "stopped at once" not in said, said[-3000:]  # one signal: saved, then back
    with session(engine) as s:
        back = s.get(Job, job_id)
        stage = s.exec(select(Stage).where(Stage.run_id == run_id, Stage.index == 1)).one()
    checkpoint = back.result["checkpoint"]
    assert (back.status, back.attempts, back.worker, stage.status) == ("queued", 0, None, "queued")
    assert Path(checkpoint).is_dir() and Path(checkpoint).is_relative_to(runs)
    assert (Path(checkpoint).parent.parent.name, Path(checkpoint).parent.name) == ("stage-1", "trl")

    second, url = serve(db, runs, tmp_path / "serve-2.log")
    try:
        goto(page, f"{url}?run={run_id}")
        page.get_by_role("tab", name="Train").click()
        status = page.locator("#train-status")
        status.get_by_text(f"Run #{run_id} llm engineer is active").wait_for()
        page.wait_for_function("t => (document.querySelector('#log-tail textarea') || {}).value?.includes(t)",
                               arg=f"resuming from {checkpoint}", timeout=STAGE_WAIT_S * 1000)
        status.get_by_text("stages: 0 done, 1 running.").wait_for()
        page.locator('#job-progress[data-status="running"]').wait_for()
        wait_buttons(page, RunStatus.ACTIVE)
        badge = page.locator("#worker-status .worker")
        expect(badge).to_have_class(re.compile(r"\bbusy\b"))
        expect(badge).to_contain_text(f"Worker busy: stage job {job_id}")
        expect(page.locator("#worker-status")).not_to_contain_text("has sent no heartbeat")
        expect(status).not_to_contain_text("failed")

        page.click("#cancel")  # the first click asks, the second cancels
        page.locator("#train-msg").get_by_text(f"Cancel run #{run_id}? Its queued and running jobs stop.").wait_for()
        expect(page.locator("#cancel")).to_have_text("Confirm cancel")
        page.click("#cancel")
        page.locator("#train-msg").get_by_text(f"Run #{run_id} is cancelled. Cancel requested for job(s) {job_id}")\
            .wait_for()
        wait_job(engine, job_id, lambda j: j.status == "cancelled", "cancel")
        status.get_by_text(f"Run #{run_id} llm engineer is cancelled").wait_for()
        expect(status).to_contain_text("stages: 0 done, 1 cancelled.")  # not "failed": a person stopped it
        wait_buttons(page, RunStatus.CANCELLED)
    finally:
        stop_serving(second)
        engine.dispose()
    assert "Traceback" not in (tmp_path / "serve-2.log").read_text()


@pytest.mark.parametrize("size", [5, 10])
def test_a_five_agent_board_s_numbers_overlap_nothing_as_chromium_draws_them(page, tmp_path: Path, size: int):
    """The board of five agents the issue saw (starts 1 and 4 side by side, agent 2's start up and left of agent
    0's), drawn by Plotly in Chromium as the page draws it, on 5x5 and on 10x10 (the largest size, whose figure is
    taller): no start or goal number touches another, nor any disc."""
    import plotly.io as pio

    from envsim.instance import Instance
    from envsim.solver import label
    from lab.pages import figures
    from tests.pages.test_figures import FIVE

    rows = [row + "." * (size - 5) for row in FIVE.picture().split()]
    board = label(Instance.from_str("\n".join(rows[:4] + ["." * size] * (size - 5) + rows[4:])))
    path = tmp_path / "five.html"
    pio.write_html(figures.board_figure(board), str(path), include_plotlyjs=True, full_html=True)
    page.goto(path.as_uri())
    page.locator(".scatterlayer .trace").first.wait_for()
    boxes = page.evaluate("""() => {
        const out = {};
        for (const g of document.querySelectorAll('.scatterlayer .trace')) {
            const name = g.__data__[0].trace.name;
            const marks = name.startsWith('agent') ? g.querySelectorAll('path.point') : g.querySelectorAll('text');
            out[name] = Array.from(marks).map(m => { const r = m.getBoundingClientRect();
                return [r.left, r.top, r.right, r.bottom]; });
        }
        return out;
    }""")
    numbers = [(name, i, box) for name in ("starts", "goal numbers") for i, box in enumerate(boxes[name])]
    discs = [(f"agent {i}", 0, boxes[f"agent {i}"][0]) for i in range(5)]
    assert len(numbers) == 10 and all(box[2] > box[0] and box[3] > box[1] for _, _, box in numbers + discs)

    def overlap(a, b) -> bool:
        return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

    touching = [(m[:2], n[:2]) for k, m in enumerate(numbers) for n in numbers[k + 1:] + discs if overlap(m[2], n[2])]
    assert touching == []


def test_cancel_asks_before_it_cancels_and_the_stage_then_reads_cancelled(lab, page):
    from playwright.sync_api import expect

    from lab.pages import proposal

    url, engine, ids = lab
    run_id = ids["waiting"]
    proposal.decide_proposal(engine, ids["pending"], "accept", "alice")  # stage 1 queued
    goto(page, f"{url}?run={run_id}")
    page.get_by_role("tab", name="Train").click()
    page.locator("#train-status").get_by_text("stages: 0 done, 1 queued.").wait_for()
    page.click("#cancel")
    page.locator("#train-msg").get_by_text(f"Cancel run #{run_id}? Its queued and running jobs stop.").wait_for()
    expect(page.locator("#cancel")).to_have_text("Confirm cancel")
    with session(engine) as s:  # asked, not cancelled
        assert s.get(Run, run_id).status == "active"
    page.click("#cancel")
    page.locator("#train-msg").get_by_text(f"Run #{run_id} is cancelled. Cancel requested for job").wait_for()
    expect(page.locator("#cancel")).to_have_text("Cancel this run")
    expect(page.locator("#train-status")).to_contain_text("stages: 0 done, 1 cancelled.")
