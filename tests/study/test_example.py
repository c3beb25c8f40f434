"""The shipped example: a new lab imports it on its first start and never again, `--no-example` leaves a new lab
empty, and `assets/example-run.zip` holds the real 3-stage heuristic run that `python scripts/make_example.py --make`
makes, with a decision of each kind and the reason for each."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from sqlmodel import func, select

from envsim.config import EnvConfig
from envsim.suite import Split
from lab.archive import ArchiveError, read_manifest
from lab.cli.serve import EXAMPLE_PID, example_beside
from lab.engineers import ENGINEERS
from lab.loop import create_run, evidence_for, stages_of
from lab.pages import web as app
from lab.pages.runs import run_choices, runs_table
from lab.results import stage_summaries
from lab.study import example
from lab.study.example import EXAMPLE, NAME, ensure_example
from scripts.make_example import decision, make
from storage.db import RUNS_SETTING, make_engine, session, upgrade
from storage.models import Action, Decision, Episode, Job, Proposal, Run, RunStatus, StageStatus
from storage.settings import RunSettings
from tests.recorded import CONFIG
from tests.servers import free_port

VALIDATION_BOARDS = 630  # 30 a size and agent count: 3 to 5 agents on sizes 3 (5: 5) to 10
BENCHMARK_BOARDS = 3150


def _engine(path: Path):
    engine = make_engine(str(path))
    upgrade(engine)
    return engine


def _runs(engine) -> list[Run]:
    with session(engine) as s:
        return list(s.exec(select(Run).order_by(Run.id)))


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The shipped example imported into a fresh lab: (engine, run id)."""
    engine = _engine(tmp_path_factory.mktemp("example") / "envlab.db")
    yield engine, ensure_example(engine)
    engine.dispose()


# ---------------------------------------------------------------- a lab's first start


def test_a_new_lab_gets_the_example_once_and_marked_as_one(tmp_path: Path):
    engine = _engine(tmp_path / "envlab.db")
    run_id = ensure_example(engine)
    assert run_id is not None
    assert ensure_example(engine) is None  # the second start: the database is not empty
    [run] = _runs(engine)
    assert (run.id, run.name, run.settings.example) == (run_id, NAME, True)
    assert run.description.startswith("Example: ")
    assert run_choices(engine) == [(f"#{run_id} {NAME} (done)", run_id)]  # the Runs list says what it is
    with pytest.raises(ArchiveError, match="is already in this database"):  # and the archive refuses it twice
        example.import_run(engine, EXAMPLE)
    engine.dispose()


def test_a_lab_that_holds_a_run_is_left_as_it_is(tmp_path: Path):
    engine = _engine(tmp_path / "envlab.db")
    with session(engine) as s:
        mine = create_run(s, name="mine", config=CONFIG, settings=RunSettings(stages=1)).id
    assert ensure_example(engine, tmp_path / "not-read.zip") is None
    assert [r.id for r in _runs(engine)] == [mine]
    engine.dispose()


