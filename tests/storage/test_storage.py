"""Storage on SQLite and PostgreSQL: migrations, JSON and time columns, one decision per proposal."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from pydantic import ValidationError
from sqlalchemy import JSON, Engine, Float, cast, column, func, insert, inspect, table, text, update
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.sql.expression import TableClause
from sqlmodel import SQLModel, select

from envsim.config import EnvConfig
from storage.db import alembic_config, current_revision, database_url, make_engine, session, upgrade
from storage.decisions import AlreadyDecided, record_decision
from storage.models import (
    Decision,
    Episode,
    Experiment,
    Job,
    Probe,
    Proposal,
    Run,
    Shipped,
    Stage,
    StageMetric,
    TrainingLog,
    Unreadable,
    UTCDateTime,
)
from storage.settings import ExperimentSettings, RunSettings
from tests.processes import in_processes
from tests.schema import HEAD

ENV = EnvConfig(data_ratio={3: 0.5, 4: 0.5}, hole_ratio={3: 0.1, 4: 0.2}, wait_ratio={3: 0.0, 4: 0.25})
CONFIG = ENV.model_dump(mode="json")  # as the lab stores it

EXPERIMENT = ExperimentSettings(run=RunSettings(stages=2), config=EnvConfig.default(), steps_per_stage=1,
                                validation_boards=1)


def _run(s, **fields) -> Run:
    run = Run(**{"name": "r", "policy": "tiny", "engineer": "self", "engineer_backend": "in-process", "seed": 7,
                 "settings": RunSettings(stages=1), **fields})
    s.add(run)
    s.commit()
    return run


def _proposal(s, run: Run) -> Proposal:
    proposal = Proposal(
        run_id=run.id, after_stage=0, engineer="self", prompt="p", raw_answer="a", projected_config=CONFIG
    )
    s.add(proposal)
    s.commit()
    return proposal


def _as_first_written(model, *without: str) -> TableClause:
    """The model's table with only the columns the first schema had (and no Python-side defaults)."""
    return table(
        model.__tablename__, *(column(c.name, c.type) for c in model.__table__.c if c.name not in without)
    )


def _schema_diff(engine: Engine) -> list:
    with engine.connect() as connection:
        return compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)


# --- the database setting and engine -------------------------------------------------------------


def test_database_setting_is_a_path_or_a_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENVLAB_DB", raising=False)
    assert database_url() == "sqlite:///runs/envlab.db"
    assert (tmp_path / "runs").is_dir()
    monkeypatch.setenv("ENVLAB_DB", "lab/a.db")
    assert database_url() == "sqlite:///lab/a.db" and (tmp_path / "lab").is_dir()
    monkeypatch.setenv("ENVLAB_DB", "postgresql+psycopg://u@h/envlab")
    assert database_url() == "postgresql+psycopg://u@h/envlab"
    assert database_url("other.db") == "sqlite:///other.db"


def test_sqlite_connections_share_the_file_safely(tmp_path: Path):
    engine = make_engine(str(tmp_path / "x.db"))
    with engine.connect() as connection:
        names = ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        values = [connection.exec_driver_sql(f"PRAGMA {name}").scalar() for name in names]
    assert values == ["wal", 1, 1, 30_000]  # synchronous 1 is NORMAL
    engine.dispose()


# --- migrations ---------------------------------------------------------------------------------


def test_models_agree_with_the_head_migration(engine: Engine):
    assert current_revision(engine) == HEAD
    assert _schema_diff(engine) == []


