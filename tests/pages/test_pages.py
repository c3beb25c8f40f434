"""The web lab's tabs: their view functions, called as the page calls them, on a temporary SQLite database.

Most tests take `lab`: a lab seeded through the real lab functions (tests/seeded.py, the fixture in conftest).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import zipfile
from pathlib import Path

import gradio as gr
import pytest
from huggingface_hub import DatasetCard
from PIL import Image
from sqlmodel import select

from envsim.config import EnvConfig, project
from envsim.instance import Instance
from envsim.parser import format_plan
from envsim.scoring import score, score_answer
from envsim.suite import VALIDATION_AGENTS, Split, boards_hash, build_cell, cells
from lab import results
from lab.cli.boards import DATASET_CARD, save_datasets
from lab.engineers import ENGINEERS, EngineerAnswer
from lab.jobs import worker
from lab.loop import advance, stages_of
from lab.pages import common, episode, leaderboard, playground, proposal, review, runs, train
from lab.pages import web as app
from lab.proposals import store_proposal
from lab.replay import GIF_WIDTHS
from lab.runs import first_failure, lab_version, waiting_proposals
from lab.settings import settings_arguments
from lab.study import reference
from lab.text import as_text
from storage.db import make_engine, session, upgrade
from storage.models import Action, Decision, Episode, Job, Proposal, Run, RunStatus, Stage, utcnow
from storage.queue import claim, fail
from storage.settings import MAX_STAGES
from tests.seeded import CROSSING_CLASH, OPEN_OFF_GRID, boards, propose
from training.evaluate import EpisodeResult, store_evaluation
from training.policy import load_policy


def decisions(engine) -> list[Decision]:
    with session(engine) as s:
        return list(s.exec(select(Decision).order_by(Decision.id)))


# ---------------------------------------------------------------- runs


def test_create_run_from_the_form_stores_the_run_and_queues_stage_0(lab):
    engine, _ = lab
    table = [[3, 0.5, 0.1, 0.0], [5, 0.5, 0.3, 0.5]]
    message, run_id = runs.create_run_from_form(engine, "mine", "", "tiny", "fixed", "", "", 2, 32, 2, 7, True, table)
    assert run_id is not None and f"#{run_id}" in message
    with session(engine) as s:
        config = EnvConfig.model_validate(stages_of(s, run_id)[0].config)
        jobs = list(s.exec(select(Job).where(Job.status == "queued")))
    assert config.data_ratio == {3: 0.5, 5: 0.5} and config.hole_ratio == {3: 0.1, 5: 0.3}
    assert config.num_instances == 32
    assert [j.payload for j in jobs] == [{"run_id": run_id, "stage_index": 0}]
    assert runs.runs_table(engine)["data"][0][:3] == [run_id, "mine", "active"]


def test_a_form_number_out_of_range_is_named_and_nothing_is_stored(lab):
    """The form's boxes send what was typed (no rounding in the browser) and are checked with the command line's
    bounds and words (`lab.settings`): a negative or fractional seed, 5,000 stages."""
    engine, _ = lab
    before = runs.run_choices(engine)
    table = [[3, 0.5, 0.1, 0.0], [5, 0.5, 0.3, 0.5]]
    form = ["mine", "", "tiny", "fixed", "", ""]
    assert runs.create_run_from_form(engine, *form, 0, 32, 2, 7, False, table) == (
        "✗ Not created: Training stages: 0 is less than 1: a run trains at least 1 stage.", None)
    assert runs.create_run_from_form(engine, *form, 2, 32, 2, -1, False, table) == (
        "✗ Not created: Seed: -1 is less than 0: numpy's generators take no negative seed.", None)
    assert runs.create_run_from_form(engine, *form, 2, 32, 2, 1.5, False, table) == (
        "✗ Not created: Seed: 1.5 is not a whole number from 0 to 2,147,483,647.", None)
    assert runs.create_run_from_form(engine, *form, 2, None, 2, 0.5, False, table) == (
        "✗ Not created: Training instances per stage: nothing is not a whole number from 1 to 100,000; Seed: 0.5 is "
        "not a whole number from 0 to 2,147,483,647.", None)
    cli = MAX_STAGES.refusal(5000)
    assert cli == ("5,000 is more than 1,000: each stage trains and evaluates the policy (minutes to hours); run "
                   "again from the last stage's checkpoint for more")
    assert runs.create_run_from_form(engine, *form, 5000, 32, 2, 0, False, table) == (
        f"✗ Not created: Training stages: {cli}.", None)
    assert runs.create_run_from_form(engine, *form, 2, 32, 1.5, 0, False, table) == (
        "✗ The initial config is not valid, nothing was stored: num_agents must be a whole number, got 1.5", None)
    assert runs.run_choices(engine) == before


def test_the_forms_agent_counts_are_stored_as_the_flags_store_them(lab):
    """The agent counts and the validation agents typed in the form ("2,3,4", in any order, a count twice) are stored
    fewest first, each once; boxes left empty store what flags not given store (the config in force's counts, the
    default validation agents)."""
    engine, _ = lab
    table = [[3, 0.5, 0.1, 0.0], [5, 0.5, 0.3, 0.5]]
    form = ["mine", "", "tiny", "fixed", "", "", 2, 32, 2, 7, False, table]
    _, run_id = runs.create_run_from_form(engine, *form, "4, 2,3,2", "3,2,4")
    _, default_id = runs.create_run_from_form(engine, *form, "", " ")
    with session(engine) as s:
        stored, default = s.get(Run, run_id).settings, s.get(Run, default_id).settings
    assert (stored.agent_counts, stored.validation_agents) == ((2, 3, 4), (2, 3, 4))
    assert (default.agent_counts, default.validation_agents) == (None, VALIDATION_AGENTS)
    assert stored.model_dump(exclude={"agent_counts", "validation_agents"}) == default.model_dump(
        exclude={"agent_counts", "validation_agents"})


def flag_refusal(flag: str, typed: str) -> str | None:
    """What the command line says of `flag typed`, None where it takes it."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    settings_arguments(parser)
    try:
        parser.parse_args([flag, typed])
    except argparse.ArgumentError as err:
        return err.message
    return None


@pytest.mark.parametrize("typed", ["1", "6", "2,x", "9", "2,3,4"])
@pytest.mark.parametrize("box", ["Agent counts", "Validation agents"])
def test_the_forms_agent_counts_are_refused_as_their_flags_are_naming_the_box(lab, box: str, typed: str):
    """One definition: each box takes what its flag takes (`--agent-counts`, `--validation-agents`: counts 1..8, a
    validation count at least 2) and refuses what it refuses, in the flag's words after the box's name; nothing is
    stored then."""
    engine, _ = lab
    before = runs.run_choices(engine)
    refusal = flag_refusal({"Agent counts": "--agent-counts", "Validation agents": "--validation-agents"}[box], typed)
    typed_in = (typed, "") if box == "Agent counts" else ("", typed)
    message, run_id = runs.create_run_from_form(engine, "mine", "", "tiny", "fixed", "", "", 2, 32, 2, 7, False,
                                               [[3, 1.0, 0.1, 0.0]], *typed_in)
    if refusal is None:
        assert run_id is not None, message
    else:
        assert (message, run_id) == (f"✗ Not created: {box}: {refusal}.", None)
        assert runs.run_choices(engine) == before
    # the command line's bounds: 1..8 agents (`envsim.rules`), and a validation board needs 2 to meet a wait subset
    taken = {"Agent counts": ("1", "6", "2,3,4"), "Validation agents": ("6", "2,3,4")}[box]
    assert (refusal is None) == (typed in taken)


def test_the_forms_agent_count_refusals_in_words(lab):
    """What a person reads for a count out of the rules' range, a validation count of one agent, and a typo."""
    engine, _ = lab
    form = ["mine", "", "tiny", "fixed", "", "", 2, 32, 2, 7, False, [[3, 1.0, 0.1, 0.0]]]
    assert runs.create_run_from_form(engine, *form, "2,9", "1") == (
        "✗ Not created: Agent counts: agent count 9 is outside 1..8; Validation agents: agent count 1: one agent "
        "never waits, so its boards cannot meet the wait subsets (validation and dev boards have 2 agents or more).",
        None)
    assert runs.create_run_from_form(engine, *form, "2,x", "") == (
        "✗ Not created: Agent counts: '2,x' is not agent counts separated by commas (e.g. 2,3,4).", None)


def test_an_invalid_initial_config_names_the_field_and_stores_nothing(lab):
    engine, _ = lab
    before = runs.run_choices(engine)
    message, run_id = runs.create_run_from_form(engine, "bad", "", "tiny", "fixed", "", "", 2, 32, 2, 0, False,
                                               [[3, 1.0, 0.7, 0.0]])
    assert run_id is None
    assert "hole_ratio[3] = 0.7 is outside 0..0.5" in message
    assert runs.run_choices(engine) == before


def test_the_llm_engineer_without_a_backend_is_refused(lab):
    engine, _ = lab
    message, run_id = runs.create_run_from_form(engine, "x", "", "tiny", "llm", "", "", 2, 32, 2, 0, False,
                                               [[3, 1.0, 0.1, 0.0]])
    assert run_id is None and "needs a backend" in message


def test_a_run_exported_from_the_page_imports_into_another_lab(lab, tmp_path: Path):
    engine, ids = lab
    path, message = runs.export_file(engine, ids["history"], False)
    assert path is not None and Path(path).name == f"envlab-run-{ids['history']}.zip"
    assert message.startswith(f"✓ Run #{ids['history']} exported (2 stages, 6 episodes, ")
    other = make_engine(str(tmp_path / "other.db"))
    upgrade(other)
    message, run_id = runs.import_file(other, path)
    assert (run_id, message) == (1, f"✓ envlab-run-{ids['history']}.zip imported as run #1 **curriculum** "
                                    "(2 stages, 6 episodes); it is open above.")
    assert runs.runs_table(other)["data"][0][:3] == [1, "curriculum", "waiting"]  # for its pending proposal
    message, run_id = runs.import_file(other, path)  # the same run twice: refused, said why
    assert run_id is None and message.startswith("✗ Not imported: ") and "already" in message
    assert [row[0] for row in runs.runs_table(other)["data"]] == [1]
    other.dispose()


