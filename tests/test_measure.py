"""The Measure panel's data, without a browser: which configs are measured, the probe job on the real tiny policy,
the side-by-side table, an absent checkpoint, and the probes a decision keeps."""

from __future__ import annotations

from sqlmodel import select

from envsim.config import EnvConfig, mix_text
from lab.engineers import answer_of as _answer
from lab.jobs.worker import WorkerOptions, run_worker
from lab.loop import create_run
from lab.measurements import (
    EDIT,
    IN_FORCE,
    PROPOSED,
    measure_configs,
    measure_view,
    queue_measure,
    side_by_side,
)
from lab.pages.common import config_rows
from lab.pages.proposal import decide_proposal
from lab.proposals import store_proposal
from storage.db import session
from storage.models import Decision, Job, Probe, Stage
from storage.settings import RunSettings
from training.probe import ProbeResult, SizeProbe, run_probe_job

BASE = EnvConfig(data_ratio={3: 0.5, 4: 0.5}, hole_ratio={3: 0.2, 4: 0.2}, wait_ratio={3: 0.25, 4: 0.25},
                 num_agents=2, num_instances=8)
PROPOSAL = BASE.model_copy(update={"hole_ratio": {3: 0.3, 4: 0.1}})


def proposal_after(engine, stage_index: int = 0, checkpoint: str = "tiny", proposed: EnvConfig = PROPOSAL,
                   **options) -> int:
    """A run whose stages up to `stage_index` are done (the last with `checkpoint`) and a pending proposal."""
    with session(engine) as s:
        run = create_run(s, name="m", config=BASE, settings=RunSettings(stages=3, **options), engineer="heuristic",
                         seed=4)
        for k in range(stage_index + 1):
            stage = s.exec(select(Stage).where(Stage.run_id == run.id, Stage.index == k)).first() or \
                Stage(run_id=run.id, index=k, config=BASE.model_dump(mode="json"))
            stage.status, stage.checkpoint = "done", "tiny" if k == 0 else checkpoint
            s.add(stage)
        s.exec(select(Job)).all()
        for job in s.exec(select(Job)):
            job.status = "done"
            s.add(job)
        s.commit()
        return store_proposal(s, run.id, stage_index, "heuristic", _answer(proposed, BASE, "r"), BASE).id


def rows_of(config: EnvConfig) -> tuple[list, int, int]:
    return config_rows(config), mix_text(config.agent_ratio), config.num_instances


def test_the_configs_measured_are_in_force_proposed_and_an_edit_that_differs(empty_lab):
    pid = proposal_after(empty_lab)
    assert measure_configs(empty_lab, pid) == {IN_FORCE: BASE, PROPOSED: PROPOSAL}
    same = PROPOSAL.model_dump(mode="json")
    assert measure_configs(empty_lab, pid, same) == {IN_FORCE: BASE, PROPOSED: PROPOSAL}  # the edit is the proposal
    mine = BASE.model_copy(update={"hole_ratio": {3: 0.4, 4: 0.2}})
    assert measure_configs(empty_lab, pid, mine.model_dump(mode="json"))[EDIT] == mine


def test_an_edit_of_the_table_measures_the_proposals_random_share_as_a_decision_keeps_it(empty_lab):
    broad = EnvConfig(**{**PROPOSAL.model_dump(), "random_share": 0.5})
    pid = proposal_after(empty_lab, proposed=broad)
    rows, agents, instances = rows_of(broad.model_copy(update={"hole_ratio": {3: 0.4, 4: 0.1}}))
    from lab.pages.common import config_from_table

    mine = measure_configs(empty_lab, pid, config_from_table(rows, agents, instances))[EDIT]
    assert mine.random_share == 0.5 and mine.hole_ratio == {3: 0.4, 4: 0.1}


def test_a_bad_edit_is_refused_in_one_line_and_queues_nothing(empty_lab):
    pid = proposal_after(empty_lab)
    bad = {**BASE.model_dump(mode="json"), "hole_ratio": {"3": 0.9, "4": 0.2}}
    job_id, message = queue_measure(empty_lab, pid, bad)
    assert job_id is None and message.startswith("✗ Not measured: ") and "hole_ratio" in message
    assert "\n" not in message
    with session(empty_lab) as s:
        assert s.exec(select(Job).where(Job.kind == "probe")).all() == []


