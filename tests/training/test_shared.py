"""Stage 0 evaluated once: runs that start from one checkpoint on the same boards copy the first one's answers.

The real tiny policy answers the real boards on SQLite and PostgreSQL; `Policy.generate` is wrapped only to count
its calls. A run evaluated alone, in a database of its own, is the reference every shared stage 0 must equal.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlmodel import select

from envsim import suite
from envsim.config import EnvConfig
from envsim.suite import VALIDATION_PER_SIZE, Split
from lab.jobs.worker import WorkerOptions, run_job, run_worker
from lab.loop import advance, create_run, evidence_for, run_propose_job
from lab.pages.train import train_view
from lab.study.experiments import create_experiment, experiment_runs
from storage import queue
from storage.db import make_engine, runs_root, session, upgrade
from storage.models import Episode, Evaluation, Job, Proposal, Run, Stage, StageMetric
from storage.settings import RunSettings
from training import evaluate as evaluation
from training.policy import TINY_DIR, Policy
from training.shared import ANSWER_SETTINGS, answer_key, evaluate_once
from training.stage import run_stage_job, validation_boards

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_stage0.py"
CONFIG = EnvConfig.default(sizes=(3, 4), num_instances=8)
# at 2 agents, the fewest dev boards (3 per size, sizes 3..10: 24), so the tests answer few boards
SETTINGS = dict(stages=1, validation_boards=8, dev_per_size=3, validation_agents=(2,))
# RunSettings fields that cannot change the answers of a stage-0 evaluation (the boards are in the key as
# themselves, so the board counts are too): a new field must be placed here or in training.shared.ANSWER_SETTINGS.
NOT_ANSWERS = {"stages", "auto_apply", "grpo", "lora", "lora_alpha", "lora_dropout", "lora_target_modules", "context",
               "context_preset", "base_url", "validation_boards", "validation_per_size", "dev_per_size", "dev_per_seed",
               "probe_boards", "probe_answers", "remeasure", "keep_checkpoints", "allow_cpu", "agent_counts",
               "validation_agents", "engineer_history", "example", "held_configs", "processes"}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture
def generated(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The prompts of every `Policy.generate` call, in order (the real generation runs)."""
    calls: list[int] = []
    real = Policy.generate

    def counted(self, prompts, *args, **kwargs):
        calls.append(len(prompts))
        return real(self, prompts, *args, **kwargs)

    monkeypatch.setattr(Policy, "generate", counted)
    return calls


def _runs(engine: Engine, seeds: list[int], **settings) -> list[int]:
    with session(engine) as s:
        return [create_run(s, name=f"seed {k}", config=CONFIG, settings=RunSettings(**{**SETTINGS, **settings}),
                           engineer="fixed", seed=k).id for k in seeds]


def _answers(engine: Engine, run_id: int) -> tuple[list[tuple], list[tuple]]:
    """A run's stage-0 episodes and metrics as a page reads them (everything but the ids)."""
    with session(engine) as s:
        rows = s.exec(select(Episode).where(Episode.run_id == run_id, Episode.stage_index == 0).order_by(Episode.id))
        episodes = [(e.split, e.instance_id, e.instance, e.size, e.completion, e.plan, e.outcome, e.valid, e.optimal,
                     e.failure) for e in rows]
        metrics = [(m.split, m.size, m.episodes, m.valid, m.optimal, m.failures) for m in s.exec(
            select(StageMetric).where(StageMetric.run_id == run_id, StageMetric.stage_index == 0)
            .order_by(StageMetric.split, StageMetric.size))]
    return episodes, metrics


