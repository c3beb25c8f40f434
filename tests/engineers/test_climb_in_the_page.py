"""A new engineer end to end, in the browser: a run whose engineer is `climb` (lab/engineers/climb.py) proposes
through the real propose job, the page shows its proposal and its reasons, and a person accepts it; the stage it
queues trains on the proposed config. After that stage, `climb` reads its own gain and moves the next knob, and that
proposal too reaches the open page and is accepted there."""

from __future__ import annotations

from pathlib import Path

from sqlmodel import select

from envsim.config import EnvConfig
from lab.engineers.climb import HOLE_STEP, WAIT_STEP
from lab.loop import create_run, stages_of
from lab.pages import web as app
from storage.db import make_engine, session, upgrade
from storage.models import Decision, Proposal
from storage.settings import RunSettings
from tests.seeded import finish_stage, propose
from tests.servers import free_port, goto

SIZES = (3, 4)


def test_climb_proposes_a_step_a_person_accepts_and_it_climbs_on_from_its_own_gain(tmp_path: Path, page):
    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    start = EnvConfig.default(sizes=SIZES, num_instances=16)
    with session(engine) as s:
        run_id = create_run(s, name="climbing", config=start, settings=RunSettings(stages=3), engineer="climb").id
    finish_stage(engine, run_id, 0)
    first = propose(engine, run_id)
    demo = app.build_demo(engine)
    port = free_port()
    app.launch(demo, port=port, block=False)
    try:
        goto(page, f"http://127.0.0.1:{port}/?proposal={first}")
        page.get_by_text("from the config in force (no stage has gained yet)").first.wait_for()
        page.get_by_text("dev gains of the trained stages: none yet").first.wait_for()
        page.click("#accept")
        page.get_by_text("Next: queued stage 1").wait_for()
        with session(engine) as s:
            proposed = s.get(Proposal, first).projected_config
            stage1 = EnvConfig.model_validate(stages_of(s, run_id)[1].config)
            assert [(d.proposal_id, d.action) for d in s.exec(select(Decision))] == [(first, "accept")]
        assert stage1 == proposed  # the stage trains on what was accepted
        moved = {size: round(stage1.hole_ratio[size] - start.hole_ratio[size], 4) for size in SIZES}
        assert moved in ({3: HOLE_STEP, 4: HOLE_STEP}, {3: -HOLE_STEP, 4: -HOLE_STEP})  # round 1: the holes knob

        finish_stage(engine, run_id, 1)  # stage 1 trained and evaluated; the engineer reads its gain
        second = propose(engine, run_id)
        with session(engine) as s:
            rationale = s.get(Proposal, second).rationale
        gain_line, _, move_line = rationale.splitlines()[:3]
        assert gain_line.startswith("dev gains of the trained stages: stage 1: ")
        assert move_line.startswith(("waits up: ", "waits down: "))  # round 2: the waits knob
        page.get_by_text(gain_line).first.wait_for()  # the open page follows the run to its new proposal
        page.get_by_text(move_line).first.wait_for()
        page.click("#accept")
        page.get_by_text("Next: queued stage 2").wait_for()
        with session(engine) as s:
            assert [(d.proposal_id, d.action) for d in s.exec(select(Decision).order_by(Decision.id))] == [
                (first, "accept"), (second, "accept")]
            configs = [EnvConfig.model_validate(st.config) for st in stages_of(s, run_id)]
            assert configs[2] == s.get(Proposal, second).projected_config
        # from stage 1's config (the best known where it gained, else the config in force: the same one here),
        # the holes kept and the waits stepped one way at every size
        assert configs[2].hole_ratio == configs[1].hole_ratio
        waits = {size: round(configs[2].wait_ratio[size] - configs[1].wait_ratio[size], 4) for size in SIZES}
        assert waits in ({3: WAIT_STEP, 4: WAIT_STEP}, {3: -WAIT_STEP, 4: -WAIT_STEP})
    finally:
        demo.close()
        engine.dispose()