def test_an_absent_checkpoint_is_said_and_the_stage0_policy_offered(empty_lab):
    pid = proposal_after(empty_lab, stage_index=1, checkpoint="gone/stage-1/policy")
    job_id, message = queue_measure(empty_lab, pid)
    assert job_id is None and message.startswith("Stage 1's checkpoint is not on this machine (")
    assert message.endswith("measure the stage-0 policy instead?")
    job_id, message = queue_measure(empty_lab, pid, stage0=True)
    assert job_id is not None and "on the stage-0 policy" in message
    with session(empty_lab) as s:
        job = s.get(Job, job_id)
    assert (job.payload["checkpoint"], job.payload["policy_path"], job.target) == ("tiny", "tiny", 1)


def tiny_budget(engine, job_id: int) -> None:
    """A tiny budget for a test: 2 boards per size, 2 answers each."""
    with session(engine) as s:
        job = s.get(Job, job_id)
        job.payload = {**job.payload, "boards": 2, "answers": 2}
        s.add(job)
        s.commit()


def test_the_job_measures_on_the_worker_and_the_decision_keeps_what_was_seen(empty_lab):
    pid = proposal_after(empty_lab)
    rows, agents, instances = rows_of(PROPOSAL.model_copy(update={"hole_ratio": {3: 0.1, 4: 0.1}}))
    from lab.pages.common import config_from_table

    job_id, message = queue_measure(empty_lab, pid, config_from_table(rows, agents, instances))
    assert message.startswith(f"Measuring in force, proposed, your edit on the stage-0 policy (job {job_id})")
    assert queue_measure(empty_lab, pid)[1] == f"A measurement of this run's stage is under way already (job {job_id})."
    tiny_budget(empty_lab, job_id)
    view = measure_view(empty_lab, job_id)
    assert view.running and view.done == 0.0 and view.status.startswith(f"Measuring (job {job_id}, queued)")
    assert run_worker(empty_lab, {"probe": run_probe_job}, WorkerOptions(once=True, poll_s=0.01))
    view = measure_view(empty_lab, job_id)
    assert not view.running and view.done == 1.0 and view.headers == ["size", IN_FORCE, PROPOSED, EDIT]
    assert [r[0] for r in view.rows] == ["3x3", "4x4", "boards with signal"]
    with session(empty_lab) as s:
        probes = {p.key: p for p in s.exec(select(Probe))}
        job = s.get(Job, job_id)
    assert sorted(view.keys) == sorted(probes) and len(probes) == 3
    assert job.result["probes"][PROPOSED] in probes and job.step == job.total == 6
    # the edit's size 4 has the proposal's knobs (hole_ratio 0.1): reused, so only size 3 is sampled
    assert "your edit: 4 answers in" in job.log_tail
    assert "(1 of 2 sizes reused from an equal config measured before)" in job.log_tail
    with session(empty_lab) as s:  # while a job runs, the panel says where each config is
        running = s.get(Job, job_id)
        running.status, running.result = "running", {"progress": {IN_FORCE: "done, found in the cache",
                                                                  PROPOSED: "1 of 2 sizes measured", EDIT: "waiting"}}
        s.add(running)
        s.commit()
    assert measure_view(empty_lab, job_id).status == (
        f"Measuring (job {job_id}, running): **{IN_FORCE}**: done, found in the cache; **{PROPOSED}**: 1 of 2 sizes "
        f"measured; **{EDIT}**: waiting")
    with session(empty_lab) as s:
        running = s.get(Job, job_id)
        running.status, running.result = "done", job.result
        s.add(running)
        s.commit()
    # asked again: the same probes, from the table (nothing sampled)
    again, _ = queue_measure(empty_lab, pid, config_from_table(rows, agents, instances))
    tiny_budget(empty_lab, again)
    assert run_worker(empty_lab, {"probe": run_probe_job}, WorkerOptions(once=True, poll_s=0.01))
    assert measure_view(empty_lab, again).keys == view.keys
    with session(empty_lab) as s:
        assert "found in the cache" in s.get(Job, again).log_tail and len(s.exec(select(Probe)).all()) == 3
    said = decide_proposal(empty_lab, pid, "accept", "ana", probes=view.keys)
    assert said.startswith(f"✓ Proposal #{pid} accepted by ana.")
    with session(empty_lab) as s:
        assert s.exec(select(Decision)).one().probes == view.keys