def test_a_file_that_is_not_a_run_is_refused_with_the_archive_s_reason(lab, tmp_path: Path):
    engine, _ = lab
    before = runs.run_choices(engine)
    bad = tmp_path / "notes.zip"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr("notes.txt", "hello")
    message, run_id = runs.import_file(engine, str(bad))
    assert run_id is None and message.startswith("✗ Not imported: ") and "notes.zip" in message
    fake = tmp_path / "uploads" / "fake.zip"  # not a zip at all: named by its file name, not where it was kept
    fake.parent.mkdir()
    fake.write_text("not a zip")
    message, _ = runs.import_file(engine, str(fake))
    assert message == ("✗ Not imported: fake.zip: not a run archive: it is not a zip file, or it is truncated (File is "
                       "not a zip file)")
    assert str(tmp_path) not in message
    assert runs.import_file(engine, None) == ("Choose a run file (.zip, from “Export this run” or `envlab export`).",
                                              None)
    assert runs.export_file(engine, None, False) == (None, "Open a run first (“Open run” above the tabs).")
    assert runs.export_file(engine, 99999, True) == (None, "✗ Not exported: no run 99999 in this database")
    assert runs.run_choices(engine) == before


# ---------------------------------------------------------------- a person's text


# A name or note as a hostile user types it: each would fetch an address, format itself or break its table.
HOSTILE = ['<img src="http://127.0.0.1:9/img">', "![x](http://127.0.0.1:9/md)", "<b>x</b> **y**",
           "a_b_ `code` [link](http://e.x) | cell | ~~gone~~ $$x^2$$ &amp; \\*",
           "https://e.x/a_b) www.e.x a@b.co",  # GFM's own links: the page's renderer makes them without brackets
           "# heading\n- item\n1. item\n12) item\n===\n> quote\n\n    indented code"]


@pytest.mark.parametrize("text", HOSTILE)
def test_as_text_shows_every_character_as_typed(text):
    """Rendered by a CommonMark renderer with GFM's tables and strikethrough (markdown-it-py, which gradio brings
    through typer and rich): paragraphs of text and no other tag, every character as typed (blanks folded)."""
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(as_text(text))
    inner = re.sub(r"</?p>", "", rendered)
    assert "<" not in inner
    assert html.unescape(inner).split() == text.split()


def test_a_name_or_description_over_its_bound_is_refused_and_nothing_is_stored(lab):
    engine, _ = lab
    before = runs.run_choices(engine)
    table = [[3, 0.5, 0.1, 0.0], [5, 0.5, 0.3, 0.5]]
    rest = ["tiny", "fixed", "", "", 2, 32, 2, 0, False, table]
    assert runs.create_run_from_form(engine, "n" * 201, "", *rest) == (
        "✗ Not created: run name is 201 characters long; at most 200 are stored", None)
    assert runs.create_run_from_form(engine, "mine", "d" * 10_001, *rest) == (
        "✗ Not created: run description is 10,001 characters long; at most 10,000 are stored", None)
    assert runs.run_choices(engine) == before
    _, run_id = runs.create_run_from_form(engine, "n" * 200, "d" * 10_000, *rest)  # the bounds themselves are taken
    assert runs.runs_table(engine)["data"][0][:2] == [run_id, "n" * 200]


def test_a_decision_note_over_its_bound_is_refused_and_nothing_is_stored(lab):
    engine, ids = lab
    assert proposal.decide_proposal(engine, ids["pending"], "accept", "alice", "x" * 10_001) == \
        "✗ decision note is 10,001 characters long; at most 10,000 are stored"
    assert [d.proposal_id for d in decisions(engine)] == [ids["accepted"]]
    assert proposal.proposal_view(engine, ids["pending"]).pending


@pytest.mark.parametrize("name", HOSTILE[:2])
def test_a_run_s_name_shows_as_typed_in_the_train_tab_and_the_form_s_answer(lab, name):
    engine, _ = lab
    message, run_id = runs.create_run_from_form(engine, name, "", "tiny", "fixed", "", "", 2, 32, 2, 0, False,
                                               [[3, 0.5, 0.1, 0.0], [5, 0.5, 0.3, 0.5]])
    status = train.train_view(engine, run_id)["status"]
    assert status.startswith(f"Run #{run_id} **{as_text(name)}** is **active**")
    assert message.startswith(f"✓ Created run #{run_id} **{as_text(name)}**: stage 0")
    for shown in (status, message):
        assert "<img" not in shown and "![" not in shown and "](" not in shown


def test_a_decision_note_and_its_user_show_as_typed(lab):
    engine, ids = lab
    proposal.decide_proposal(engine, ids["pending"], "reject", "eve_<i>", "<b>x</b> **y**")
    status = proposal.proposal_view(engine, ids["pending"]).status
    assert status.endswith("✔ **rejected** by **eve\\_&lt;i&gt;** at "
                           f"{common.when(decisions(engine)[-1].created_at)}: “&lt;b&gt;x&lt;/b&gt; \\*\\*y\\*\\*”")


def test_every_number_box_sends_what_was_typed(empty_lab):
    """No box rounds (`precision=0` would make 1.5 a 2 before any check could name it): each callback checks."""
    demo = app.build_demo(empty_lab)
    boxes = [b for b in demo.blocks.values() if isinstance(b, gr.Number)]
    assert sorted(b.label for b in boxes) == ["Episode", "Episode", "Page", "Seed", "Seed", "Stage",
                                             "Training instances per stage", "Training stages", "num_instances"]
    assert [b.label for b in boxes if b.precision is not None] == []


# ---------------------------------------------------------------- stage review and gallery


def test_review_shows_the_latest_evaluated_stage_and_curves_across_stages(lab):
    engine, ids = lab
    r = review.review(engine, ids["history"], None)
    assert r["stage"] == 1
    assert [row[:2] for row in r["table"]["data"]] == [[0, "done"], [1, "done"]]
    assert r["table"]["data"][1][2] == f"proposal #{ids['accepted']}, accepted by alice"
    assert r["table"]["data"][0][3] == "0.0%" and r["table"]["data"][1][3] == "66.7%"
    bars = {t.name: list(t.y) for t in r["rates"].data}
    assert bars == {"valid rate": [0.5, 1.0], "optimal rate": [0.5, 1.0]}  # size 3: 1 of 2; size 4: 1 of 1
    pooled = {t.name: list(t.y) for t in r["curves"].data if t.name.startswith("pooled")}
    assert pooled["pooled valid"] == [0.0, pytest.approx(2 / 3)]  # the table's 66.7%: 2 of 3 boards, not 75%
    assert r["table"]["headers"][3:5] == ["pooled valid", "pooled optimal"]
    heat = r["failures"].data[0]
    assert list(heat.x) == ["vertex_conflict"] and [list(z) for z in heat.z] == [[1], [0]]  # sizes 3, 4
    reward = r["training"].data[0]
    assert list(reward.x) == [1, 2, 3, 4, 5] and reward.y[-1] == pytest.approx(0.5)


def test_the_review_tab_draws_its_gallery_first_and_its_plots_in_the_answer_after(lab):
    """`show` sends the tables, the note and the gallery with the plots cleared, and a `due` that differs from
    every one before (so its change event always fires); `plots(due)` sends that stage's four plots."""
    engine, ids = lab
    with gr.Blocks():
        tab = review.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    first, again = tab.show(ids["history"], None), tab.show(ids["history"], None)
    assert [first[plot] for plot in tab.figures] == [None] * 4
    assert first[tab.due][:2] == (ids["history"], 1) and again[tab.due][:2] == (ids["history"], 1)
    assert first[tab.due] != again[tab.due]
    assert first[tab.gallery]["data"] == review.gallery(engine, ids["history"], 1)[0]["data"] != []
    drawn, whole = tab.plots(first[tab.due]), review.review(engine, ids["history"], 1)
    assert [drawn[plot].to_plotly_json() for plot in tab.figures] == [
        whole[name].to_plotly_json() for name in review.PLOTS]
    stage0 = tab.plots(tab.show(ids["history"], 0)[tab.due])[tab.training]
    assert "stage 0 is evaluated, not trained" in stage0.layout.annotations[0].text
    assert all(update == gr.update() for update in tab.plots(None).values())  # nothing due: left as drawn


def test_stage_zero_has_no_training_curves_and_says_so(lab):
    engine, ids = lab
    r = review.review(engine, ids["history"], 0)
    assert "stage 0 is evaluated, not trained" in r["training"].layout.annotations[0].text


def test_a_stage_without_results_says_so_plainly(lab):
    engine, _ = lab
    _, run_id = runs.create_run_from_form(engine, "fresh", "", "tiny", "fixed", "", "", 1, 8, 2, 0, False,
                                         [[3, 1.0, 0.1, 0.0]])
    r = review.review(engine, run_id, None)
    assert r["note"].startswith("Stage 0 is queued and has no evaluation yet")
    assert r["rates"].layout.annotations[0].text == "no evaluation yet"
    table, note, _ = review.gallery(engine, run_id, 0)
    assert table["data"] == [] and "No failed episodes" in note
    assert review.review(engine, None, None)["note"].startswith("No run is open")


def test_the_gallery_filters_by_size_and_failure_type(lab):
    engine, ids = lab
    table, _, _ = review.gallery(engine, ids["history"], 0)
    assert sorted((row[1], row[3]) for row in table["data"]) == [
        (3, "illegal_move"), (3, "vertex_conflict"), (4, "hole")]
    table, _, _ = review.gallery(engine, ids["history"], 0, size=3, failure="illegal_move")
    assert [(row[1], row[3]) for row in table["data"]] == [(3, "illegal_move")]
    table, note, _ = review.gallery(engine, ids["history"], 0, size=4, failure="illegal_move")
    assert table["data"] == [] and note == "No failed episodes match these filters."


def test_the_gallery_filters_by_agent_count_and_pages_past_its_first_rows(lab):
    engine, ids = lab
    run_id = ids["history"]
    with session(engine) as s:  # the hole on the 4x4 board becomes a 3-agent board's failure
        hole = s.exec(select(Episode).where(Episode.run_id == run_id, Episode.stage_index == 0,
                                            Episode.failure == "hole")).one()
        hole.num_agents = 3
        s.add(hole)
        s.commit()
        hole_id = hole.id
    table, note, page = review.gallery(engine, run_id, 0, agents=3)
    assert ([row[:4] for row in table["data"]], note, page) == (
        [[hole_id, 4, 3, "hole"]], "1 failed episode(s). Click a row to replay it.", 1)
    two = review.gallery(engine, run_id, 0, agents="2")[0]["data"]  # as the dropdown sends it
    assert sorted((row[1], row[2], row[3]) for row in two) == [(3, 2, "illegal_move"), (3, 2, "vertex_conflict")]
    everything = [row[0] for row in review.gallery(engine, run_id, 0)[0]["data"]]
    pages = [review.gallery(engine, run_id, 0, page=n, per_page=2) for n in (1, 2, 9)]
    assert [[row[0] for row in t["data"]] for t, _, _ in pages] == [everything[:2], everything[2:], everything[2:]]
    assert [(note, page) for _, note, page in pages] == [
        ("3 failed episodes: 1 to 2 shown (page 1 of 2). Click a row to replay it.", 1),
        ("3 failed episodes: 3 to 3 shown (page 2 of 2). Click a row to replay it.", 2),
        ("3 failed episodes: 3 to 3 shown (page 2 of 2). Click a row to replay it.", 2)]  # past the end: the last
    with gr.Blocks():
        tab = review.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    shown = tab.show(run_id, 0)
    # the counts the stage was evaluated on (its summary: the seeded lab's boards have 2 agents)
    assert (shown[tab.agents_filter]["choices"], shown[tab.page_box]) == ([review.ALL, 2], 1)
    picked = tab.filter(run_id, 0, review.ALL, review.ALL, 3)
    assert ([row[0] for row in picked[tab.gallery]["data"]], picked[tab.page_box]) == ([hole_id], 1)


