"""A run on 2 to 5 agents, as a newcomer makes it, through three stages in Chromium with no hand edit.

The run is created from the Runs form (a mix over 2, 3, 4 and 5 agents, the engineer and the rest at their
defaults), a real `envlab worker` beside the page (its own process, as `envlab serve` starts it) evaluates and
trains it with the tiny policy at a tiny budget (one GRPO step a stage, 6 validation boards, 3 dev boards per
cell), the default engineer proposes after each stage and a person clicks Accept, twice. Issue 63's first item: a
run of these counts needed a hand edit at every stage, as its proposals asked for boards the generator could not
draw. Needs Playwright and Debian's Chromium (tests/conftest.py's `page`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from playwright.sync_api import TimeoutError as PlaywrightTimeout
from sqlmodel import select

from lab.jobs.worker import start_worker
from lab.pages import web as app
from storage.db import make_engine, session, upgrade
from storage.models import Decision, Job, Run, Stage
from tests.servers import free_port, goto

MIX = "2=0.25, 3=0.25, 4=0.25, 5=0.25"
BUDGET = {"grpo": {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4},
          "validation_boards": 6, "dev_per_size": 3}
UI_WAIT_MS = 60_000  # an answer of the page beside a stage training on a loaded 2-core machine (load 20 seen)
STAGE_WAIT_MS = 300_000  # a stage on a loaded 2-core machine (the worker's first job starts its zygote: torch, TRL)
# Stage 0: the tiny policy as shipped, greedy, on the 6 validation boards spread over 3, 4 and 5 agents: its failed
# 4- and 5-agent episodes (id, size, agents, failure, what happened), as the gallery lists them.
FAILED_4 = [["4", "6", "4", "edge_conflict",
             "edge_conflict: agents 1 and 3 swap cells, agent 1 moving into (4,2), t=4"],
            ["5", "10", "4", "hole", "hole: agent 0 falls into the hole at (8,6), t=3 (+1 more events)"]]
FAILED_5 = [["6", "7", "5", "vertex_conflict", "vertex_conflict: agents 0 and 3 at (2,3), t=3"]]

GALLERY = """() => Array.from(document.querySelectorAll('#gallery [role=row]'))
    .map(row => Array.from(row.querySelectorAll('[role=gridcell]')).map(cell => cell.innerText.trim()))
    .filter(cells => cells.length)"""


def gallery_shows(page, rows: list[list[str]]) -> None:
    """Wait until the failure gallery lists exactly `rows`; else fail saying what it lists."""
    try:
        page.wait_for_function(f"want => JSON.stringify(({GALLERY})()) === JSON.stringify(want)", arg=rows)
    except PlaywrightTimeout:
        raise AssertionError(f"the gallery lists {page.evaluate(GALLERY)}, not {rows} (its note: "
                             f"{page.locator('#gallery-note').inner_text()!r})") from None


def pick(page, elem_id: str, option: str) -> None:
    """Pick `option` in the Gradio dropdown `elem_id`."""
    page.locator(f"#{elem_id} input").first.click()
    page.get_by_role("option", name=option, exact=True).click()


def accept_the_waiting_proposal(page, proposal_id: int, after_stage: int) -> None:
    """The waiting banner names the proposal; its link opens it in the Proposal tab, whose Accept is the main button
    (the proposal did not fail), and the click queues the next stage."""
    page.locator("#waiting").get_by_text(f"Proposal #{proposal_id} waits for your decision").wait_for(
        timeout=STAGE_WAIT_MS)
    page.locator("#waiting a", has_text=f"Proposal #{proposal_id}").click()
    status = page.locator("#proposal-status")
    status.get_by_text("Waiting for a decision.").wait_for()
    assert "failed" not in status.inner_text()
    accept = page.locator("#accept")
    assert accept.is_enabled() and "primary" in accept.get_attribute("class")
    accept.click()
    shows(page, "#decision-msg", f"✓ Proposal #{proposal_id} accepted by local. Next: queued stage {after_stage + 1} "
          "(accept by local).")


def shows(page, selector: str, text: str, timeout: float | None = None) -> None:
    """Wait until the element `selector` shows `text`; else fail saying what it shows."""
    try:
        page.locator(selector).get_by_text(text).wait_for(timeout=timeout)
    except PlaywrightTimeout:
        raise AssertionError(f"{selector} shows {page.locator(selector).inner_text()!r}, not {text!r}") from None


def test_a_two_to_five_agent_run_goes_through_three_stages_with_accept_clicks_only(tmp_path: Path, page,
                                                                                  monkeypatch):
    page.set_default_timeout(UI_WAIT_MS)
    runs = tmp_path / "runs"
    monkeypatch.setenv("ENVLAB_RUNS", str(runs))
    db = tmp_path / "lab.db"
    engine = make_engine(str(db))
    upgrade(engine)
    demo = app.build_demo(engine)
    port = free_port()
    app.launch(demo, port=port, block=False)
    worker: subprocess.Popen | None = None
    try:
        goto(page, f"http://127.0.0.1:{port}/")
        page.locator("#new-name textarea, #new-name input").first.fill("mixed")
        page.get_by_label("Training stages").fill("2")
        page.get_by_label("Training instances per stage").fill("8")
        page.get_by_label("Agents per training board", exact=False).fill(MIX)
        page.locator("#new-agent-counts input, #new-agent-counts textarea").first.fill("2,3,4,5")
        page.click("#create-run")
        page.locator("#train-msg").get_by_text("Created run #1").wait_for()
        with session(engine) as s:  # the test's budget; what the form stored is checked first
            run = s.get(Run, 1)
            assert (run.settings.stages, run.settings.agent_counts, run.settings.validation_agents) == (
                2, (2, 3, 4, 5), (3, 4, 5))
            [stage0] = s.exec(select(Stage).where(Stage.run_id == 1)).all()
            assert stage0.config.agent_ratio == {2: 0.25, 3: 0.25, 4: 0.25, 5: 0.25}
            run.settings = run.settings.model_copy(update=BUDGET)
            s.add(run)
            s.commit()
        worker = start_worker(str(db), options=["--poll", "0.2"], log=tmp_path / "worker.log", die_with_parent=True,
                              env={"OMP_NUM_THREADS": "1", "ENVLAB_RUNS": str(runs)})

        accept_the_waiting_proposal(page, 1, after_stage=0)
        accept_the_waiting_proposal(page, 2, after_stage=1)
        page.get_by_role("tab", name="Train").click()
        shows(page, "#train-status", "Run #1 mixed is done: 2 of 2 training stages done; stages: 0 done, 1 done, "
              "2 done.", timeout=STAGE_WAIT_MS)

        page.get_by_role("tab", name="Runs").click()
        page.locator("#runs-table [role=gridcell]", has_text="2/2 trained").first.wait_for()

        page.get_by_role("tab", name="Stage review").click()  # the last stage first; stage 0's failures
        page.locator("#review-note").wait_for()
        pick(page, "review-stage", "stage 0 (done)")
        pick(page, "gallery-agents", "4")
        gallery_shows(page, FAILED_4)
        pick(page, "gallery-agents", "5")
        gallery_shows(page, FAILED_5)
        page.locator("#gallery [role=gridcell]", has_text=FAILED_5[0][4]).first.click()  # its replay
        shows(page, "#episode-header", "Episode 6: run #1, stage 0, validation board")
        assert "(7x7, 5 agents, optimal makespan " in page.locator("#episode-header").inner_text()
        page.wait_for_function("""() => { const d = document.querySelector('#replay .js-plotly-plot');
            return d && d.data && [0, 1, 2, 3, 4].every(i => d.data.some(t => t.name === `agent ${i}`)); }""")
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            worker.wait(timeout=60)
        demo.close()
        log = (tmp_path / "worker.log").read_text() if (tmp_path / "worker.log").exists() else ""
    assert "Traceback" not in log, log[-4000:]
    with session(engine) as s:
        decisions = [(d.proposal_id, d.action, d.user) for d in s.exec(select(Decision).order_by(Decision.id))]
        stages = [(st.index, st.status) for st in s.exec(select(Stage).where(Stage.run_id == 1).order_by(Stage.index))]
        jobs = [(j.kind, j.target, j.status, j.attempts) for j in s.exec(select(Job).order_by(Job.id))]
    engine.dispose()
    assert decisions == [(1, "accept", "local"), (2, "accept", "local")]  # no edit, no reject
    assert stages == [(0, "done"), (1, "done"), (2, "done")]
    assert jobs == [("stage", 0, "done", 1), ("propose", 0, "done", 1), ("stage", 1, "done", 1),
                    ("propose", 1, "done", 1), ("stage", 2, "done", 1)]