def test_database_made_by_the_first_schema_upgrades_with_its_data(db_url: str):
    engine = make_engine(db_url)
    upgrade(engine, "0001")
    # the comparison does see differences: the columns that later revisions add
    added = sorted(d[2] + "." + d[3].name for d in _schema_diff(engine) if d[0] == "add_column")
    assert added == ["decisions.probes", "episodes.subset", "jobs.needs_gpu", "jobs.priority", "jobs.processes",
                     "jobs.run_id", "jobs.slurm", "jobs.target", "jobs.vllm_server", "proposals.compute",
                     "proposals.replay", "runs.arm", "runs.description", "runs.experiment_id", "runs.status_reason",
                     "runs.uuid", "stage_metrics.agents", "stages.replay"]
    created = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    runs, stages, proposals, decisions = (
        _as_first_written(Run, "description", "uuid", "status_reason", "experiment_id", "arm"),
        _as_first_written(Stage), _as_first_written(Proposal, "compute"), _as_first_written(Decision, "probes"),
    )
    with engine.begin() as c:
        run_id = c.execute(
            insert(runs).returning(runs.c.id),
            dict(
                name="old",
                policy="tiny",
                engineer="self",
                engineer_backend="in-process",
                settings={"stages": 1, "auto_apply": True},
                seed=3,
                status="done",
                created_at=created,
            ),
        ).scalar_one()
        c.execute(insert(stages), dict(run_id=run_id, index=0, config=CONFIG, status="done"))
        proposal_id = c.execute(
            insert(proposals).returning(proposals.c.id),
            dict(
                run_id=run_id,
                after_stage=0,
                engineer="self",
                prompt="p",
                raw_answer="{}",
                adjustments=[],
                rationale="",
                diff={},
                created_at=created,
            ),
        ).scalar_one()
        c.execute(
            insert(decisions),
            dict(
                proposal_id=proposal_id,
                action="auto",
                user="auto",
                config=CONFIG,
                note="",
                created_at=created,
            ),
        )
    upgrade(engine)
    upgrade(engine)  # at head already: nothing to do
    assert current_revision(engine) == HEAD
    assert "description" in {c["name"] for c in inspect(engine).get_columns("runs")}
    assert "subset" in {c["name"] for c in inspect(engine).get_columns("episodes")}
    assert _schema_diff(engine) == []
    with session(engine) as s:
        run = s.exec(select(Run)).one()
        assert (run.name, run.description, run.settings, run.created_at) == (
            "old",
            "",
            RunSettings(stages=1, auto_apply=True),
            created,
        )
        assert s.exec(select(Stage)).one().config == ENV
        decision = s.exec(select(Decision)).one()
        assert (decision.proposal_id, decision.action, decision.config) == (proposal_id, "auto", ENV)
        _run(s, description="a new run")  # the new column takes writes
    engine.dispose()


def test_a_0004_database_with_runs_upgrades_to_experiments(db_url: str):
    engine = make_engine(db_url)
    upgrade(engine, "0004")
    runs = _as_first_written(Run, "experiment_id", "arm")
    with engine.begin() as c:
        c.execute(insert(runs), dict(name="before", description="", policy="tiny", engineer="fixed",
                                     engineer_backend="", settings={"stages": 2}, seed=1, status="done",
                                     status_reason="", uuid="u-before", created_at=datetime.now(UTC)))
    upgrade(engine)
    assert current_revision(engine) == HEAD and _schema_diff(engine) == []
    assert "ix_runs_experiment_id" in {i["name"] for i in inspect(engine).get_indexes("runs")}
    with session(engine) as s:
        old = s.exec(select(Run)).one()
        assert (old.name, old.uuid, old.experiment_id, old.arm) == ("before", "u-before", None, None)
        experiment = Experiment(name="e", policy="tiny", arms=[{"name": "fixed"}], seeds=1, settings=EXPERIMENT)
        s.add(experiment)
        s.commit()
        new = _run(s, experiment_id=experiment.id, arm="fixed")
        assert s.exec(select(Run).where(Run.experiment_id == experiment.id)).one().id == new.id
        s.add(Run(name="x", policy="tiny", engineer="fixed", engineer_backend="", seed=0, experiment_id=999,
                  settings=RunSettings(stages=1)))
        with pytest.raises(IntegrityError):  # the foreign key
            s.commit()
        s.rollback()
        s.add(Experiment(name="e", policy="tiny", seeds=1, settings=EXPERIMENT))
        with pytest.raises(IntegrityError):  # one experiment per name
            s.commit()
    engine.dispose()