# ---------------------------------------------------------------- episode viewer


def test_an_episode_opens_with_its_board_answer_and_the_same_board_across_stages(lab):
    engine, ids = lab
    v = episode.episode_view(engine, ids["clash"])
    assert v["error"] is None and v["answer"] == CROSSING_CLASH and v["end"] == 2
    assert "✗ **vertex_conflict**" in v["header"] and f"?episode={ids['clash']}" in v["header"]
    assert [row[0] for row in v["strip_table"]["data"]] == [0, 1]  # the crossing board at stages 0 and 1
    assert [a.text for a in v["strip"].layout.annotations] == ["stage 0: vertex_conflict", "stage 1: vertex_conflict"]
    fig, events = common.draw(v["view"], 1, True)
    agents = {t.name: (t.y[0], t.x[0]) for t in fig.data if t.name.startswith("agent ")}
    assert agents == {"agent 0": (1, 0.82), "agent 1": (1, 1.18)}  # side by side in (1, 1)
    assert events.startswith("**At this step:** t=1: agents 0 and 1 collide at (1, 1)")
    assert events.endswith(" Cells are (row, col), counted from 0 at the top left.")
    fig, events = common.draw(v["view"], 2, True)  # the end: the title and the text agree on what went wrong
    assert fig.layout.title.text == "t = 2 / 2: the end (t=1: agents 0 and 1 collide at (1, 1))"
    assert events.startswith("The answer has ended (t=2); what went wrong: vertex_conflict: agents 0 and 1 at (1,1)")


def test_the_episode_tab_opens_on_the_runs_first_failure_when_none_is_open(lab):
    """Opened with nothing open, the tab shows the open run's latest stage's first failed episode, says so, and
    leaves an episode already open alone."""
    engine, ids = lab
    first = first_failure(engine, ids["history"])
    assert (first.id, first.stage_index, first.size, first.failure) == (ids["clash"], 1, 3, "vertex_conflict")
    tab = episode.EpisodeTab(engine, *[object() for _ in range(18)])  # one key per component
    shown = tab.first_visit(None, ids["history"])
    assert shown[tab.episode_id] == ids["clash"] and shown[tab.opened_here] is True
    assert shown[tab.header].startswith(f"_Run #{ids['history']}'s first failed episode at stage 1; open another")
    assert f"**Episode {ids['clash']}**: run #{ids['history']}, stage 1" in shown[tab.header]
    assert shown[tab.answer] == CROSSING_CLASH
    extras = tab.extras_if_opened(True, ids["clash"], shown[tab.view])
    assert extras[tab.gif]["value"].endswith(".gif") and extras[tab.strip]["visible"] is True
    kept = tab.first_visit(shown[tab.view], ids["waiting"])  # one open already: kept
    assert kept == {tab.episode_id: gr.skip(), tab.opened_here: False}
    assert tab.extras_if_opened(False, ids["clash"], shown[tab.view]) == {o: gr.skip() for o in tab.extra_outputs}
    assert tab.first_visit(None, None) == {tab.episode_id: gr.skip(), tab.opened_here: False}  # no run open


def test_a_missing_episode_is_reported_not_raised(lab):
    engine, _ = lab
    assert episode.episode_view(engine, 99999)["error"] == "There is no episode 99999."
    assert "Type an episode number" in episode.episode_view(engine, None)["error"]


def test_a_playing_replay_follows_its_clock_so_late_ticks_do_not_slow_it():
    """Steps follow the replay's clock (one per PLAY_S), not the ticks: a late tick shows the step due by then."""
    pace = episode.PLAY_S
    clock = episode.play_clock(0, now=100.0)
    t, clock = episode.next_step(clock, 0, 40, now=100.0 + pace)  # on time: one step
    assert (t, clock["shown"]) == (1, 1)
    t, clock = episode.next_step(clock, 1, 40, now=100.0 + 4.1 * pace)  # late: the step due at 4 x PLAY_S
    assert t == 4
    t, clock = episode.next_step(clock, 4, 40, now=100.0 + 4.2 * pace)  # early: one step on all the same
    assert t == 5
    t, _ = episode.next_step(clock, 5, 40, now=100.0 + 60 * pace)  # never beyond the end
    assert t == 40
    t, clock = episode.next_step(clock, 20, 40, now=100.0 + 9 * pace)  # moved by hand to 20: on from there
    assert (t, clock["from"]) == (21, 20)
    assert episode.next_step(clock, 21, 40, now=100.0 + 10 * pace)[0] == 22
    assert episode.next_step(None, 7, 40, now=5.0)[0] == 8  # no clock (a page from before): one step


def test_play_starts_the_clock_and_pause_stops_it(lab):
    engine, ids = lab
    tab = episode.EpisodeTab(engine, *[object() for _ in range(18)])  # one key per component
    view = episode.episode_view(engine, ids["clash"])["view"]
    end = episode.view_end(view)
    started = tab.toggle_play(view, None, end)  # at the end: from the start again
    assert started[tab.step] == 0 and started[tab.playing]["from"] == 0 and started[tab.play] == "❚❚ Pause"
    paused = tab.toggle_play(view, started[tab.playing], 1)
    assert (paused[tab.playing], paused[tab.step], paused[tab.play]) == (None, 1, "▶ Play")
    last = tab.tick(view, episode.play_clock(end - 1), end - 1, True)
    assert (last[tab.step], last[tab.playing], last[tab.play]) == (end, None, "▶ Play")


def test_the_replay_file_is_a_standalone_animation(lab):
    engine, ids = lab
    view = episode.episode_view(engine, ids["clash"])["view"]
    path = Path(episode.replay_file(view))
    text = path.read_text()
    assert path.suffix == ".html" and "Plotly.addFrames" in text and "Plotly.newPlot" in text
    instance = Instance.model_validate(view["instance"])
    title = f"envlab replay: board {instance.id}, 3x3, 2 agents (vertex_conflict)"
    assert f"<title>{title}</title>" in text and f">{title}</h2>" in text


def test_the_gif_has_one_frame_per_step(lab):
    engine, ids = lab
    view = episode.episode_view(engine, ids["clash"])["view"]
    with Image.open(episode.gif_file(view)) as gif:
        assert (gif.format, gif.n_frames) == ("GIF", 2 + 1)  # the clash ends at t = 2
    for width in GIF_WIDTHS:  # a 3x3 board, exactly the width chosen (its captions shrink to fit)
        with Image.open(episode.gif_file(view, width)) as gif:
            assert gif.size[0] == width
    with gr.Blocks():
        tab = episode.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    opened = tab.show(ids["clash"], True)  # the board first; the strip and the files in the answer after
    assert (opened[tab.gif]["value"], opened[tab.gif]["interactive"]) == (None, False)
    assert opened[tab.strip] == {"__type__": "update", "visible": False}  # never the previous episode's strip
    after = tab.extras(ids["clash"], opened[tab.view], 480)
    assert after[tab.strip]["visible"] and after[tab.strip_note] == "### Same board across stages"
    assert [a.text for a in after[tab.strip]["value"].layout.annotations] == ["stage 0: vertex_conflict",
                                                                           "stage 1: vertex_conflict"]
    assert [row[0] for row in after[tab.strip_table]["value"]["data"]] == [0, 1]
    with Image.open(after[tab.gif]["value"]) as gif:
        assert gif.size[0] == 480 and after[tab.html]["interactive"]
    assert tab.extras(None, None, 480) == tab.files(None, 480)  # nothing open: no files, the strip left as it is
    for width in (960, 480):  # another episode opened: the GIF is made at the width chosen, not the first
        with Image.open(tab.files(opened[tab.view], width)[tab.gif]["value"]) as gif:
            assert gif.size[0] == width
    assert tab.files(None, 480)[tab.html] == {"__type__": "update", "value": None, "interactive": False}
    assert episode.gif_file(None) is None


# ---------------------------------------------------------------- proposal review


def test_the_diff_flags_what_the_projection_changed(lab):
    engine, ids = lab
    v = proposal.proposal_view(engine, ids["pending"])
    rows = {(r[0], r[1]): r for r in v.diff["data"]}
    assert rows[(4, "hole_ratio")][2:5] == ["0.2", "**0.5**", "+0.3"]  # bold: the value changes
    flag = rows[(4, "hole_ratio")][5]
    assert flag.startswith("⚠ clamped into 0..0.5") and "engineer said 0.9" in flag
    assert rows[(3, "data_ratio")][2:5] == ["0.5", "**0.25**", "-0.25"] and rows[(3, "data_ratio")][5] == ""
    assert rows[(3, "hole_ratio")][2:5] == ["0.2", "0.2", "0"]
    # the changed-only view (the default) keeps the rows that change, in table order
    assert [(r[0], r[1]) for r in v.changed["data"]] == [(3, "data_ratio"), (4, "data_ratio"), (4, "hole_ratio")]
    assert len(v.diff["data"]) == 2 * 3 + 2  # two sizes x three knobs, and the two globals
    assert v.pending and "Waiting for a decision" in v.status
    assert v.edit == [[3, 0.25, 0.2, 0.25], [4, 0.75, 0.5, 0.25]]