def _alone(tmp_path: Path, generated: list[int], **settings) -> tuple[tuple[list, list], int]:
    """Stage 0 of one run in a database of its own: its answers and the prompts it generated."""
    engine = make_engine(f"sqlite:///{tmp_path / 'alone.db'}")
    upgrade(engine)
    before = len(generated)
    [run_id] = _runs(engine, [5], **settings)
    assert run_worker(engine, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 1
    answers = _answers(engine, run_id)
    engine.dispose()
    return answers, sum(generated[before:])


def _jobs(engine: Engine) -> list[Job]:
    with session(engine) as s:
        return list(s.exec(select(Job).order_by(Job.id)))


def test_runs_from_one_checkpoint_evaluate_stage_0_once_and_store_what_a_run_alone_stores(
        engine: Engine, generated: list[int], tmp_path: Path):
    alone, alone_prompts = _alone(tmp_path, generated)
    assert alone_prompts == 8 + 24  # the validation boards, then the dev boards (3 per size, sizes 3..10)
    del generated[:]
    runs = _runs(engine, [0, 1, 2])  # greedy decoding: the seed changes no answer
    assert run_worker(engine, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 3
    assert sum(generated) == alone_prompts  # the first run generated; the other two generated nothing
    for run_id in runs:
        assert _answers(engine, run_id) == alone
    jobs = _jobs(engine)
    assert [j.status for j in jobs] == ["done"] * 3
    assert "reused_from" not in jobs[0].result
    for job in jobs[1:]:
        assert job.result["reused_from"] == {"validation": runs[0], "dev": runs[0]}
        assert job.result["episodes"] == 8 and job.result["valid_rate"] == jobs[0].result["valid_rate"]
        assert f"stage 0 validation: reused run {runs[0]}'s stage 0 evaluation (the same policy, 8 validation " \
               "boards and decoding): 8 episodes copied, nothing generated" in job.log_tail
        assert "evaluating on" not in job.log_tail and "loading" not in job.log_tail  # the policy was never loaded
    assert "evaluating on 8 validation boards" in jobs[0].log_tail
    with session(engine) as s:
        rows = s.exec(select(Evaluation).order_by(Evaluation.id)).all()
        stages = s.exec(select(Stage).order_by(Stage.run_id)).all()
    assert [(r.run_id, r.split, r.source_run_id, r.source_stage_index) for r in rows] == [
        (runs[0], Split.VALIDATION, None, None), (runs[0], Split.DEV, None, None),
        (runs[1], Split.VALIDATION, runs[0], 0), (runs[1], Split.DEV, runs[0], 0),
        (runs[2], Split.VALIDATION, runs[0], 0), (runs[2], Split.DEV, runs[0], 0)]
    assert [(st.status, st.checkpoint) for st in stages] == [("done", str(TINY_DIR))] * 3
    status = train_view(engine, runs[1])["status"]
    assert f"Stage 0's validation and dev episodes were reused from run #{runs[0]}'s stage 0" in status
    assert "reused" not in train_view(engine, runs[0])["status"]


def test_what_changes_the_answers_is_another_evaluation(tmp_path: Path):
    boards = validation_boards(8)
    folder = tmp_path / "policy"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")

    def key(settings=None, seed=0, **what) -> str:
        given = dict(policy="p", folder=str(folder), split=Split.VALIDATION, boards=boards, engine="transformers",
                     device="cpu")
        return answer_key(**{**given, **what}, settings=RunSettings(**{"stages": 1, **settings}) if settings else None,
                          seed=seed)

    same = key()
    assert key(seed=1) == same and key(device="cpu") == key(device="cpu:0")  # greedy draws no random number
    assert key({"validation_decoding": "sampled"}, seed=1) != key({"validation_decoding": "sampled"}, seed=2)
    assert key({"validation_decoding": "sampled"}, seed=1) == key({"validation_decoding": "sampled"}, seed=1)
    assert key({"stages": 9, "context_preset": "x", "grpo": {"beta": 1}}) == same  # what does not answer
    others = [key({"thinking": "on"}), key({"completion_length": 64}), key({"validation_decoding": "sampled"}),
              key(boards=boards[:7]), key(split=Split.DEV), key(policy="q"), key(engine="vllm"), key(device="cuda:0")]
    assert len({same, *others}) == len(others) + 1
    os.utime(folder / "model.safetensors", ns=(1, 1))  # the checkpoint saved again into the same folder
    assert key() != same
    assert set(RunSettings.model_fields) == NOT_ANSWERS | set(ANSWER_SETTINGS)


def test_runs_that_answer_differently_each_generate(engine: Engine, generated: list[int]):
    """Another completion length, and sampled decoding under different seeds: no run copies another."""
    runs = _runs(engine, [0], completion_length=40) + _runs(engine, [0, 1], validation_decoding="sampled")
    assert run_worker(engine, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 3
    assert sum(generated) == 3 * (8 + 24)
    assert all("reused_from" not in j.result for j in _jobs(engine))
    assert _answers(engine, runs[1]) != _answers(engine, runs[2])  # two seeds sample two sets of answers
    with session(engine) as s:
        assert s.exec(select(Evaluation).where(Evaluation.source_run_id.is_not(None))).all() == []


def test_two_workers_at_once_generate_stage_0_once(engine: Engine, generated: list[int], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch):
    """The first worker's generation holds until the second says it waits for it: the second copies, after."""
    alone, alone_prompts = _alone(tmp_path, generated)
    del generated[:]
    runs = _runs(engine, [0, 1])
    real = evaluation.evaluate

    def held(*args, **kwargs):
        deadline = time.monotonic() + 120
        while not any("waiting for run" in j.log_tail for j in _jobs(engine)):
            assert time.monotonic() < deadline, "the second worker never waited"
            time.sleep(0.05)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", held)
    with session(engine) as s:
        claimed = [queue.claim(s, "worker a"), queue.claim(s, "worker b")]
    ended: dict[int, Job] = {}
    threads = [threading.Thread(target=lambda j=j: ended.__setitem__(j.run_id, run_job(engine, j, run_stage_job)))
               for j in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [ended[r].status for r in runs] == ["done", "done"], [ended[r].error for r in runs]
    assert sum(generated) == alone_prompts
    first, second = sorted(runs, key=lambda r: "reused_from" in ended[r].result)
    assert ended[second].result["reused_from"] == {"validation": first, "dev": first}
    assert f"waiting for run {first}'s stage 0, which is evaluating the same policy on the same validation boards" \
        in ended[second].log_tail
    for run_id in runs:
        assert _answers(engine, run_id) == alone


def test_a_claim_whose_stage_died_is_taken_over_and_the_dead_run_copies_on_retry(
        engine: Engine, generated: list[int], monkeypatch: pytest.MonkeyPatch):
    runs = _runs(engine, [0, 1])
    real = evaluation.evaluate

    def broken(*args, **kwargs):
        raise RuntimeError("the worker's GPU fell off")

    monkeypatch.setattr(evaluation, "evaluate", broken)
    with session(engine) as s:
        job = queue.claim(s, "worker a")
    assert run_job(engine, job, run_stage_job).error == "RuntimeError: the worker's GPU fell off"
    monkeypatch.setattr(evaluation, "evaluate", real)
    with session(engine) as s:  # run 0's claim stays behind; its stage failed
        assert [(r.run_id, r.source_run_id) for r in s.exec(select(Evaluation))] == [(runs[0], None)]
        job = queue.claim(s, "worker b")
    assert job.run_id == runs[1]
    ended = run_job(engine, job, run_stage_job)
    assert ended.status == "done" and "reused_from" not in ended.result
    assert f"run {runs[0]}'s stage 0 had claimed the same validation evaluation and stopped: generating it here" \
        in ended.log_tail
    with session(engine) as s:
        queue.requeue(s, _jobs(engine)[0].id)
        job = queue.claim(s, "worker a")
    again = run_job(engine, job, run_stage_job)
    assert again.result["reused_from"] == {"validation": runs[1], "dev": runs[1]}
    assert sum(generated) == 8 + 24
    assert _answers(engine, runs[0]) == _answers(engine, runs[1])


def test_a_dead_stage_that_stored_part_of_its_evaluation_copies_it_whole_on_retry(
        engine: Engine, generated: list[int], monkeypatch: pytest.MonkeyPatch):
    """Run 0's stage 0 dies after storing its first batch of 3 validation episodes; run 1 takes its claim over and
    evaluates; run 0, retried, copies run 1's evaluation in place of its own 3 episodes: the two store the same."""
    monkeypatch.setattr(evaluation, "BATCH_SIZE", 3)
    runs = _runs(engine, [0, 1])
    real = evaluation.evaluate

    def dies_after_a_batch(*args, on_batch, **kwargs):
        def stored_then_dies(batch):
            on_batch(batch)
            raise RuntimeError("the worker's GPU fell off")
        return real(*args, on_batch=stored_then_dies, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", dies_after_a_batch)
    with session(engine) as s:
        job = queue.claim(s, "worker a")
    assert run_job(engine, job, run_stage_job).error == "RuntimeError: the worker's GPU fell off"
    monkeypatch.setattr(evaluation, "evaluate", real)
    assert len(_answers(engine, runs[0])[0]) == 3
    with session(engine) as s:
        job = queue.claim(s, "worker b")
    assert run_job(engine, job, run_stage_job).status == "done"
    with session(engine) as s:
        queue.requeue(s, _jobs(engine)[0].id)
        job = queue.claim(s, "worker a")
    again = run_job(engine, job, run_stage_job)
    assert again.result["reused_from"] == {"validation": runs[1], "dev": runs[1]}
    assert _answers(engine, runs[0]) == _answers(engine, runs[1])
    assert len(_answers(engine, runs[0])[0]) == 8 + 24


def test_bench_stage0_at_a_tiny_budget(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("bench_stage0", BENCH)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclass looks its module up by name
    spec.loader.exec_module(bench)
    bench.main(bench.Args(arms="fixed,heuristic", seeds=1, validation_boards=8, dev_per_size=3))
    out = capsys.readouterr().out
    assert "arms fixed,heuristic x 1 seeds, tiny policy, 8 validation + 63 dev boards" in out
    assert "s for 2 runs, 1 generated" in out and "s for 2 runs, 2 generated" in out
    assert "(stage-0 episodes identical)" in out


def test_an_earlier_attempts_claim_under_another_key_is_replaced(engine: Engine):
    """The policy's files changed between two attempts of a stage: its old claim goes, the new key is claimed."""
    [run_id] = _runs(engine, [0])
    with session(engine) as s:
        s.add(Evaluation(key="before", run_id=run_id, stage_index=0, split=Split.VALIDATION))
        s.commit()
    said: list[str | None] = []
    assert evaluate_once(engine, "after", run_id, 0, Split.VALIDATION, lambda: [],
                         lambda step, total, line=None, result=None: bool(said.append(line))) is None
    with session(engine) as s:
        assert [(r.key, r.run_id, r.source_run_id) for r in s.exec(select(Evaluation))] == [("after", run_id, None)]
    assert said == []


# The 6-seed study's passes (docs/results/study-6seed/README.md): the runs held back for a later pass are detached
# from their experiment, their queued jobs cancelled; the next pass attaches them again and queues their stage 0.
HOLD_BACK = ("""UPDATE jobs SET status = 'cancelled' WHERE status = 'queued'
                AND run_id IN (SELECT id FROM runs WHERE name LIKE 'defaults / %')""",
             "UPDATE runs SET experiment_id = NULL WHERE name LIKE 'defaults / %'")
ATTACH = ("""UPDATE runs SET experiment_id = (SELECT e.id FROM experiments e WHERE runs.name LIKE e.name || ' / %')
             WHERE experiment_id IS NULL AND status = 'active'""",
          """UPDATE jobs SET status = 'queued' WHERE status = 'cancelled' AND kind = 'stage' AND target = 0
             AND run_id IN (SELECT id FROM runs WHERE status = 'active' AND experiment_id IS NOT NULL)""")


def test_the_studys_second_experiment_after_a_snapshot_reads_its_dev_boards(engine: Engine, generated: list[int]):
    """The 6-seed study's own sequence: two experiments in one database; the first's runs evaluate stage 0 once
    (its first run generates, the other copies); the pass ends in a snapshot that keeps the stage-0 episodes of one
    run only (not the one the claim names) and a new worker starts on it: the second experiment's `evidence` run
    must read its stage-0 dev boards. The claim's own episodes are gone, so its stage 0 generates them again: copying
    would copy per-size metrics and no episode, and the engineer would propose on nothing ("no dev boards to read"
    at every size, the study's `defaults` seeds 1 to 5)."""
    settings = RunSettings(stages=1, validation_per_size=VALIDATION_PER_SIZE, validation_boards=8, dev_per_size=3,
                           validation_agents=(2,))
    hard = CONFIG.model_copy(update={"hole_ratio": {3: 0.4, 4: 0.4}})
    first = create_experiment(engine, name="hardstart", arms=["heuristic"], seeds=2, config=hard, settings=settings)
    second = create_experiment(engine, name="defaults", arms=["evidence"], seeds=1, config=CONFIG, settings=settings)
    with engine.begin() as c:
        for statement in HOLD_BACK:
            c.execute(text(statement))
    assert run_worker(engine, {"stage": run_stage_job}, WorkerOptions(worker_id="vm:1", poll_s=0.01, once=True)) == 2
    owner, copied = experiment_runs(engine, first.id)
    with engine.begin() as c:  # the snapshot, and the next pass
        c.execute(text("DELETE FROM episodes WHERE NOT (run_id = :kept AND stage_index = 0)"), {"kept": copied.id})
        for statement in ATTACH:
            c.execute(text(statement))
    assert sum(generated) == 8 + 24
    [run] = experiment_runs(engine, second.id)
    study_worker = WorkerOptions(worker_id="study-0", poll_s=0.01, once=True)
    assert run_worker(engine, {"stage": run_stage_job}, study_worker) == 1
    assert advance(engine, run.id).text == "queued a proposal after stage 0"
    assert run_worker(engine, {"propose": run_propose_job}, study_worker) == 1
    with session(engine) as s:
        job = s.exec(select(Job).where(Job.run_id == run.id, Job.kind == "stage")).one()
        dev = s.exec(select(Episode).where(Episode.run_id == run.id, Episode.split == Split.DEV)).all()
        proposal = s.exec(select(Proposal).where(Proposal.run_id == run.id)).one()
    assert job.status == "done" and "reused_from" not in job.result
    assert f"run {owner.id}'s stage 0 evaluated the same dev boards, but 0 of its 24 episodes are stored" \
        in job.log_tail
    assert len(dev) == 24 and sum(generated) == 2 * (8 + 24)  # generated again, once
    assert proposal.error is None and "no dev boards" not in proposal.rationale
    assert proposal.rationale.startswith("size 3: ") and "of 3 dev boards failed" in proposal.rationale


def test_runs_validated_at_other_agent_counts_share_stage_0_only_with_each_other(empty_lab: Engine,
                                                                                  generated: list[int]):
    """Two runs at agents (2, 3) and one at 2, same policy and seed: the (2,) run answers its own
    boards (the 2-agent sets, cached under their own names), the second (2, 3) run copies the first's."""
    paired = _runs(empty_lab, [0], validation_agents=(2, 3))
    alone = _runs(empty_lab, [0])
    paired += _runs(empty_lab, [0], validation_agents=(2, 3))
    assert run_worker(empty_lab, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 3
    # 8 validation boards spread over 16 (count, size) cells or 8 sizes; 3 dev boards per (count, size)
    assert generated == [8, 48, 8, 24]
    jobs = _jobs(empty_lab)
    assert ["reused_from" in j.result for j in jobs] == [False, False, True]
    assert jobs[2].result["reused_from"] == {"validation": paired[0], "dev": paired[0]}
    assert _answers(empty_lab, paired[1]) == _answers(empty_lab, paired[0]) != _answers(empty_lab, alone[0])
    with session(empty_lab) as s:
        def agents(run_id: int, split: Split) -> set[int]:
            return set(s.exec(select(StageMetric.agents).where(StageMetric.run_id == run_id,
                                                               StageMetric.split == split)))

        assert [(agents(r, Split.VALIDATION), agents(r, Split.DEV)) for r in (*paired, *alone)] == [
            ({2, 3}, {2, 3}), ({2, 3}, {2, 3}), ({2}, {2})]
        sources = s.exec(select(Evaluation.run_id, Evaluation.source_run_id).order_by(Evaluation.id)).all()
    assert sources == [(paired[0], None)] * 2 + [(alone[0], None)] * 2 + [(paired[1], paired[0])] * 2
    root = runs_root(empty_lab)
    assert sorted(p.name for p in root.glob("*.jsonl")) == [
        "dev-3-beside-validation-30-agents-2-3.jsonl", "dev-3-beside-validation-30.jsonl",
        "validation-30-agents-2-3.jsonl", "validation-30.jsonl"]


def test_dev_boards_drawn_per_seed_are_shared_within_a_seed_and_validation_across_seeds(empty_lab: Engine,
                                                                                       generated: list[int]):
    """Seed 0's `evidence` and `heuristic` runs, seed 1's `evidence` run (dev drawn per seed) and seed 1's run made
    with the settings of before (one dev set for every seed), all from one checkpoint: the validation boards are
    answered once for all four; seed 0's dev boards once for its two arms, seed 1's own once, the shared set once.
    The two `evidence` runs read different dev boards; seed 0's two arms read the same."""
    def run(engineer: str, seed: int, **settings) -> int:
        with session(empty_lab) as s:
            return create_run(s, name=f"{engineer} {seed}", config=CONFIG, engineer=engineer, seed=seed,
                              settings=RunSettings(**{**SETTINGS, "dev_per_seed": True, **settings})).id

    evidence0, heuristic0, evidence1, old1 = (run("evidence", 0), run("heuristic", 0), run("evidence", 1),
                                              run("evidence", 1, dev_per_seed=False))
    assert run_worker(empty_lab, {"stage": run_stage_job}, WorkerOptions(poll_s=0.01, once=True)) == 4
    assert generated == [8, 24, 24, 24]  # validation once; the dev boards of seed 0, of seed 1, and the shared ones
    with session(empty_lab) as s:
        sources = s.exec(select(Evaluation.run_id, Evaluation.split, Evaluation.source_run_id)
                         .order_by(Evaluation.id)).all()

        def ids(run_id: int, split: Split) -> list[str]:
            return list(s.exec(select(Episode.instance_id).where(Episode.run_id == run_id, Episode.split == split)
                               .order_by(Episode.id)))

        validation = [ids(r, Split.VALIDATION) for r in (evidence0, heuristic0, evidence1, old1)]
        dev = {r: ids(r, Split.DEV) for r in (evidence0, heuristic0, evidence1, old1)}
        read = {r: evidence_for(s, s.get(Run, r), 0).current.boards for r in (evidence0, heuristic0, evidence1)}
    assert sources == [(evidence0, Split.VALIDATION, None), (evidence0, Split.DEV, None),
                       (heuristic0, Split.VALIDATION, evidence0), (heuristic0, Split.DEV, evidence0),
                       (evidence1, Split.VALIDATION, evidence0), (evidence1, Split.DEV, None),
                       (old1, Split.VALIDATION, evidence0), (old1, Split.DEV, None)]
    assert validation[0] == validation[1] == validation[2] == validation[3]
    standard = [e.instance for e in suite.build(Split.VALIDATION, agents=(2,))[0]]
    two = dict(agents=(2,))
    assert dev[evidence0] == dev[heuristic0] == [e.instance.id for e in suite.dev_entries(3, standard, draw=0, **two)]
    assert dev[evidence1] == [e.instance.id for e in suite.dev_entries(3, standard, draw=1, **two)] != dev[evidence0]
    assert dev[old1] == [e.instance.id for e in suite.dev_entries(3, standard, **two)]  # every earlier run's boards
    assert len({*dev[evidence0], *dev[evidence1], *dev[old1]}) >= 3 * 24 - 2  # 3x3 boards may repeat
    assert len(read[evidence0]) == len(read[evidence1]) == 24
    assert read[evidence0] == read[heuristic0] != read[evidence1]  # what the engineer reads differs by seed
    assert [(b.size, b.needs_wait) for b in read[evidence0]] == [(b.size, b.needs_wait) for b in read[evidence1]]
    assert sorted(p.name for p in runs_root(empty_lab).glob("dev-*.jsonl")) == [
        "dev-3-beside-validation-30.jsonl", "dev-3-seed-0-beside-validation-30.jsonl",
        "dev-3-seed-1-beside-validation-30.jsonl"]