def test_a_0005_database_with_decisions_upgrades_to_probes(db_url: str):
    engine = make_engine(db_url)
    upgrade(engine, "0005")
    with session(engine) as s:
        run_id = _run(s).id
    with engine.begin() as c:  # a proposal and its decision as 0005 wrote them: no compute, no probes column
        proposal_id = c.execute(insert(_as_first_written(Proposal, "compute", "id")).returning(column("id")),
                                dict(run_id=run_id, after_stage=0, engineer="self", prompt="p", raw_answer="a",
                                     projected_config=CONFIG, adjustments=[], rationale="", diff={},
                                     created_at=datetime.now(UTC))).scalar_one()
        c.execute(insert(_as_first_written(Decision, "probes", "id")),
                  dict(proposal_id=proposal_id, action="auto", user="auto", config=CONFIG, note="",
                       created_at=datetime.now(UTC)))
    upgrade(engine)
    assert current_revision(engine) == HEAD and _schema_diff(engine) == []
    with session(engine) as s:
        assert s.exec(select(Decision)).one().probes is None
        assert s.exec(select(Proposal)).one().compute is None
        s.add(Probe(key="k", config=CONFIG, checkpoint="tiny", seed=0, boards=2, answers=2, temperature=1.0,
                    sizes={"3": {"valid": 1}}, completions=4, seconds=0.5))
        s.add(Job(kind="probe", payload={}))  # the new job kind passes the CHECK
        s.commit()
        assert s.exec(select(Probe)).one().sizes == {"3": {"valid": 1}}
        s.add(Probe(key="k", config=CONFIG, checkpoint="tiny", seed=0, boards=2, answers=2, temperature=1.0,
                    sizes={}, completions=4, seconds=0.5))
        with pytest.raises(IntegrityError):  # one row per cache key
            s.commit()
        s.rollback()
        s.add(Job(kind="probes", payload={}))
        with pytest.raises(IntegrityError):  # still a closed vocabulary
            s.commit()
    engine.dispose()


def _upgrade_in_child(barrier, url: str) -> str:
    engine = make_engine(url)
    barrier.wait()
    upgrade(engine)
    return current_revision(engine)


def test_two_processes_starting_together_both_upgrade_a_fresh_database(db_url: str):
    engine = make_engine(db_url)
    assert in_processes(_upgrade_in_child, [(db_url,), (db_url,)], engine) == [HEAD, HEAD]
    assert _schema_diff(engine) == []
    engine.dispose()


def test_an_experiment_stored_before_its_runs_settings_were_kept_whole_reads_them_after_0011(db_url: str):
    engine = make_engine(db_url)
    upgrade(engine, "0010")
    experiments = table("experiments", column("name"), column("description"), column("policy"), column("arms", JSON),
                        column("seeds"), column("settings", JSON), column("created_at", UTCDateTime))
    figures = {"stages": 3, "instances": 64, "grpo": {"beta": 0.01}, "steps_per_stage": 16, "validation_per_size": 120,
               "validation_boards": 960, "validation_subset": None, "dev_per_size": 30, "lora": 0, "base_url": None,
               "config": CONFIG, "auto_apply": True, "scenario": "default"}
    with engine.begin() as c:
        c.execute(insert(experiments), dict(name="old", description="", policy="tiny", arms=[{"name": "fixed"}],
                                            seeds=2, settings=figures, created_at=datetime.now(UTC)))
    upgrade(engine)
    with session(engine) as s:
        old = s.exec(select(Experiment)).one().settings
    assert old.run == RunSettings(stages=3, grpo={"beta": 0.01}, lora=0, validation_per_size=120, dev_per_size=30,
                                  auto_apply=True, validation_agents=(2,))  # scored on 2 agents (0015)
    assert (old.config, old.steps_per_stage, old.validation_boards, old.scenario) == (ENV, 16, 960, "default")
    assert old.compute() == {"stages": 3, "instances": ENV.num_instances, "grpo": {"beta": 0.01}, "steps_per_stage": 16,
                             "validation_per_size": 120, "validation_agents": [2], "validation_boards": 960,
                             "validation_subset": None, "config": CONFIG, "lora": 0}
    engine.dispose()