def test_a_rationale_and_an_error_from_outside_show_as_typed(lab):
    """Text an archive or a model wrote is Markdown for the page: its images, links, tags and forms are escaped."""
    engine, ids = lab
    outside = ('Fewer holes. ![x](http://h/a.png) <img src=http://h/b> [see](http://h/l)\n'
               '<form action="http://h/s"><input name=password></form>')
    with session(engine) as s:
        row = s.get(Proposal, ids["pending"])
        row.rationale = outside
        s.add(row)
        s.commit()
    assert proposal.proposal_view(engine, ids["pending"]).rationale.startswith(
        'Fewer holes. \\!\\[x\\]\\(http\\://h/a.png\\) &lt;img src=http\\://h/b&gt; \\[see\\]\\(http\\://h/l\\)  \n'
        '&lt;form action="http\\://h/s"&gt;&lt;input name=password&gt;&lt;/form&gt;\n\n')
    with session(engine) as s:
        row = s.get(Proposal, ids["pending"])
        row.error = "no usable config: ![x](http://h/e.png)"
        s.add(row)
        s.commit()
    assert "✗ **The proposal failed**: no usable config: \\!\\[x\\]\\(http\\://h/e.png\\). The config" in \
        proposal.proposal_view(engine, ids["pending"]).status


def test_a_rationale_keeps_one_line_per_change(lab):
    engine, ids = lab
    with session(engine) as s:
        run_id = s.get(Proposal, ids["pending"]).run_id
        base = EnvConfig.model_validate(stages_of(s, run_id)[-1].config)
        answer = EngineerAnswer(prompt="p", raw="r", proposed={}, projection=project({}, base),
                                rationale="size 3: wait_ratio 0.25 -> 0.35\nsize 4: hole_ratio 0.2 -> 0.15")
        proposal_id = store_proposal(s, run_id, stages_of(s, run_id)[-1].index, "heuristic", answer, base).id
    rationale = proposal.proposal_view(engine, proposal_id).rationale
    assert rationale.startswith("size 3: wait\\_ratio 0.25 -&gt; 0.35  \nsize 4: hole\\_ratio 0.2 -&gt; 0.15\n\n")


def test_an_invalid_edit_is_refused_naming_field_and_range_and_nothing_is_stored(lab):
    engine, ids = lab
    table = [[3, 0.25, 0.2, 0.25], [4, 0.75, 0.8, 0.25]]
    message = proposal.decide_proposal(engine, ids["pending"], "edit", "bob", "", table, 2, 16)
    assert message == "✗ Not saved, the edit is not valid: hole_ratio[4] = 0.8 is outside 0..0.5"
    message = proposal.decide_proposal(engine, ids["pending"], "edit", "bob", "", [[3, "lots", 0.2, 0.25],
                                                                               [4, 0.75, 0.1, 0.25]], 2, 16)
    assert "data_ratio[3] must be a number" in message
    assert [d.proposal_id for d in decisions(engine)] == [ids["accepted"]]


def test_a_valid_edit_is_applied_and_the_next_stage_queued(lab):
    engine, ids = lab
    table = [[3, 0.5, 0.2, 0.25], [4, 0.5, 0.45, 0.5]]
    message = proposal.decide_proposal(engine, ids["pending"], "edit", "bob", "gentler", table, 2, 24)
    assert message == (f"✓ Proposal #{ids['pending']} edited by bob; stored: data_ratio[3] 0.5, data_ratio[4] 0.5, "
                       "hole_ratio[4] 0.45, wait_ratio[4] 0.5, num_instances 24. Next: queued stage 1 (edit by bob).")
    d = decisions(engine)[-1]
    assert (d.action, d.user, d.note) == ("edit", "bob", "gentler")
    assert d.config.hole_ratio == {3: 0.2, 4: 0.45} and d.config.num_instances == 24
    v = proposal.proposal_view(engine, ids["pending"])
    assert "**edited** by **bob**" in v.status and not v.pending


def test_an_edit_that_does_not_sum_to_one_is_shown_rescaled_before_and_after_it_is_stored(lab):
    engine, ids = lab
    typed = [[3, 0.9, 0.2, 0.25], [4, 0.5, 0.5, 0.25]]
    said = ("data_ratio[3] 0.6429 (you typed 0.9), data_ratio[4] 0.3571 (you typed 0.5); the data_ratio shares you "
            "typed sum to 1.4, so each is rescaled to make them sum to 1")
    assert proposal.edit_check(engine, ids["pending"], typed, 2, 16) == (f"*Apply my edit* will store: {said}.", True,
                                                                          [])
    assert decisions(engine)[-1].proposal_id == ids["accepted"]  # checking stores nothing
    message = proposal.decide_proposal(engine, ids["pending"], "edit", "bob", "", typed, 2, 16)
    assert message == f"✓ Proposal #{ids['pending']} edited by bob; stored: {said}. Next: queued stage 1 (edit by bob)."
    assert decisions(engine)[-1].config.data_ratio == {3: 0.9 / 1.4, 4: 0.5 / 1.4}
    v = proposal.proposal_view(engine, ids["pending"])  # the decided proposal shows what was stored
    assert v.edit == [[3, 0.6429, 0.2, 0.25], [4, 0.3571, 0.5, 0.25]]
    assert v.changed["data"] == [
        [3, "data_ratio", "0.5", "✎ 0.6429", "+0.1429", "✎ set by bob; the engineer proposed 0.25"],
        [4, "data_ratio", "0.5", "✎ 0.3571", "-0.1429", "✎ set by bob; the engineer proposed 0.75"],
        [4, "hole_ratio", "0.2", "**0.5**", "+0.3", "⚠ clamped into 0..0.5 (engineer said 0.9)"]]
    assert v.label.startswith("The config edited (as stored with the decision")
    assert "the person set 2 of them" in v.rationale
    # the Stage review's timeline: the config stage 1 trains on, and who set each value that changed
    assert review.timeline(engine, ids["waiting"])["data"] == [
        [0, "initial config", 3, "0.5", "0.2", "0.25", "2=1", "16"],
        [0, "initial config", 4, "0.5", "0.2", "0.25", "2=1", "16"],
        [1, f"proposal #{ids['pending']}, edited by bob", 3, "0.6429 (person)", "0.2", "0.25", "2=1", "16"],
        [1, f"proposal #{ids['pending']}, edited by bob", 4, "0.3571 (person)", "0.5 (engineer)", "0.25", "2=1", "16"]]


def test_an_edit_of_the_agent_mix_is_projected_stored_and_shown_by_count(lab):
    engine, ids = lab
    view = proposal.proposal_view(engine, ids["pending"])
    # a row per count 2..5: the share to apply (typed) beside the one in force
    assert view.agents == [[2, 1.0, 1.0], [3, 0.0, 0.0], [4, 0.0, 0.0], [5, 0.0, 0.0]]
    typed = [[2, "0.25", 1.0], [3, "0.25", 0.0], [4, 0, 0.0], [5, "", 0.0]]  # the shares sum to 0.5
    said = ("agent_ratio[2] 0.5 (you typed 0.25), agent_ratio[3] 0.5 (you typed 0.25); the agent_ratio shares you "
            "typed sum to 0.5, so each is rescaled to make them sum to 1")
    assert proposal.edit_check(engine, ids["pending"], view.edit, typed, 16) == (
        f"*Apply my edit* will store: {said}.", True, [])
    message = proposal.decide_proposal(engine, ids["pending"], "edit", "bob", "", view.edit, typed, 16)
    assert message == f"✓ Proposal #{ids['pending']} edited by bob; stored: {said}. Next: queued stage 1 (edit by bob)."
    assert decisions(engine)[-1].config.agent_ratio == {2: 0.5, 3: 0.5}
    with session(engine) as s:  # the next stage is queued on the mix as stored
        stage = s.exec(select(Stage).where(Stage.run_id == ids["waiting"], Stage.index == 1)).one()
        job = s.exec(select(Job).where(Job.run_id == ids["waiting"], Job.kind == "stage")
                     .order_by(Job.id.desc())).first()
    assert stage.config.agent_ratio == {2: 0.5, 3: 0.5}
    assert (job.status, job.payload) == ("queued", {"run_id": ids["waiting"], "stage_index": 1})
    view = proposal.proposal_view(engine, ids["pending"])
    assert view.agents == [[2, 0.5, 1.0], [3, 0.5, 0.0], [4, 0.0, 0.0], [5, 0.0, 0.0]]
    assert [row[:5] for row in view.changed["data"] if row[1].startswith("agent_ratio")] == [
        ["all", "agent_ratio[2]", "1", "✎ 0.5", "-0.5"], ["all", "agent_ratio[3]", "0", "✎ 0.5", "+0.5"]]
    assert [row[6] for row in review.timeline(engine, ids["waiting"])["data"]] == [
        "2=1", "2=1", "2=0.5, 3=0.5 (person)", "2=0.5, 3=0.5 (person)"]


@pytest.mark.parametrize("typed, said, cells", [
    ([[2, 0.5, 1.0], [3, 1.5, 0.0]], "agent_ratio[3] = 1.5 is outside 0..1", [(1, 1)]),
    ([[2, 0.5, 1.0], [3, "half", 0.0]], "agent_ratio[3] must be a number, got 'half'", [(1, 1)]),
    ([[2, 0.5, 1.0], [3, 0, 0.0], [9, 0.5, ""]], "agent_ratio: agent count 9 is outside 1..8", [(2, 0)]),
    ([[2, 0.5, 1.0], ["two", 0.5, 0.0]], "agent_ratio has key 'two'; keys are agent counts 1..8", [(1, 0)]),
    ([[2, 0, 1.0], [3, 0, 0.0]], "agent_ratio sums to 0; at least one agent count needs a positive share",
     [(0, 1), (1, 1)]),
])
def test_a_bad_agent_mix_is_marked_on_its_row_and_nothing_is_stored(lab, typed, said, cells):
    engine, ids = lab
    with gr.Blocks():
        tab = proposal.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    rows = proposal.proposal_view(engine, ids["pending"]).edit
    checked = tab.checker(ids["pending"], rows, typed, 16)
    assert checked[tab.check] == f"✗ This edit cannot be applied: {said}."
    marked = ", ".join(f'#edit-agents [data-testid="cell-{r}-{c}"]' for r, c in cells)
    assert checked[tab.marks] == f"<style>{marked} {{ background: #fde2e2 !important; outline: 2px solid #d62728; }}" \
                                 "</style>"
    assert [checked[tab.buttons[a]]["interactive"] for a in (Action.ACCEPT, Action.EDIT)] == [False, False]
    assert proposal.decide_proposal(engine, ids["pending"], "edit", "bob", "", rows, typed, 16) == \
        f"✗ Not saved, the edit is not valid: {said}"
    assert [d.proposal_id for d in decisions(engine)] == [ids["accepted"]]