def test_a_missing_example_file_is_said_in_one_line_and_the_lab_starts_empty(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setattr(example, "EXAMPLE", tmp_path / "gone.zip")
    engine = _engine(tmp_path / "envlab.db")
    app.add_example(engine)
    assert capsys.readouterr().err == f"the example run was not imported: {tmp_path / 'gone.zip'}: no such file\n"
    assert _runs(engine) == []
    engine.dispose()



def test_serve_imports_the_example_before_the_page_is_built_unless_no_example(tmp_path: Path, monkeypatch, capsys):
    """`python app.py` / `envlab serve` down to the page: the example is in before `build_demo` runs, once, and the
    shipped study is imported beside the page from when it serves (the page does not wait for it, nor does its
    first answer share the machine with it; here it serves until the import ends); `--no-example` leaves a new lab
    empty. The page itself is not built or served here (tests/pages/test_app.py)."""
    runs_when_built: list[list[str]] = []
    importing_when_built: list[bool] = []
    importing_when_served: list[bool] = []

    def importing() -> bool:
        return any(t.name == "envlab-study-import" for t in threading.enumerate())

    def build_demo(engine, own_worker=True, kept=None):
        assert not own_worker and kept is None  # --no-worker: the badge will say no worker was started
        runs_when_built.append([r.name for r in _runs(engine)][:1])
        importing_when_built.append(importing())
        return "the page"

    monkeypatch.setattr(app, "build_demo", build_demo)
    def launch(demo, *args, served, **kwargs):  # a page that serves until the study's import has ended
        served()  # the page answers
        importing_when_served.append(importing())
        for thread in threading.enumerate():
            if thread.name == "envlab-study-import":
                thread.join()

    monkeypatch.setattr(app, "launch", launch)
    monkeypatch.setattr(app.signal, "signal", lambda *args: None)
    port = str(free_port())

    empty, first = str(tmp_path / "empty.db"), str(tmp_path / "first.db")
    assert app.main(["--db", empty, "--port", port, "--no-worker", "--no-example"]) == 0
    assert app.main(["--db", first, "--port", port, "--no-worker"]) == 0
    said = capsys.readouterr().err
    assert "an empty lab: the example run is run #1" in said
    assert "the shipped study's 3 experiment(s) are on the Compare tab" in said
    assert app.main(["--db", first, "--port", port, "--no-worker"]) == 0
    assert "example" not in capsys.readouterr().err
    empty_lab, first_start, second_start = runs_when_built
    assert empty_lab == [] and first_start == second_start == [NAME]
    assert importing_when_built == [False, False, False]  # not while the page is built: its first answer is first
    assert importing_when_served == [False, True, False]  # from when it serves, on the first start
    # the example, then second-pass (5 arms x 8 seeds), hardstart (5 arms x 6 seeds) and defaults (3 arms x 6 seeds),
    # nothing imported twice
    assert len(_runs(_engine(Path(first)))) == 1 + 40 + 30 + 18
    engine = make_engine(first)
    assert run_choices(engine)[0][0].startswith(f"#1 {NAME}")  # the example heads the runs, not the study's
    assert runs_table(engine)["data"][0][:2] == [1, NAME]
    engine.dispose()
    engine = _engine(Path(first))
    assert app.linked(engine, {})["run"] == 1  # the lab opens on the example, not on a run of the study
    engine.dispose()


def test_serve_has_the_example_imported_beside_the_pages_imports_and_the_page_waits_for_it(tmp_path: Path,
                                                                                          monkeypatch, capfd):
    """`envlab serve` forks a process that brings a new lab's example in while the page imports its libraries
    (`lab.cli.serve.example_beside`): the page waits for it, is built with the example in, and imports nothing
    itself. Where that process fails (here the file is gone), the page tries itself and says why, once."""
    runs_when_built: list[list[str]] = []

    def build_demo(engine, own_worker=True, kept=None):
        runs_when_built.append([r.name for r in _runs(engine)])
        return "the page"

    def not_here(engine, *args, **kwargs):
        raise AssertionError("the page imported the example itself")

    monkeypatch.setattr(app, "build_demo", build_demo)
    monkeypatch.setattr(app, "launch", lambda demo, *args, served, **kwargs: None)
    monkeypatch.setattr(app, "studies_missing", lambda engine: False)  # the study's import: the test above
    monkeypatch.setattr(app.signal, "signal", lambda *args: None)
    monkeypatch.setattr(app, "ensure_example", not_here)  # the page's own; the forked process imports its own
    port = str(free_port())
    first = str(tmp_path / "first.db")
    monkeypatch.setenv(EXAMPLE_PID, str(example_beside(first)))
    assert app.main(["--db", first, "--port", port, "--no-worker"]) == 0
    assert EXAMPLE_PID not in os.environ  # waited for, and not told to the workers
    assert runs_when_built == [[NAME]]
    said = capfd.readouterr().err
    assert said.count("an empty lab: the example run is run #1 (--no-example leaves a new lab empty)\n") == 1, said
    assert len(_runs(_engine(Path(first)))) == 1

    monkeypatch.undo()
    monkeypatch.setattr(app, "build_demo", build_demo)
    monkeypatch.setattr(app, "launch", lambda demo, *args, served, **kwargs: None)
    monkeypatch.setattr(app.signal, "signal", lambda *args: None)
    monkeypatch.setattr(example, "EXAMPLE", tmp_path / "gone.zip")  # for the forked process and the page
    gone = str(tmp_path / "gone.db")
    monkeypatch.setenv(EXAMPLE_PID, str(example_beside(gone)))
    assert app.main(["--db", gone, "--port", port, "--no-worker"]) == 0
    said = capfd.readouterr().err
    assert said.count(f"the example run was not imported: {tmp_path / 'gone.zip'}: no such file\n") == 1, said
    assert runs_when_built[1:] == [[]]


# ---------------------------------------------------------------- what the shipped file holds


def test_the_file_is_a_small_run_archive_without_checkpoints():
    manifest = read_manifest(EXAMPLE)
    assert manifest["run"]["name"] == NAME
    assert manifest["checkpoints"] == []
    rows = {name: entry["rows"] for name, entry in manifest["tables"].items()}
    assert (rows["stages"], rows["proposals"], rows["decisions"]) == (4, 4, 4)
    assert EXAMPLE.stat().st_size < 5_000_000


def test_it_is_a_finished_3_stage_run_of_the_tiny_policy_on_2_to_5_agents_with_the_heuristic_engineer(shipped):
    engine, run_id = shipped
    with session(engine) as s:
        run = s.get(Run, run_id)
        assert (run.policy, run.engineer, run.seed, run.status) == ("tiny", "heuristic", 0, RunStatus.DONE)
        assert (run.settings.stages, run.settings.auto_apply) == (3, False)
        assert (run.settings.agent_counts, run.settings.validation_agents) == ((2, 3, 4, 5), (3, 4, 5))
        stages = stages_of(s, run_id)
        assert stages[0].checkpoint == "tiny"
        assert stages[0].config.agent_ratio == {2: 0.25, 3: 0.25, 4: 0.25, 5: 0.25}
        assert [(st.index, st.status) for st in stages] == [(k, StageStatus.DONE) for k in range(4)]
        summaries = stage_summaries(s, run_id)
        assert {k: summaries[k].pooled.episodes for k in summaries} == {k: VALIDATION_BOARDS for k in range(4)}
        validation = s.exec(select(Episode.stage_index, func.count()).where(
            Episode.run_id == run_id, Episode.split == Split.VALIDATION).group_by(Episode.stage_index)).all()
        benchmark = s.exec(select(Episode.stage_index, func.count()).where(
            Episode.run_id == run_id, Episode.split == Split.BENCHMARK).group_by(Episode.stage_index)).all()
    assert sorted(validation) == [(k, VALIDATION_BOARDS) for k in range(4)]  # every stage can be replayed
    assert sorted(benchmark) == [(0, BENCHMARK_BOARDS), (3, BENCHMARK_BOARDS)]  # the Leaderboard's before and after


def test_a_person_rejected_edited_and_accepted_its_proposals_saying_why(shipped):
    engine, run_id = shipped
    with session(engine) as s:
        rows = s.exec(select(Proposal, Decision).join(Decision, Decision.proposal_id == Proposal.id)
                      .where(Proposal.run_id == run_id).order_by(Proposal.id)).all()
        stages = stages_of(s, run_id)
    assert [(p.after_stage, d.action) for p, d in rows] == [
        (0, Action.REJECT), (0, Action.EDIT), (1, Action.ACCEPT), (2, Action.ACCEPT)]
    assert all(d.user == "example" and d.note.strip() for _, d in rows)
    (rejected, no), (edited, edit), (_, accept_1), (_, accept_2) = rows
    assert no.config is None and rejected.projected_config == edited.projected_config  # deterministic: the same again
    assert edit.config != edited.projected_config  # a real edit
    assert [st.config for st in stages[1:]] == [edit.config, accept_1.config, accept_2.config]
    assert "where conflicts end fewer than 50% of the boards" in no.note and "stays as it was at 3x3" in edit.note


def test_its_proposals_are_the_heuristics_and_its_decisions_are_lab_example_s(shipped):
    """The file agrees with the code: each proposal is what the heuristic makes of the run's stored results,
    and each decision (action, config, note) is what `decision` (scripts/make_example.py) takes on it now."""
    engine, run_id = shipped
    with session(engine) as s:
        run = s.get(Run, run_id)
        for proposal in s.exec(select(Proposal).where(Proposal.run_id == run_id).order_by(Proposal.id)):
            answer = ENGINEERS["heuristic"].propose(evidence_for(s, run, proposal.after_stage))
            assert answer.projection.config == proposal.projected_config
            assert answer.rationale == proposal.rationale
            stored = s.exec(select(Decision).where(Decision.proposal_id == proposal.id)).one()
            action, edited, note = decision(s, proposal)
            assert (action, note) == (stored.action, stored.note)
            if action == Action.EDIT:
                assert EnvConfig.model_validate(edited) == stored.config


def test_its_edited_proposal_shows_the_stored_config_and_work_on_its_weights_is_refused(shipped, tmp_path: Path):
    """The example ships no checkpoints: a benchmark of a trained stage and an export with checkpoints are
    refused when asked, saying so; its edited proposal shows the config the decision stored, not the engineer's."""
    from lab.archive import ArchiveError, export_run
    from lab.pages import leaderboard, proposal, runs

    engine, run_id = shipped
    with session(engine) as s:
        edited = s.exec(select(Decision).where(Decision.action == Action.EDIT)).one()
    view = proposal.proposal_view(engine, edited.proposal_id)
    assert view.edit[0][:4] == [3, round(edited.config.data_ratio[3], 4), 0.2, 0.25]  # wait_ratio kept 0.25
    kept = [r for r in view.changed["data"] if r[1] == "wait_ratio" and r[3] == "✎ 0.25"]
    assert [r[0] for r in kept] == [3]  # the size whose raise the person took out
    why = f"stage 1 of run {run_id} has no weights here: the example run ships without checkpoints (docs/example.md)"
    assert leaderboard.benchmark_stage(engine, run_id, 1) == f"✗ Not queued: {why}."
    assert runs.export_file(engine, run_id, True) == (None, f"✗ Not exported with checkpoints: {why}. "
                                                            "Export it without them.")
    with pytest.raises(ArchiveError, match=f"run {run_id} is the shipped example, whose checkpoints are not shipped"):
        export_run(engine, run_id, tmp_path / "x.zip", checkpoints=True)


def test_a_making_with_a_work_folder_goes_on_from_what_it_holds_and_does_nothing_twice(tmp_path: Path, monkeypatch):
    """`python scripts/make_example.py --make ZIP --work DIR` again on a folder whose run is trained, decided and
    benchmarked (the shipped run imported there: a making stopped just before its export leaves that): the run is
    found by its name, no job is queued or run again, no decision is made twice, and the file holds the same run."""
    monkeypatch.setenv(RUNS_SETTING, str(tmp_path))
    engine = _engine(tmp_path / "example.db")  # the making's own database in its folder
    run_id = example.import_run(engine, EXAMPLE)
    with session(engine) as s:
        jobs, decisions = s.exec(select(func.count(Job.id))).one(), s.exec(select(func.count(Decision.id))).one()
    engine.dispose()
    said: list[str] = []
    made = make(tmp_path / "made.zip", say=said.append, work=tmp_path)
    assert [line.split(" optimal")[0] for line in said[:4]] == [  # the run's own stages, said as they stand
        f"stage {k}/3 done: validation valid {rate}%" for k, rate in enumerate(("32.2", "33.2", "34.3", "35.1"))]
    assert said[4:] == ["stage 0 evaluated on the benchmark", "stage 3 evaluated on the benchmark",
                        f"run {run_id} -> {made} (2.0 MB, without checkpoints)"]
    engine = make_engine(str(tmp_path / "example.db"))
    with session(engine) as s:
        assert s.exec(select(func.count(Job.id))).one() == jobs == 10
        assert s.exec(select(func.count(Decision.id))).one() == decisions == 4
    engine.dispose()
    shipped, again = read_manifest(EXAMPLE), read_manifest(made)
    assert again["run"]["uuid"] == shipped["run"]["uuid"] and again["tables"] == shipped["tables"]


def test_the_shipped_study_is_imported_with_the_numbers_of_its_report(tmp_path: Path):
    """A new lab's Compare tab holds the shipped study (docs/results): each experiment, its runs attached to
    their arms, every number of its summary as the study's own database gives it, and the report shipped beside
    it linked."""
    import gzip
    import shutil

    from lab.pages.compare import compare_view, report_file
    from lab.study.comparison import comparison, summary_rows
    from lab.study.example import STUDIES, import_studies
    from lab.study.experiments import list_experiments, log_dir
    from lab.text import as_text

    engine = _engine(tmp_path / "lab.db")
    calls: list[tuple[int, int]] = []
    ids = import_studies(engine, progress=lambda done, total: calls.append((done, total)))
    assert len(ids) == 3
    # one call before the first run, then one per run, the total over every shipped database: 40 of second-pass,
    # 30 of hardstart, 18 of defaults
    assert calls == [(k, 88) for k in range(0, 89)]
    # oldest first, so the newest study, the lab's, is the newest experiment here: the Compare tab opens on it
    assert [p.experiment.name for p in list_experiments(engine)] == ["second-pass", "defaults", "hardstart"]
    compared = []
    for packed in sorted(STUDIES.glob("*/study.db.gz")):  # every shipped study, each experiment of it
        db = tmp_path / f"{packed.parent.name}.db"
        with gzip.open(packed, "rb") as src, db.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        shipped = make_engine(str(db))
        upgrade(shipped)  # as `envlab experiment report` does
        for name in sorted(p.experiment.name for p in list_experiments(shipped)):
            here = comparison(engine, name)
            assert summary_rows(here) == summary_rows(comparison(shipped, name))
            report = log_dir(engine, here.experiment) / "report"
            assert report_file(engine, here).startswith(f"Report: {as_text(str(report / 'report.md'))} (with")
            beside = packed.parent / name if (packed.parent / name).is_dir() else packed.parent
            assert sorted(p.name for p in report.iterdir()) == sorted(p.name for p in beside.iterdir()
                                                                      if p.suffix in (".md", ".csv", ".png"))
            assert (report / "report.md").read_bytes() == (beside / "report.md").read_bytes()
            compared.append(name)
        shipped.dispose()
    assert compared == ["second-pass", "defaults", "hardstart"]
    sizes = compare_view(engine, ids[-1])["sizes"]
    assert [row[0] for row in sizes["data"]] == ([f"{n}x{n}" for n in range(3, 11)] + ["all"]
                                                 + [f"{k} agents" for k in (3, 4, 5)])  # the lab's study: 3-5 agents
    engine.dispose()


def test_a_shipped_report_is_the_experiments_own_and_inside_its_folder(tmp_path: Path):
    """`shipped_report`: the experiment's own folder first, then the folder beside its database when that report is
    the experiment's; another experiment's report, a missing one, or a name that leads out of the folder: none."""
    from lab.study.example import shipped_report

    folder = tmp_path / "results" / "study"
    (folder / "alpha").mkdir(parents=True)
    (folder / "alpha" / "report.md").write_text("# Experiment alpha\n\nits numbers\n")
    (folder / "report.md").write_text("# Experiment beta\n")
    (tmp_path / "results" / "report.md").write_text("# Experiment ..\n")
    assert shipped_report(folder, "alpha") == folder / "alpha"
    assert shipped_report(folder, "beta") == folder
    assert shipped_report(folder, "gamma") is None  # beside it is beta's report, not gamma's
    assert shipped_report(folder, "..") is None  # the folder above holds a report.md that names "..": not followed
    assert shipped_report(tmp_path / "nowhere", "alpha") is None