def test_a_0011_database_with_num_agents_configs_stores_them_as_agent_ratio_after_0012(db_url: str):
    engine = make_engine(db_url)
    upgrade(engine, "0011")  # rows are made with the models, their configs then set the old way
    # the models' columns that later revisions add (0014, 0017): there while the rows go in, then gone
    later = [("proposals", "replay", "JSON"), ("stages", "replay", "JSON"), ("jobs", "processes", "INTEGER"),
             ("jobs", "vllm_server", "BOOLEAN NOT NULL DEFAULT false")]
    with engine.begin() as c:
        for name, added, kind in later:
            c.execute(text(f"ALTER TABLE {name} ADD COLUMN {added} {kind}"))
    knobs = {k: CONFIG[k] for k in ("data_ratio", "hole_ratio", "wait_ratio")}
    old = {**knobs, "num_agents": 3, "num_instances": 512}  # as the lab stored a config before agent_ratio
    new = {**knobs, "agent_ratio": {"3": 1.0}, "num_instances": 512}
    answer = {"hole_ratio": {"3": 0.2}, "num_agents": "three"}  # an answer as given, not a whole number: kept
    with session(engine) as s:
        run = _run(s)
        proposal = _proposal(s, run)
        s.add_all([Stage(run_id=run.id, index=0, config=ENV), Decision(proposal_id=proposal.id, action="edit",
                                                                        user="a", config=ENV),
                   Probe(key="k", config=CONFIG, checkpoint="tiny", seed=0, boards=2, answers=2, temperature=1.0,
                         completions=4, seconds=0.5),
                   Experiment(name="e", policy="tiny", seeds=1, settings=EXPERIMENT),
                   Job(kind="probe", payload={"configs": {"mine": old, "bad": [1]}, "seed": 0})])
        s.commit()
    columns = [("stages", "config"), ("proposals", "projected_config"), ("decisions", "config"), ("probes", "config")]
    with engine.begin() as c:
        for name, at in columns:
            c.execute(update(table(name, column(at, JSON))).values({at: old}))
        c.execute(update(table("proposals", column("parsed_config", JSON))).values(parsed_config=answer))
        c.execute(update(table("experiments", column("settings", JSON))).values(
            settings={**EXPERIMENT.model_dump(mode="json"), "config": old}))
        for name, added, _ in later:
            c.execute(text(f"ALTER TABLE {name} DROP COLUMN {added}"))
    upgrade(engine)
    with engine.connect() as c:
        def stored(name: str, at: str) -> object:
            return c.execute(select(table(name, column(at, JSON)).c[at])).scalar_one()

        assert [stored(name, at) for name, at in columns] == [new] * 4
        assert stored("proposals", "parsed_config") == answer
        assert stored("experiments", "settings")["config"] == new
        assert stored("jobs", "payload") == {"configs": {"mine": new, "bad": [1]}, "seed": 0}
    with session(engine) as s:
        assert s.exec(select(Stage)).one().config == EnvConfig(**{**CONFIG, "agent_ratio": {3: 1.0}})
        assert s.exec(select(Experiment)).one().settings.config.agent_ratio == {3: 1.0}
    engine.dispose()


def _old_episode(run_id: int, split: str, size: int, agents: int, failure: str | None, optimal: bool = False) -> dict:
    return dict(run_id=run_id, stage_index=0, split=split, instance_id=f"{split}-{size}-{agents}-{failure}",
                instance={}, size=size, num_agents=agents, completion="", outcome={}, valid=failure is None,
                optimal=optimal, failure=failure)