def test_side_by_side_shows_p_learnability_and_the_verdict_per_size():
    T, F = True, False
    hard = ProbeResult({3: SizeProbe.of(3, [[F, F], [F, F]], [[F, F]] * 2),
                        4: SizeProbe.of(4, [[T, F], [F, F]], [[F, F]] * 2)}, {3: 0.5, 4: 0.5}, 8, 1.0)
    easy = ProbeResult({3: SizeProbe.of(3, [[T, T], [T, F]], [[F, F]] * 2)}, {3: 1.0}, 4, 1.0)
    headers, rows = side_by_side({IN_FORCE: hard, PROPOSED: easy})
    assert headers == ["size", IN_FORCE, PROPOSED]
    assert rows == [["3x3", "p 0%, learnability 0.000: too hard", "p 75%, learnability 0.125: learnable"],
                    ["4x4", "p 25%, learnability 0.125: learnable", "-"],
                    ["boards with signal", "25%", "50%"]]


def test_the_stage0_policy_is_the_runs_own_even_where_its_row_names_another_machines_folder(empty_lab):
    """An imported run (the shipped example) records stage 0's folder on the machine that evaluated it."""
    pid = proposal_after(empty_lab, stage_index=1, checkpoint="gone/stage-1/policy")
    with session(empty_lab) as s:
        stage0 = s.exec(select(Stage).where(Stage.index == 0)).one()
        stage0.checkpoint = "/elsewhere/assets/tiny-policy"
        s.add(stage0)
        s.commit()
    job_id, _ = queue_measure(empty_lab, pid, stage0=True)
    tiny_budget(empty_lab, job_id)
    assert run_worker(empty_lab, {"probe": run_probe_job}, WorkerOptions(once=True, poll_s=0.01))
    with session(empty_lab) as s:
        job = s.get(Job, job_id)
    assert (job.payload["checkpoint"], job.status) == ("tiny", "done")


def test_a_runs_probe_size_is_its_setting(empty_lab):
    job_id, message = queue_measure(empty_lab, proposal_after(empty_lab, probe_boards=2, probe_answers=3))
    assert message.endswith(f"(job {job_id}): 2 boards per size, 3 sampled answers each.")
    with session(empty_lab) as s:
        job = s.get(Job, job_id)
    assert (job.payload["boards"], job.payload["answers"]) == (2, 3)
    job_id, message = queue_measure(empty_lab, proposal_after(empty_lab))
    assert message.endswith(f"(job {job_id}): 8 boards per size, 8 sampled answers each.")  # the defaults


def test_the_panel_empties_for_another_proposal_only(empty_lab):
    """The browser can send one change of the proposal drawn twice, the second after a measurement started: only
    a change to another proposal empties the panel (a repeat changes nothing, so the measurement stays shown)."""
    import gradio as gr

    from lab.pages import common, measure

    with gr.Blocks():
        page = common.Page(empty_lab, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML())
        panel = measure.build(page, gr.State(None), gr.Dataframe(), gr.Number(), gr.Number())
    assert panel.clear(3, 3) == {panel.owner: 3}  # one output set as it is (Gradio needs one at least)
    assert panel.clear(None, None) == {panel.owner: None}
    out = panel.clear(4, 3)
    assert (out[panel.owner], out[panel.job], out[panel.seen], out[panel.status]) == (4, None, None, "")
    assert out[panel.table]["visible"] is False and out[panel.stage0]["visible"] is False


def test_the_panel_draws_a_progress_bar_only_when_a_measurement_was_queued(empty_lab):
    import gradio as gr

    from lab.pages import common, measure

    with gr.Blocks():
        page = common.Page(empty_lab, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML())
        panel = measure.build(page, gr.State(None), gr.Dataframe(), gr.Number(), gr.Number())
    pid = proposal_after(empty_lab, stage_index=1, checkpoint="gone/stage-1/policy")
    absent = panel.start(pid, None, None, None)  # the checkpoint is absent: nothing queued, nothing measuring
    assert (absent[panel.job], absent[panel.bar], absent[panel.stage0]["visible"]) == (None, "", True)
    queued = panel.start(pid, None, None, None, stage0=True)
    assert queued[panel.job] is not None and queued[panel.bar] == measure.progress_html(0.0)
    assert queued[panel.stage0]["visible"] is False