def test_one_click_rescales_the_shares_to_sum_to_one(lab):
    engine, ids = lab
    rows, said = proposal.rescaled([[3, 0.9, 0.2, 0.25], [4, "0.5", 0.5, 0.25], ["", "", "", ""]])
    assert rows == [[3, 0.6429, 0.2, 0.25], [4, 0.3571, 0.5, 0.25]]
    assert said == "The data_ratio shares summed to 1.4: each is divided by it."
    assert proposal.rescaled([[3, "lots", 0.2, 0.25]])[1] == "✗ Not rescaled: every data_ratio must be a number first."
    assert proposal.rescaled([[3, 0, 0.2, 0.25]])[1] == "✗ Not rescaled: the data_ratio shares sum to 0."


def test_an_invalid_edit_is_said_once_while_typed_and_the_buttons_wait(lab):
    engine, ids = lab
    negative = [[-3, 0.5, 0.2, 0.25], [4, 0.5, 0.5, 0.25]]
    text, ok, problems = proposal.edit_check(engine, ids["pending"], negative, 2, 16)
    assert (text, ok) == ("✗ This edit cannot be applied: size -3 is outside 2..32.", False)
    assert {(p.field, p.size, p.legal) for p in problems} == {("size", -3, (2, 32))}  # named by each knob of the row
    assert proposal.decide_proposal(engine, ids["pending"], "edit", "bob", "", negative, 2, 16) == \
        "✗ Not saved, the edit is not valid: size -3 is outside 2..32"
    view = proposal.proposal_view(engine, ids["pending"])
    assert proposal.edit_check(engine, ids["pending"], view.edit, 2, 16) == (
        "The table is the engineer's proposal as it stands: *Accept* applies it.", True, [])
    assert [d.proposal_id for d in decisions(engine)] == [ids["accepted"]]


def test_the_cells_a_problem_names_are_marked():
    from envsim.config import ConfigError, project
    from lab.pages.common import config_from_table

    rows = [[3, 0.5, 0.8, 0.25], [-4, 0.5, 0.3, 0.25]]
    with pytest.raises(ConfigError) as refused:
        project(config_from_table(rows, 9, 16), strict=True)
    assert ("num_agents", None, (1, 8)) in {(p.field, p.size, p.legal) for p in refused.value.records}
    assert proposal.bad_cells(refused.value.records, rows) == [(1, 0), (0, 2)]
    assert proposal.cell_marks([(0, 2)]) == ('<style>#edit-config [data-testid="cell-0-2"] { background: #fde2e2 '
                                             '!important; outline: 2px solid #d62728; }</style>')
    assert proposal.cell_marks([]) == ""


def test_the_page_sees_a_new_proposal_and_lists_every_one_that_waits(lab):
    engine, ids = lab
    before = lab_version(engine)
    assert [(w.proposal_id, w.run_id) for w in waiting_proposals(engine)] == [(ids["second"], ids["history"]),
                                                                              (ids["pending"], ids["waiting"])]
    assert [row[3] for row in runs.runs_table(engine)["data"]] == ["proposal #2 (stage 1)", "proposal #3 (stage 2)"]
    assert app.waiting_banner(engine).count('href="?proposal=') == 2
    proposal.decide_proposal(engine, ids["second"], "reject", "carol")
    assert lab_version(engine).proposals == (before.proposals[0], before.proposals[1] + 1)
    assert [w.proposal_id for w in waiting_proposals(engine)] == [ids["pending"]]
    newer = propose(engine, ids["history"])  # the engineer answers again, as a worker would
    advance(engine, ids["history"])
    assert lab_version(engine).proposals[0] == newer
    assert [w.proposal_id for w in waiting_proposals(engine)] == [newer, ids["pending"]]
    assert proposal.pending_of(engine, ids["history"]) == newer


def test_the_poll_selects_a_new_waiting_proposal_and_otherwise_leaves_the_one_read(lab):
    engine, ids = lab
    with gr.Blocks():
        tab = proposal.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    run = ids["history"]
    assert tab.follow(run, ids["accepted"], jump=False)[tab.pick]["value"] == ids["accepted"]  # a person reads it
    assert tab.follow(run, ids["accepted"], jump=True)[tab.pick]["value"] == ids["second"]  # a proposal was stored
    kept = tab.follow(run, ids["second"], jump=True)  # the shown one still waits: the table being edited stays
    assert kept[tab.pick]["value"] == ids["second"] and tab.edit not in kept
    assert tab.edit in tab.follow(run, ids["accepted"], jump=False)  # a decided one shows its stored config


def test_work_that_needs_weights_is_refused_when_asked(lab):
    engine, ids = lab
    why = f"stage 1 of run {ids['history']} has no weights here: no checkpoint was recorded"
    assert leaderboard.benchmark_stage(engine, ids["history"], 1) == f"✗ Not queued: {why}."
    from lab.loop import LoopError, queue_benchmark  # the command line and experiments queue through it too

    with pytest.raises(LoopError, match=f"^{re.escape(why)}$"):
        queue_benchmark(engine, ids["history"], 1)
    assert runs.export_file(engine, ids["history"], True) == (
        None, f"✗ Not exported with checkpoints: {why}. Export it without them.")
    assert runs.export_file(engine, ids["history"], False)[0] is not None
    with session(engine) as s:
        assert s.exec(select(Job).where(Job.kind == "benchmark")).first() is None


def test_a_failed_job_is_one_line_and_its_traceback_is_folded():
    log = ("evaluating 24 boards\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
           "training.policy.PolicyError: no checkpoint folder there")
    kept, trace = train.fold_traceback(log)
    assert kept == "evaluating 24 boards\n(the traceback is folded under the job's error above)"
    assert trace.startswith("Traceback") and trace.endswith("no checkpoint folder there")
    assert train.fold_traceback("all fine") == ("all fine", "")


def test_two_tabs_on_one_proposal_one_wins_and_the_other_is_told(lab):
    engine, ids = lab
    first = proposal.decide_proposal(engine, ids["pending"], "accept", "alice")
    second = proposal.decide_proposal(engine, ids["pending"], "reject", "bob")
    assert first.startswith("✓")
    assert second.startswith(f"⚠ Someone decided first: proposal #{ids['pending']} was already accepted by **alice**")
    assert [(d.action, d.user) for d in decisions(engine)][-1] == ("accept", "alice")


def test_reject_asks_the_engineer_again(lab):
    engine, ids = lab
    message = proposal.decide_proposal(engine, ids["pending"], "reject", "carol")
    assert "asking the engineer again" in message
    with session(engine) as s:
        assert [j.kind for j in s.exec(select(Job).where(Job.status == "queued"))] == ["propose"]


def test_auto_apply_decides_the_pending_proposal(lab):
    engine, ids = lab
    message = proposal.toggle_auto_apply(engine, ids["waiting"], True)
    assert "queued stage 1 (auto by auto-apply)" in message
    assert proposal.proposal_view(engine, ids["pending"]).auto is True


def test_the_preview_draws_boards_from_the_proposed_config(lab):
    engine, ids = lab
    fig, note = proposal.proposal_preview(engine, ids["pending"], n=4)
    titles = [a.text for a in fig.layout.annotations]
    assert len(titles) == 4 and sum(t.startswith("4x4") for t in titles) == 3  # data_ratio 0.25 / 0.75
    assert all("8 holes" in t for t in titles if t.startswith("4x4"))  # hole_ratio 0.5 of 16 cells
    assert "seed" in note


# ---------------------------------------------------------------- training progress


def test_train_view_shows_the_active_job_and_the_last_results(lab):
    engine, ids = lab
    proposal.decide_proposal(engine, ids["pending"], "accept", "alice")
    t = train.train_view(engine, ids["waiting"])
    assert 'id="job-progress" data-step="0" data-total="0" data-status="queued"' in t["progress"]
    assert "stage job" in t["progress"] and "waits for your decision" not in t["status"]
    assert "Stage 0 results" in t["results"] and "| 3x3 | 0% | 0% | 2 |" in t["results"]
    message = train.cancel_run_jobs(engine, ids["waiting"])
    assert message.startswith(f"Run #{ids['waiting']} is cancelled. Cancel requested for job")
    assert train.train_view(engine, ids["waiting"])["jobs"]["data"][0][3] == "cancelled"
    assert train.advance_run(engine, ids["waiting"]).startswith(f"Run #{ids['waiting']}: cancelled: cancelled at ")


def test_worker_status_tells_a_queue_nobody_serves_from_an_idle_one(lab):
    engine, ids = lab
    assert worker.worker_status(engine) == ("idle", "Worker idle: no jobs queued.")
    assert "No worker was started with this lab (--no-worker)" in app.worker_badge(engine, own_worker=False)
    assert "Worker idle" not in app.worker_badge(engine, own_worker=False)
    proposal.decide_proposal(engine, ids["pending"], "accept", "alice")
    assert worker.worker_status(engine) == ("waiting", "1 job(s) queued, waiting for a worker.")
    with session(engine) as s:
        job = s.exec(select(Job).where(Job.status == "queued")).one()
        job.created_at = utcnow().replace(year=2000)
        s.add(job)
        s.commit()
    state, text = worker.worker_status(engine)
    assert state == "down" and "no worker seems to be running" in text
    assert "<code>envlab worker</code>" in app.worker_badge(engine)
    with session(engine) as s:
        claim(s, "w1")
    state, text = worker.worker_status(engine)
    assert state == "busy" and text.startswith("Worker busy: stage job") and worker.worker_busy(engine)


# ---------------------------------------------------------------- playground


def test_the_playground_scores_a_typed_plan_and_updates_the_verdict():
    view, picture, message = playground.read_board("A.b\n...\nB.a")
    assert picture == "A.b\n...\nB.a" and "Optimal makespan" in message
    view, text, end = playground.play_plan(view, "Agent 0: UP\nAgent 1: UP")
    assert text.startswith("✗ **illegal_move**") and end == 1
    reference = playground.solver_plan(view)
    assert reference == format_plan(view["instance"]["reference_plan"])
    view, text, end = playground.play_plan(view, reference)
    assert text.startswith("✓ **valid** and **optimal**")
    bad = playground.read_board("A.b\n..\nB.a")
    assert bad[0] is None and "row 1 has 2 cells" in bad[2]