def test_a_0012_database_keeps_its_metrics_per_agent_count_after_0013_and_sums_them_back_on_downgrade(db_url: str):
    engine = make_engine(db_url)
    upgrade(engine, "0012")
    old = table("stage_metrics", *(column(c) for c in ("run_id", "stage_index", "split", "size", "episodes", "valid",
                                                       "optimal")), column("failures", JSON))
    with session(engine) as s:
        run_id = _run(s).id
    with engine.begin() as c:  # rows as 0012 stored them: one per size, whatever the boards' agent counts
        json = ("instance", "outcome")
        c.execute(insert(table("episodes", *(column(k) for k in _old_episode(0, "", 0, 0, None) if k not in json),
                               *(column(k, JSON) for k in json))), [
            _old_episode(run_id, "validation", 3, 2, None, optimal=True),
            _old_episode(run_id, "validation", 3, 2, "hole"),
            *(_old_episode(run_id, "benchmark", 4, 3, f) for f in (None, "hole", "vertex_conflict")),
            *(_old_episode(run_id, "benchmark", 4, 4, f, optimal=True) for f in (None, None)),
            _old_episode(run_id, "benchmark", 4, 4, "hole")])
        c.execute(insert(old), [
            dict(run_id=run_id, stage_index=0, split="validation", size=3, episodes=2, valid=1, optimal=1,
                 failures={"hole": 1}),
            dict(run_id=run_id, stage_index=0, split="benchmark", size=4, episodes=6, valid=3, optimal=2,
                 failures={"hole": 2, "vertex_conflict": 1}),
            dict(run_id=run_id, stage_index=0, split="dev", size=5, episodes=10, valid=4, optimal=3,
                 failures={"hole": 6})])  # no episodes of its own to read: 2 agents, as every dev board so far
    upgrade(engine)
    assert current_revision(engine) == HEAD and _schema_diff(engine) == []

    def stored() -> list[tuple]:
        with session(engine) as s:
            return [(m.split, m.size, m.agents, m.episodes, m.valid, m.optimal, m.failures) for m in s.exec(
                select(StageMetric).order_by(StageMetric.split, StageMetric.size, StageMetric.agents))]

    assert stored() == [("benchmark", 4, 3, 3, 1, 0, {"hole": 1, "vertex_conflict": 1}),
                        ("benchmark", 4, 4, 3, 2, 2, {"hole": 1}),
                        ("dev", 5, 2, 10, 4, 3, {"hole": 6}),
                        ("validation", 3, 2, 2, 1, 1, {"hole": 1})]
    with session(engine) as s:
        s.add(StageMetric(run_id=run_id, stage_index=0, split="validation", size=3, agents=3, episodes=1, valid=1,
                          optimal=0))
        s.commit()  # another agent count of the same size: its own row
        s.add(StageMetric(run_id=run_id, stage_index=0, split="validation", size=3, agents=3, episodes=1, valid=1,
                          optimal=0))
        with pytest.raises(IntegrityError):  # one row per (run, stage, split, size, agents)
            s.commit()
    with engine.connect() as c:
        if c.dialect.name == "sqlite":  # as `storage.db.upgrade` does: SQLite copies a table to alter it
            c.exec_driver_sql("PRAGMA foreign_keys=OFF")
            c.commit()
        with c.begin():
            command.downgrade(alembic_config(c), "0012")
    with engine.connect() as c:
        assert sorted(c.execute(select(old)).all()) == [
            (run_id, 0, "benchmark", 4, 6, 3, 2, {"hole": 2, "vertex_conflict": 1}),
            (run_id, 0, "dev", 5, 10, 4, 3, {"hole": 6}),
            (run_id, 0, "validation", 3, 3, 2, 1, {"hole": 1})]
    engine.dispose()


def test_a_0014_database_names_its_tiny_runs_tiny_2agent_after_0015_and_scores_them_on_2_agents(db_url: str):
    """Every stored `tiny` meant the 2-agent policy: runs, experiments, stage checkpoints (the spec or the folder it
    was loaded from) and probes say `tiny-2agent` after 0015, a probe under a key the new `tiny` never computes;
    settings that named no validation agent counts name 2; everything else is as it was."""
    engine = make_engine(db_url)
    upgrade(engine, "0014")
    folder = "/srv/envlab/assets/tiny-policy"
    with session(engine) as s:
        tiny, other = _run(s), _run(s, policy="Qwen/Qwen3-4B", settings=RunSettings(stages=1, validation_agents=(3,)))
        s.add_all([Stage(run_id=tiny.id, index=0, config=ENV, checkpoint=folder),
                   Stage(run_id=tiny.id, index=1, config=ENV, checkpoint="runs/1/stage-1"),
                   Stage(run_id=other.id, index=0, config=ENV, checkpoint="Qwen/Qwen3-4B"),
                   Probe(key="k", config=CONFIG, checkpoint="tiny", seed=0, boards=2, answers=2, temperature=1.0,
                         completions=4, seconds=0.5),
                   Experiment(name="e", policy="tiny", seeds=1, settings=EXPERIMENT)])
        s.commit()
    runs, experiments = (table(name, column("settings", JSON)) for name in ("runs", "experiments"))
    with engine.begin() as c:  # settings as runs stored them before they named their validation agents
        settings = c.execute(select(runs.c.settings)).scalars().all()
        c.execute(update(runs).where(text("policy = 'tiny'")).values(
            settings={k: v for k, v in settings[0].items() if k != "validation_agents"}))
        c.execute(update(experiments).values(settings={**EXPERIMENT.model_dump(mode="json"), "run": {
            k: v for k, v in EXPERIMENT.run.model_dump(mode="json").items() if k != "validation_agents"}}))
    upgrade(engine)
    assert current_revision(engine) == HEAD and _schema_diff(engine) == []
    with engine.connect() as c:
        assert "validation_agents" in c.execute(select(runs.c.settings)).scalars().first()
    with session(engine) as s:
        assert [(r.policy, r.settings.validation_agents) for r in s.exec(select(Run).order_by(Run.id))] == [
            ("tiny-2agent", (2,)), ("Qwen/Qwen3-4B", (3,))]
        assert [st.checkpoint for st in s.exec(select(Stage).order_by(Stage.id))] == [
            "/srv/envlab/assets/tiny-2agent-policy", "runs/1/stage-1", "Qwen/Qwen3-4B"]
        probe = s.exec(select(Probe)).one()
        assert probe.checkpoint == "tiny-2agent" and probe.key not in ("k", "tiny") and len(probe.key) == 32
        assert probe.config == CONFIG
        experiment = s.exec(select(Experiment)).one()
        assert (experiment.policy, experiment.settings.run.validation_agents) == ("tiny-2agent", (2,))
    with engine.connect() as c:
        if c.dialect.name == "sqlite":
            c.exec_driver_sql("PRAGMA foreign_keys=OFF")
            c.commit()
        with c.begin():
            command.downgrade(alembic_config(c), "0014")
    with session(engine) as s:
        assert [r.policy for r in s.exec(select(Run).order_by(Run.id))] == ["tiny", "Qwen/Qwen3-4B"]
        assert s.exec(select(Stage).order_by(Stage.id)).first().checkpoint == folder
        assert s.exec(select(Experiment)).one().policy == "tiny"
    engine.dispose()


def test_a_0015_database_that_holds_the_example_takes_the_shipped_study_after_0016(db_url: str):
    """A lab made before 0016 kept no choice about the shipped example and studies: one that holds the example run
    took them (its next start imports what it misses), one with other runs only declined them, an empty one gets
    no row (its next start decides)."""
    engine = make_engine(db_url)

    def at_0016() -> list[tuple[str, int, int, str]]:
        upgrade(engine)
        assert current_revision(engine) == HEAD and _schema_diff(engine) == []
        with session(engine) as s:
            rows = [(str(r.choice), r.done, r.total, r.studies) for r in s.exec(select(Shipped))]
        with engine.connect() as c:
            if c.dialect.name == "sqlite":
                c.exec_driver_sql("PRAGMA foreign_keys=OFF")
                c.commit()
            with c.begin():
                command.downgrade(alembic_config(c), "0015")
        return rows

    upgrade(engine, "0015")
    assert at_0016() == []
    with session(engine) as s:
        _run(s)
    assert at_0016() == [("decline", 0, 0, "")]
    with session(engine) as s:
        _run(s, settings=RunSettings(stages=3, example=True))
    assert at_0016() == [("take", 0, 0, "")]
    engine.dispose()


def test_a_typed_column_refuses_what_its_model_refuses_and_reads_a_bad_old_row_as_unreadable(engine: Engine):
    with session(engine) as s:
        with pytest.raises(ValidationError, match="a run trains at least 1 stage"):
            Run(name="r", policy="tiny", engineer="fixed", engineer_backend="", seed=0, settings={"stages": 0})
        run_id = _run(s).id
    with engine.begin() as c:
        c.execute(text("UPDATE runs SET settings = '[1, 2]' WHERE id = :i"), {"i": run_id})
    with session(engine) as s:
        bad = s.get(Run, run_id)
        assert (bad.name, isinstance(bad.settings, Unreadable)) == ("r", True)
        with pytest.raises(ValueError, match=r"this stored RunSettings is not valid \(Input should be a valid "
                                             r"dictionary or instance of RunSettings\): its stages cannot be read"):
            print(bad.settings.stages)


# --- columns ------------------------------------------------------------------------------------