def test_a_plan_longer_than_its_bound_is_refused_in_one_line_unread():
    view, _, _ = playground.read_board("A.b\n...\nB.a")
    plan = "Agent 0: UP\n" * (9 * 2**20 // 12)
    refused, text, end = playground.play_plan(view, plan)
    assert (refused["outcome"], text, end) == (
        None, f"✗ This plan is {len(plan):,} characters long; a plan is read from at most 65,536.", 0)
    assert playground.play_plan(view, plan[:65_532])[0]["outcome"] is not None  # within the bound: scored
    with gr.Blocks():
        tab = playground.build(common.Page(None, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    assert tab.plan.max_length == tab.board_text.max_length == 65_536


def test_a_board_that_cannot_be_read_is_named_and_the_board_shown_stays():
    with gr.Blocks():
        tab = playground.build(common.Page(None, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    shown = tab.read("A.b\n...\nB.a")
    refused = tab.read("AAbb\n....\n....\nB..a")  # two starts for agent 0: refused, not rewritten
    assert refused == {tab.message: "✗ Cannot read this board: agent 0 has two starts ('A' at (0,0) and at (0,1)); "
                                    "each agent has one start (upper case) and one goal (lower case)"}
    assert shown[tab.view] is not None  # nothing else is in the answer: the board drawn and the text typed stay


def test_reading_the_board_shown_again_keeps_its_plan_and_verdict_and_a_new_board_clears_them():
    """Read board clicked twice, or before the tab's first read came back, never wipes the plan written for it."""
    with gr.Blocks():
        tab = playground.build(common.Page(None, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    shown = tab.read("A.b\n...\nB.a")[tab.view]
    again = tab.read("A.b\n...\nB.a", shown)
    assert set(again) == {tab.board_text, tab.message}  # no plan, verdict or view in the answer: they stay
    assert again[tab.message].startswith("Optimal makespan 4")
    other = tab.read("A.b\n.H.\nB.a", shown)
    assert other[tab.plan] == "" and other[tab.verdict] == "" and other[tab.view] != shown
    made = tab.make(5, 2, 0.2, 3, None)
    assert set(tab.make(5, 2, 0.2, 3, made[tab.view])) == {tab.board_text, tab.message}


def test_the_playground_size_knob_says_the_size_of_the_board_shown(lab):
    engine, ids = lab
    with gr.Blocks():
        tab = playground.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    first = tab.first_visit(None, tab.board_text.value)  # the board the tab opens on: 3x3
    assert (tab.size.value, first[tab.size]["value"], len(first[tab.view]["instance"]["holes"])) == (3, 3, 1)
    assert tab.read("A....\n.....\n.....\n.....\n....a", first[tab.view])[tab.size] == {
        "__type__": "update", "value": 5, "maximum": 10}
    twelve = "A" + "." * 11 + "\n" + ("." * 12 + "\n") * 10 + "." * 11 + "a"  # past the knob's range: it stretches
    assert tab.read(twelve)[tab.size] == {"__type__": "update", "value": 12, "maximum": 12}
    assert tab.make(6, 2, 0.2, 0)[tab.size]["value"] == 6
    loaded = tab.load_episode(ids["clash"])  # an episode's board: 3x3
    assert loaded[tab.size]["value"] == 3 and tab.size in tab.outputs


def test_the_playground_refuses_a_board_text_too_long_before_it_reads_it():
    huge = "\n".join(["." * 4000] * 4000)  # the 4000x4000 board that took 15 s to be refused
    assert playground.read_board(huge) == (None, "", "✗ This text is 16,003,999 characters long; a board is read from "
                                                     "at most 65,536 (a 32x32 board is about 1,200).")
    assert playground.read_board("A.b\n.H.\nB.a" + " " * (playground.BOARD_TEXT_LIMIT - 11))[0] is not None


@pytest.mark.parametrize("seed, message", [
    (-1, "✗ Seed: -1 is less than 0: numpy's generators take no negative seed."),
    (1.5, "✗ Seed: 1.5 is not a whole number from 0 to 2,147,483,647."),
    (None, "✗ Seed: nothing is not a whole number from 0 to 2,147,483,647."),
])
def test_a_playground_seed_out_of_range_is_said_not_raised(seed, message):
    assert playground.make_board(5, 2, 0.2, seed) == (None, "", message)


def test_an_episode_or_stage_number_that_is_not_one_is_said(lab):
    engine, ids = lab
    assert episode.episode_view(engine, 1.5) == {"error": "✗ Episode: 1.5 is not a whole number from 1 to "
                                                          "9,223,372,036,854,775,807."}
    assert episode.episode_view(engine, 1e30)["error"].startswith("✗ Episode: 1,000,000,000,000,000,019,884,624,838,"
                                                                  "656 is more than 9,223,372,036,854,775,807")
    assert leaderboard.benchmark_stage(engine, ids["history"], 1.5) == \
        "✗ Stage: 1.5 is not a whole number from 0 to 1,000."
    assert leaderboard.benchmark_stage(engine, ids["history"], -1) == "✗ Stage: -1 is less than 0."


def test_make_board_from_knobs_is_seeded():
    a, b = playground.make_board(5, 2, 0.2, 3), playground.make_board(5, 2, 0.2, 3)
    assert a[1] == b[1] and a[1].count("H") == 5
    assert playground.make_board(2, 3, 0.5, 0)[0] is None


# ---------------------------------------------------------------- leaderboard


def test_the_leaderboard_puts_checkpoints_side_by_side(lab):
    engine, ids = lab
    assert leaderboard.checkpoint_choices(engine) == []
    assert "none has been evaluated on the benchmark" in leaderboard.leaderboard(engine, [])["note"]
    b = boards()
    with session(engine) as s:
        for stage_index, texts in ((0, [CROSSING_CLASH, OPEN_OFF_GRID]),
                                   (1, [format_plan(b["crossing"].reference_plan), OPEN_OFF_GRID])):
            for inst, text, subset in zip((b["crossing"], b["open"]), texts, (0.25, 0.75), strict=True):
                o = score_answer(inst, text)
                s.add(Episode(run_id=ids["history"], stage_index=stage_index, split="benchmark", instance_id=inst.id,
                              instance=inst.model_dump(mode="json"), size=3, num_agents=2, subset=subset,
                              completion=text, outcome=o.to_dict(), valid=o.valid, optimal=o.optimal,
                              failure=None if o.failure is None else o.failure.value))
        s.commit()
    keys = [key for _, key in leaderboard.checkpoint_choices(engine)]
    assert keys == [f"{ids['history']}:0", f"{ids['history']}:1"]
    shown = leaderboard.leaderboard(engine, keys)
    by_size, by_subset = shown["by_size"], shown["by_subset"]
    assert [row[0] for row in shown["local"]["data"]] == [
        f"{reference.TINY_NAME}; imitation of solver plans on 2, 3, 4, 5 agents, no RL",
        f"run #{ids['history']} curriculum, stage 0",
        f"run #{ids['history']} curriculum, stage 1"]
    assert shown["local"]["headers"] == ["this lab", "2 agents", "3 agents", "4 agents", "5 agents"]
    assert shown["local"]["data"][2][1:] == ["50.00 / 50.00", "-", "-", "-"]  # these boards have 2 agents
    assert by_size["data"] == [[2, "3x3", "0.0% / 0.0%", "50.0% / 50.0%"], [2, "mean", "0.0% / 0.0%", "50.0% / 50.0%"]]
    assert by_subset["data"] == [[2, "0.25", "0.0% / 0.0%", "100.0% / 100.0%"],
                                 [2, "0.75", "0.0% / 0.0%", "0.0% / 0.0%"]]


def test_the_leaderboard_opens_on_an_evaluated_checkpoint_when_none_is_chosen(lab):
    engine, ids = lab
    with gr.Blocks():
        tab = leaderboard.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    nothing = tab.opened([], ids["history"])  # no checkpoint evaluated: nothing to open on
    assert (nothing[tab.pick]["value"], nothing[tab.by_size]["visible"]) == ([], False)
    b = boards()
    with session(engine) as s:
        for run_id, stage_index in ((ids["history"], 0), (ids["history"], 1), (ids["waiting"], 0)):
            o = score_answer(b["crossing"], CROSSING_CLASH)
            s.add(Episode(run_id=run_id, stage_index=stage_index, split="benchmark", instance_id=b["crossing"].id,
                          instance=b["crossing"].model_dump(mode="json"), size=3, num_agents=2, subset=0.25,
                          completion=CROSSING_CLASH, outcome=o.to_dict(), valid=o.valid, optimal=o.optimal,
                          failure=o.failure.value))
        s.commit()
    mine = tab.opened(None, ids["history"])  # the open run's last stage evaluated on the benchmark
    assert mine[tab.pick]["value"] == [f"{ids['history']}:1"]
    assert mine[tab.by_size]["visible"] and mine[tab.by_size]["value"]["headers"] == [
        "agents", "size", f"run #{ids['history']} curriculum, stage 1"]
    assert tab.opened([], None)[tab.pick]["value"] == [f"{ids['waiting']}:0"]  # no run open: the last offered
    chosen = [f"{ids['history']}:0"]
    assert tab.opened(chosen, ids["waiting"])[tab.pick]["value"] == chosen  # a choice made stays


def test_the_leaderboard_names_the_hash_of_the_boards_its_rows_were_scored_on(lab, tmp_path: Path):
    """A stage scored on benchmark boards (stored as the benchmark job stores them) is named on the Leaderboard with
    the hash `envlab bench-suite --format datasets` records for the same boards (a few cells, for speed)."""
    pytest.importorskip("datasets")
    engine, ids = lab
    entries = [e for cell in cells(Split.BENCHMARK)[:2] for e in build_cell(cell)[0]]  # 100 boards, table order
    folder = save_datasets({Split.BENCHMARK: entries}, tmp_path / "datasets")
    recorded = DatasetCard.load(folder / DATASET_CARD).data.boards_sha256
    scored = [EpisodeResult(e.instance, format_plan(e.instance.reference_plan),
                             score(e.instance, e.instance.reference_plan)) for e in entries]
    with session(engine) as s:
        store_evaluation(s, ids["history"], 1, Split.BENCHMARK, scored, [e.subset for e in entries])
    note = leaderboard.leaderboard(engine, [f"{ids['history']}:1"])["local_note"]
    assert recorded == {"benchmark": boards_hash(entries)}
    assert f"Boards sha256 `{recorded['benchmark']}`: run #{ids['history']} curriculum, stage 1." in note.split("\n\n")
    tiny = json.loads(reference.TINY_FILE.read_text())  # the shipped policy's row, scored on all 3,150 boards
    assert (f"Boards sha256 `{tiny['boards_sha256']}`: tiny policy (shipped, assets/tiny-policy); imitation of "
            "solver plans on 2, 3, 4, 5 agents, no RL.") in note.split("\n\n")


def test_an_empty_lab_shows_the_paper_s_rows_and_the_tiny_policy_s_apart(tmp_path: Path):
    engine = make_engine(str(tmp_path / "empty.db"))
    upgrade(engine)
    shown = leaderboard.leaderboard(engine, [])
    assert shown["reference"] == {"headers": ["paper (arXiv 2606.17682)", "3 agents", "4 agents", "5 agents"], "data": [
        ["paper: LLM-as-Environment-Engineer (Qwen3-4B)", "51.67 / 31.67", "33.14 / 21.33", "18.67 / 11.00"],
        ["paper: GRPO with a random config", "40.42 / 26.08", "26.67 / 16.10", "15.11 / 9.11"]]}
    assert "arXiv 2606.17682" in shown["source"]
    tiny = json.loads(reference.TINY_FILE.read_text())
    means = tiny["mean_over_sizes"]
    assert shown["local"] == {"headers": ["this lab", "3 agents", "4 agents", "5 agents"], "data": [
        ["tiny policy (shipped, assets/tiny-policy); imitation of solver plans on 2, 3, 4, 5 agents, no RL",
         *(f"{means[a]['valid']:.2f} / {means[a]['optimal']:.2f}" for a in ("3", "4", "5"))]]}
    assert tiny["boards"] == sum(row["n"] for row in tiny["by_size"]) == 3150
    assert tiny["command"] in shown["local_note"] and "3,150 benchmark boards" in shown["local_note"]
    assert ("It learnt by imitation of the solver's plans (a warm start on boards of 2, 3, 4, 5 agents) and was never "
            "trained by RL, where the paper's rows are GRPO runs that trained on 2 agents") in shown["local_note"]
    assert load_policy("tiny").trained_agents == tuple(tiny["trained_agents"]) == (2, 3, 4, 5)
    paper = [float(cell.split(" / ")[0]) for cell in shown["reference"]["data"][1][1:]]
    assert all(means[a]["valid"] >= p for a, p in zip(("3", "4", "5"), paper, strict=True))  # the paper's random
    assert shown["by_size"]["data"] == [] and shown["by_subset"]["data"] == []
    engine.dispose()


def test_the_2_agent_tiny_policys_row_says_why_it_scores_0_on_3_to_5_agents():
    """The policy before it, kept for the runs made with it: warm-started on 2 agents only, as its folder says."""
    row = reference.tiny_row(reference.TINY_FILE.with_name("tiny-2agent.json"))
    assert row.name == ("tiny-2agent policy (shipped, assets/tiny-2agent-policy); imitation of solver plans on 2 "
                        "agents, no RL")
    assert [row.mean_over_sizes[a][0] for a in (3, 4, 5)] == [0.0, 0.0, 0.0]
    assert row.source.endswith(
        "It was warm-started on boards of 2 agents only, and a policy answers for the agent counts it has seen: on 3, "
        "4, 5 agents its answers name the wrong number of agents (`wrong_agent_count`), so it scores 0 there")
    assert load_policy("tiny-2agent").trained_agents == (2,)


# ---------------------------------------------------------------- who decides


def test_decisions_record_the_login_name_or_local():
    assert common.user_of(None) == "local"
    assert common.user_of(gr.Request()) == "local"
    assert common.user_of(gr.Request(username="ann")) == "ann"


# ---------------------------------------------------------------- train, after a failure


def test_a_failed_stage_is_said_plainly_and_resumed(lab):
    engine, ids = lab
    proposal.decide_proposal(engine, ids["pending"], "accept", "alice")
    with session(engine) as s:
        job = claim(s, "w1")
        fail(s, job.id, "StageError: no checkpoint folder there")
    assert advance(engine, ids["waiting"]).text.startswith("failed: stage 1")
    t = train.train_view(engine, ids["waiting"])
    assert "is **failed**" in t["status"] and "StageError: no checkpoint folder there" in t["progress"]
    assert train.resume_run(engine, ids["waiting"]) == f"Run #{ids['waiting']}: queued job(s) {job.id} again " \
                                                      "(a stage resumes from its checkpoint)."
    assert worker.worker_status(engine)[0] == "waiting"


def test_an_episode_stored_without_its_outcome_is_scored_again(lab):
    engine, ids = lab
    with session(engine) as s:
        ep = s.get(Episode, ids["clash"])
    inst = Instance.model_validate(ep.instance)
    expected = score(inst, (("DOWN", "DOWN"), ("RIGHT", "RIGHT")))
    assert ep.subset is None and results.outcome_of(ep, inst) == expected
    ep.outcome = {}
    assert results.outcome_of(ep, inst) == expected


def test_a_proposal_shows_what_measuring_cost_beside_the_stage_it_read(lab):
    from datetime import timedelta

    engine, ids = lab
    with session(engine) as s:
        p = s.get(Proposal, ids["pending"])
        p.compute = {"completions": 1280, "seconds": 15.4, "probes": 20, "cached": 4}
        stage = s.exec(select(Stage).where(Stage.run_id == p.run_id, Stage.index == p.after_stage)).one()
        stage.started_at = utcnow()
        stage.finished_at = stage.started_at + timedelta(seconds=181)
        s.add_all([p, stage])
        s.commit()
        after = p.after_stage
    text = proposal.proposal_view(engine, ids["pending"]).rationale
    assert text.endswith(" Measuring configs on the policy cost 1,280 sampled answers in 15 s (20 probes, 4 of them "
                         f"cached); stage {after} itself took 181 s.")
    assert "Measuring" not in proposal.proposal_view(engine, ids["second"]).rationale


def test_the_train_tabs_buttons_follow_the_runs_stored_status(lab):
    """The button to press is the primary one, by the stored status (after a restart a failed run is resumed, not
    moved along), and a button that can do nothing is disabled."""
    engine, ids = lab
    states = {status: train.button_states(status) for status in (*RunStatus, None)}
    assert {status: ([n for n, b in s.items() if b["variant"] == "primary"],
                     [n for n, b in s.items() if b["interactive"]]) for status, s in states.items()} == {
        RunStatus.ACTIVE: (["queue"], ["queue", "cancel"]),
        RunStatus.WAITING: ([], ["cancel"]),
        RunStatus.FAILED: (["resume"], ["resume", "cancel"]),
        RunStatus.CANCELLED: (["resume"], ["resume", "cancel"]),
        RunStatus.DONE: ([], []),
        None: ([], [])}
    assert all(s["cancel"]["variant"] == "stop" for s in states.values())
    with gr.Blocks():
        tab = train.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    shown = tab.show(ids["waiting"])  # a run whose proposal waits: decided on the Proposal tab
    assert [shown[tab.buttons[n]]["interactive"] for n in ("queue", "resume", "cancel")] == [False, False, True]


def test_the_progress_bar_says_the_jobs_phase_beside_its_steps():
    job = Job(id=7, kind="stage", status="running", step=0, total=240, run_id=1, target=1,
              log_tail="generated 4/4 training boards\nGRPO: 4 boards, 4 generations each, up to 240 steps\n")
    bar = train._progress_bar(job)
    assert "stage job 7 (stage 1): running, step 0 of 240 (GRPO: 4 boards, 4 generations each, up to 240 steps)" in bar
    done = Job(id=7, kind="stage", status="done", step=240, total=240, run_id=1, target=1, log_tail="saved x\n")
    assert "(saved x)" not in train._progress_bar(done)  # a phase is said while the job runs


def test_a_proposal_that_repeats_a_rejected_one_says_so(lab):
    engine, ids = lab
    before = proposal.proposal_view(engine, ids["second"]).status
    assert "same config as rejected" not in before  # but said before asking: a deterministic engineer repeats
    assert before.endswith("**Waiting for a decision.** Asked again, the `heuristic` engineer answers this same config "
                           "(it reads only this stage's results): to change it, edit it below, or switch the run's "
                           "engineer in the Train tab before rejecting.")
    assert [ENGINEERS[e].why_same for e in ("static", "bandit", "evidence")] == [
        "it proposes the configs its run holds", "it reads the training logs of its run's stages so far",
        "it reads only this stage's results"]
    said = proposal.decide_proposal(engine, ids["second"], "reject", "ann", "try something else")
    assert said.startswith(f"✓ Proposal #{ids['second']} rejected by ann.")
    again = propose(engine, ids["history"])  # the heuristic engineer, asked again, answers the same
    with session(engine) as s:
        assert s.get(Proposal, again).projected_config == s.get(Proposal, ids["second"]).projected_config
    assert (f"⚠ **The same config as rejected proposal #{ids['second']}**: the `heuristic` engineer answered the "
            "same when asked again.") in proposal.proposal_view(engine, again).status


def _connections(engine, action) -> int:
    """How many database connections `action()` opens (a session opens one)."""
    from sqlalchemy import event

    opened = []

    def count(connection) -> None:
        opened.append(connection)

    event.listen(engine, "engine_connect", count)
    try:
        action()
    finally:
        event.remove(engine, "engine_connect", count)
    return len(opened)


def test_a_decision_is_one_session_and_a_keystroke_reads_the_proposal_once(lab):
    engine, ids = lab
    with gr.Blocks():
        tab = proposal.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    typed = [[3, 0.5, 0.2, 0.25], [4, 0.5, 0.45, 0.25]]
    assert _connections(engine, lambda: tab.checker(ids["pending"], typed, 2, 16)) == 1
    said = []
    assert _connections(engine, lambda: said.append(proposal.decide_proposal(
        engine, ids["pending"], "edit", "bob", "", typed, 2, 16))) == 1
    assert said == [f"✓ Proposal #{ids['pending']} edited by bob; stored: data_ratio[3] 0.5, data_ratio[4] 0.5, "
                    "hole_ratio[4] 0.45. Next: queued stage 1 (edit by bob)."]


def test_a_random_share_shows_in_the_diff_and_the_timeline_and_an_edit_keeps_it(lab):
    engine, ids = lab
    with session(engine) as s:
        base = EnvConfig.model_validate(stages_of(s, ids["waiting"])[-1].config)
        raw = {"hole_ratio": {"3": 0.3}, "random_share": 0.5}
        answer = EngineerAnswer(prompt="", raw="{}", proposed=raw, projection=project(raw, base), rationale="broad")
        pid = store_proposal(s, ids["waiting"], 0, "learnability", answer, base).id
    v = proposal.proposal_view(engine, pid)
    assert v.changed["data"] == [[3, "hole_ratio", "0.2", "**0.3**", "+0.1", ""],
                                    ["all", "random_share", "0", "**0.5**", "+0.5", ""]]
    rows, agents, instances = v.edit, 2, 16
    rows[1][2] = 0.4
    message = proposal.decide_proposal(engine, pid, "edit", "bob", "", rows, agents, instances)
    assert message.startswith(f"✓ Proposal #{pid} edited by bob")
    assert decisions(engine)[-1].config.random_share == 0.5  # the table has no cell for it: the proposal's
    advance(engine, ids["waiting"])
    timeline = review.timeline(engine, ids["waiting"])
    assert timeline["headers"][-1] == "random_share"
    assert timeline["data"][-1] == [1, f"proposal #{pid}, edited by bob", 4, "0.5", "0.4 (person)", "0.25", "2=1",
                                    "16", "0.5 (engineer)"]


# ---------------------------------------------------------------- configs the generator cannot fill, failed proposals

# On the seeded runs' sizes 3 and 4 (hole_ratio 0.2 and, in the pending proposal, 0.5) no board holds 5 agents.
NO_ROOM_FOR_5 = ("size 4: hole_ratio 0.5 leaves 8 ice cells, too few for 5 agents' starts and goals (10 cells), and "
                 "no other map size of the config holds them")


def _proposal_tab(engine) -> proposal.ProposalTab:
    with gr.Blocks():
        return proposal.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))


def _failed_proposal(engine, run_id: int) -> int:
    """A proposal that failed as the loop fails one the generator cannot fill: the engineer's config is kept as it
    answered (size 3's share 0.5 -> 0.6), with no projection."""
    with session(engine) as s:
        base = EnvConfig.model_validate(stages_of(s, run_id)[-1].config)
        said = {**base.model_dump(mode="json"), "data_ratio": {"3": 0.6, "4": 0.4}}
        answer = EngineerAnswer(prompt="", raw=json.dumps(said), proposed=said, projection=None,
                                rationale="size 3: data_ratio 0.5 -> 0.6 (learnable)",
                                error="the generator cannot fill the proposed config: size 3: scripted")
        return store_proposal(s, run_id, stages_of(s, run_id)[-1].index, "heuristic", answer, base).id


def test_the_live_check_runs_the_decisions_generator_check_and_holds_the_buttons(lab):
    engine, ids = lab
    tab = _proposal_tab(engine)
    view = proposal.proposal_view(engine, ids["pending"])
    fives = [[2, 0, 1.0], [5, 1, 0.0]]  # the mix table: every board 5 agents
    checked = tab.checker(ids["pending"], view.edit, fives, 16)
    assert checked[tab.check] == f"✗ This config cannot be generated: {NO_ROOM_FOR_5}."
    assert [checked[tab.buttons[a]]["interactive"] for a in (Action.ACCEPT, Action.EDIT)] == [False, False]
    assert proposal.decide_proposal(engine, ids["pending"], "edit", "bob", "", view.edit, fives, 16) == \
        f"✗ the edited config cannot be generated: {NO_ROOM_FOR_5}"
    assert [d.proposal_id for d in decisions(engine)] == [ids["accepted"]]
    ok = tab.checker(ids["pending"], view.edit, view.agents, 16)  # the proposal as it stands: the buttons free
    assert [ok[tab.buttons[a]]["interactive"] for a in (Action.ACCEPT, Action.EDIT)] == [True, True]


def test_the_runs_form_checks_that_its_config_can_be_generated_and_holds_the_button(lab):
    engine, _ = lab
    before = runs.run_choices(engine)
    table = [[3, 0.5, 0.2, 0.25], [4, 0.5, 0.5, 0.25]]
    with gr.Blocks():
        tab = runs.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    held = tab.checked(table, "5", 32, 7)
    assert (held[tab.check], held[tab.create]["interactive"]) == (
        f"✗ The initial config cannot be generated: {NO_ROOM_FOR_5}.", False)
    assert runs.create_run_from_form(engine, "five", "", "tiny", "fixed", "", "", 2, 32, "5", 7, False, table) == (
        f"✗ The initial config cannot be generated, nothing was stored: {NO_ROOM_FOR_5}", None)
    assert runs.run_choices(engine) == before
    # the default scenario with 2 to 5 agents can be drawn: no 4- or 5-agent board on a 3x3, where 7 ice cells are
    free = tab.checked(common.config_rows(EnvConfig.default()), "2=0.25, 3=0.25, 4=0.25, 5=0.25", 512, 0)
    assert (free[tab.check], free[tab.create]["interactive"]) == (
        "The generator can draw the stages' boards from this config: size 3: hole_ratio 0.2 leaves 7 ice cells, room "
        "for 3 agents' starts and goals: its boards have 2 or 3 agents; the boards of more agents go to the sizes "
        "that hold them.", True)


def test_a_failed_proposal_cannot_be_accepted_and_its_edit_is_the_main_button(lab):
    engine, ids = lab
    tab = _proposal_tab(engine)
    failed = _failed_proposal(engine, ids["waiting"])
    shown = tab.show(failed)
    buttons = {a: (shown[tab.buttons[a]]["interactive"], shown[tab.buttons[a]].get("variant")) for a in Action
               if a in tab.buttons}
    assert buttons == {Action.ACCEPT: (False, "secondary"), Action.EDIT: (True, "primary"),
                       Action.REJECT: (True, None)}
    table = proposal.proposal_view(engine, failed).edit  # the config in force
    checked = tab.checker(failed, table, 2, 16)
    assert checked[tab.check] == "The table is the config in force: *Apply my edit* keeps it for the next stage."
    assert [checked[tab.buttons[a]]["interactive"] for a in (Action.ACCEPT, Action.EDIT)] == [False, True]
    ok = tab.show(ids["second"])  # a proposal with a config: Accept is the main button
    assert [(ok[tab.buttons[a]]["interactive"], ok[tab.buttons[a]]["variant"]) for a in (Action.ACCEPT, Action.EDIT)] \
        == [(True, "primary"), (True, "secondary")]


def test_a_decided_failed_proposal_shows_what_the_engineer_proposed_and_what_was_stored(lab):
    engine, ids = lab
    tab = _proposal_tab(engine)
    failed = _failed_proposal(engine, ids["waiting"])
    waiting = proposal.proposal_view(engine, failed)  # the engineer's values, as its rationale tells them
    assert waiting.changed["data"] == [
        [3, "data_ratio", "0.5", "0.5", "0", "the engineer proposed 0.6 (its proposal failed: not applied)"],
        [4, "data_ratio", "0.5", "0.5", "0", "the engineer proposed 0.4 (its proposal failed: not applied)"]]
    assert "\n\n0 of 8 values change." in waiting.rationale  # nothing of a failed proposal applies
    table = [[3, 0.0, 0.2, 0.25], [4, 1.0, 0.2, 0.25]]
    assert proposal.decide_proposal(engine, failed, "edit", "bob", "", table, 2, 16).startswith(
        f"✓ Proposal #{failed} edited by bob")
    decided = proposal.proposal_view(engine, failed)
    assert decided.changed["data"] == [
        [3, "data_ratio", "0.5", "✎ 0", "-0.5", "✎ set by bob; the engineer proposed 0.6"],
        [4, "data_ratio", "0.5", "✎ 1", "+0.5", "✎ set by bob; the engineer proposed 0.4"]]
    assert "data\\_ratio 0.5 -&gt; 0.6" in decided.rationale
    after = tab.after_decision(ids["waiting"], failed)  # the preview is drawn again, from the stored config
    titles = [a.text for a in after[tab.preview].layout.annotations]
    assert len(titles) == 4 and all(t.startswith("4x4") for t in titles)  # size 3 has no share
    assert after[tab.preview_note].startswith("4 boards drawn from the config stored with the decision (seed ")


def test_an_edit_lists_only_the_values_the_projection_moves_from_what_was_typed(lab):
    """The agent mix as the table shows it (three shares of 0.3333, summing to 0.9999) is rescaled, but no share
    moves from what was typed as shown: the message lists the data shares edited, not each unmoved agent share."""
    engine, ids = lab
    with session(engine) as s:
        base = EnvConfig.model_validate(stages_of(s, ids["waiting"])[-1].config)
        raw = {"agent_ratio": {"2": 1 / 3, "3": 1 / 3, "4": 1 / 3}}
        answer = EngineerAnswer(prompt="", raw=json.dumps(raw), proposed=raw, projection=project(raw, base),
                                rationale="a third of each count")
        third = store_proposal(s, ids["waiting"], stages_of(s, ids["waiting"])[-1].index, "llm", answer, base).id
    view = proposal.proposal_view(engine, third)
    assert [row[:2] for row in view.agents] == [[2, 0.3333], [3, 0.3333], [4, 0.3333], [5, 0.0]]
    data = [[3, 0.4, 0.2, 0.25], [4, 0.6, 0.2, 0.25]]
    assert proposal.edit_check(engine, third, data, view.agents, 16) == (
        "*Apply my edit* will store: data_ratio[3] 0.4, data_ratio[4] 0.6.", True, [])
    typed = [[2, 0.5, 0], [3, 0.3, 0], [4, 0.3, 0], [5, 0, 0]]  # sums to 1.1: every share moves, and is listed
    assert proposal.edit_check(engine, third, data, typed, 16)[0] == (
        "*Apply my edit* will store: data_ratio[3] 0.4, data_ratio[4] 0.6, agent_ratio[2] 0.4545 (you typed 0.5), "
        "agent_ratio[3] 0.2727 (you typed 0.3), agent_ratio[4] 0.2727 (you typed 0.3); the agent_ratio shares you "
        "typed sum to 1.1, so each is rescaled to make them sum to 1.")


def test_cancel_asks_for_a_confirmation_and_the_cancelled_stage_shows_as_cancelled(lab):
    engine, ids = lab
    run_id = ids["waiting"]
    proposal.decide_proposal(engine, ids["pending"], "accept", "alice")  # stage 1 queued
    with gr.Blocks():
        tab = train.build(common.Page(engine, gr.Dropdown(), gr.Tabs(), gr.HTML(), gr.HTML()))
    asked = tab.cancel(run_id, None)
    assert asked[tab.message] == f"Cancel run #{run_id}? Its queued and running jobs stop. Click *Confirm cancel* " \
        "to stop it."
    assert (asked[tab.buttons["cancel"]]["value"], asked[tab.armed]) == ("Confirm cancel", run_id)
    with session(engine) as s:  # the first click cancels nothing
        assert s.get(Run, run_id).status == RunStatus.ACTIVE
    assert tab.cancel(run_id, ids["history"])[tab.armed] == run_id  # a click armed on another run asks again
    done = tab.cancel(run_id, run_id)
    assert done[tab.message].startswith(f"Run #{run_id} is cancelled. Cancel requested for job")
    assert (done[tab.buttons["cancel"]]["value"], done[tab.armed]) == ("Cancel this run", None)
    train.advance_run(engine, run_id)  # the loop reads the cancelled job: the stage stops
    status = train.train_view(engine, run_id)["status"]
    assert "is **cancelled**" in status and status.count("stages: 0 done, 1 cancelled.") == 1