def test_json_columns_round_trip(engine: Engine):
    settings = RunSettings(stages=1, auto_apply=False, lr=1e-6, sizes=[3, 4, 10], note="ümlaut ✓")
    instance = {"size": 3, "holes": [[0, 1]], "starts": [[0, 0], [2, 2]], "goals": [[2, 0], [0, 2]]}
    plan = [["RIGHT", "DOWN"], ["WAIT", "UP"]]
    with session(engine) as s:
        run = _run(s, settings=settings)
        s.add(
            Proposal(
                run_id=run.id,
                after_stage=1,
                engineer="self",
                prompt="p",
                raw_answer="garbage",
                error="no JSON object in the answer",
            )
        )
        s.add(
            Episode(
                run_id=run.id,
                stage_index=1,
                split="validation",
                instance_id="v-3-0",
                instance=instance,
                size=3,
                num_agents=2,
                completion="Agent 0: R D",
                plan=plan,
                outcome={"valid": False, "failure": "collision", "events": [{"time": 2}]},
                valid=False,
                optimal=False,
                failure="collision",
            )
        )
        s.add(TrainingLog(run_id=run.id, stage_index=1, step=10, metrics={"reward": 0.25, "kl": 0.001}))
        s.add(Job(kind="benchmark", payload={"run_id": run.id, "splits": ["validation"]}))
        s.commit()
    with session(engine) as s:
        assert s.exec(select(Run)).one().settings == settings
        proposal = s.exec(select(Proposal)).one()
        assert (proposal.parsed_config, proposal.projected_config, proposal.adjustments, proposal.diff) == (
            None,
            None,
            [],
            {},
        )
        episode = s.exec(select(Episode)).one()
        assert (episode.instance, episode.plan, episode.outcome["events"]) == (instance, plan, [{"time": 2}])
        assert s.exec(select(TrainingLog)).one().metrics == {"reward": 0.25, "kl": 0.001}
        assert s.exec(select(Job)).one().payload == {"run_id": run.id, "splits": ["validation"]}


def test_timestamps_are_timezone_aware_utc(engine: Engine):
    paris = timezone(timedelta(hours=2))
    started = datetime(2026, 6, 1, 14, 0, 0, 123456, tzinfo=paris)
    with session(engine) as s:
        run = _run(s)
        s.add(Stage(run_id=run.id, index=0, config=CONFIG, started_at=started))
        s.commit()
    with session(engine) as s:
        created = s.exec(select(Run.created_at)).one()
        assert created.tzinfo == UTC and abs(datetime.now(UTC) - created) < timedelta(minutes=1)
        stage = s.exec(select(Stage)).one()
        assert stage.started_at == started and stage.started_at.tzinfo == UTC
        assert stage.started_at.hour == 12
        later = s.exec(
            select(func.count())
            .select_from(Stage)
            .where(Stage.started_at > datetime(2026, 6, 1, 11, 59, tzinfo=UTC))
        ).one()
        assert later == 1
        s.add(Stage(run_id=run.id, index=1, config=CONFIG, started_at=datetime(2026, 6, 1)))
        with pytest.raises(StatementError, match="naive datetime"):
            s.commit()


def test_stage_metrics_answer_valid_rate_per_size_and_size_by_failure(engine: Engine):
    with session(engine) as s:
        run = _run(s)
        for size, episodes, valid, failures in [
            (3, 20, 18, {"collision": 2}),
            (4, 20, 10, {"collision": 4, "hole": 6}),
        ]:
            s.add(
                StageMetric(
                    run_id=run.id,
                    stage_index=1,
                    split="validation",
                    size=size,
                    agents=2,
                    episodes=episodes,
                    valid=valid,
                    optimal=valid - 1,
                    failures=failures,
                )
            )
        s.commit()
        rate = cast(StageMetric.valid, Float) / StageMetric.episodes
        rows = s.exec(
            select(StageMetric.size, rate)
            .where(StageMetric.run_id == run.id, StageMetric.stage_index == 1)
            .order_by(StageMetric.size)
        ).all()
        assert [(size, round(r, 3)) for size, r in rows] == [(3, 0.9), (4, 0.5)]
        metrics = s.exec(select(StageMetric).where(StageMetric.stage_index == 1)).all()
        table = {(m.size, kind): n for m in metrics for kind, n in m.failures.items()}
        assert table == {(3, "collision"): 2, (4, "collision"): 4, (4, "hole"): 6}
        s.add(
            StageMetric(
                run_id=run.id, stage_index=1, split="validation", size=3, agents=2, episodes=1, valid=1, optimal=1
            )
        )
        with pytest.raises(IntegrityError):
            s.commit()


# --- decisions ----------------------------------------------------------------------------------


def test_a_proposal_takes_one_decision_and_the_second_names_the_first(engine: Engine):
    with session(engine) as s:
        proposal = _proposal(s, _run(s))
        edited = {**CONFIG, "agent_ratio": {"3": 1.0}}
        first = record_decision(s, proposal.id, "edit", "alice", edited, "more agents")
        with pytest.raises(
            AlreadyDecided, match=f"proposal {proposal.id} was already decided: edit by 'alice'"
        ) as e:
            record_decision(s, proposal.id, "reject", "bob", None, "")
        assert e.value.decision.id == first.id and e.value.decision.config == EnvConfig(**edited)
        assert s.exec(select(func.count()).select_from(Decision)).one() == 1


def test_the_database_itself_refuses_a_second_decision_row(engine: Engine):
    with session(engine) as s:
        proposal = _proposal(s, _run(s))
        record_decision(s, proposal.id, "accept", "alice", CONFIG)
        s.add(Decision(proposal_id=proposal.id, action="reject", user="bob"))
        with pytest.raises(IntegrityError):
            s.commit()
        s.rollback()
        s.add(Decision(proposal_id=_proposal(s, s.get(Run, proposal.run_id)).id, action="maybe", user="bob"))
        with pytest.raises(IntegrityError):  # the action CHECK constraint
            s.commit()


@pytest.mark.parametrize(
    ("action", "config", "error"),
    [
        ("approve", CONFIG, "action must be one of accept, edit, reject, auto"),
        ("reject", CONFIG, "a decision to reject takes no config"),
        ("accept", None, "a decision to accept takes the config it applies"),
    ],
)
def test_a_decision_must_fit_its_action(engine: Engine, action: str, config, error: str):
    with session(engine) as s:
        proposal = _proposal(s, _run(s))
        with pytest.raises(ValueError, match=error):
            record_decision(s, proposal.id, action, "alice", config)


def test_deciding_a_missing_proposal_says_so(engine: Engine):
    with session(engine) as s, pytest.raises(LookupError, match="no proposal 999"):
        record_decision(s, 999, "accept", "alice", CONFIG)


def test_two_threads_deciding_at_once_store_exactly_one_decision(engine: Engine):
    with session(engine) as s:
        run = _run(s)
        proposal_ids = [_proposal(s, run).id for _ in range(4)]
    for proposal_id in proposal_ids:
        barrier, outcomes = threading.Barrier(2), {}

        def decide(
            user: str, action: str, config, proposal_id=proposal_id, barrier=barrier, outcomes=outcomes
        ):
            with session(engine) as s:
                barrier.wait()
                try:
                    outcomes[user] = record_decision(s, proposal_id, action, user, config).user
                except AlreadyDecided as e:
                    outcomes[user] = f"lost to {e.decision.user}"

        threads = [
            threading.Thread(target=decide, args=a)
            for a in [("alice", "accept", CONFIG), ("bob", "reject", None)]
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winner = outcomes["alice"] if outcomes["alice"] == "alice" else outcomes["bob"]
        loser = "bob" if winner == "alice" else "alice"
        assert outcomes == {winner: winner, loser: f"lost to {winner}"}
        with session(engine) as s:
            stored = s.exec(select(Decision).where(Decision.proposal_id == proposal_id)).all()
            assert [d.user for d in stored] == [winner]


def _decide_in_child(barrier, url: str, proposal_ids: list[int], user: str, action: str) -> dict[int, str]:
    engine = make_engine(url)
    with session(engine) as s:
        s.exec(text("SELECT 1"))  # connected before the start line
        barrier.wait()
        outcome = {}
        for proposal_id in proposal_ids:
            config = None if action == "reject" else CONFIG
            try:
                outcome[proposal_id] = record_decision(s, proposal_id, action, user, config).user
            except AlreadyDecided as e:
                outcome[proposal_id] = e.decision.user
    return outcome


def test_two_processes_deciding_at_once_store_exactly_one_decision_each(db_url: str, engine: Engine):
    with session(engine) as s:
        run = _run(s)
        proposal_ids = [_proposal(s, run).id for _ in range(20)]
    outcomes = in_processes(
        _decide_in_child,
        [(db_url, proposal_ids, "alice", "accept"), (db_url, proposal_ids, "bob", "reject")],
        engine,
    )
    with session(engine) as s:
        stored = {d.proposal_id: d.user for d in s.exec(select(Decision))}
    # Each process saw the same winner for every proposal: its own decision or the one it lost to.
    assert outcomes[0] == outcomes[1] == stored and set(stored) == set(proposal_ids)
