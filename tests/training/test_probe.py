"""The probe: p_b(1 - p_b) counted by hand, the same numbers for the same seed, a second ask answered from the
table without sampling."""

from __future__ import annotations

import pytest
from sqlmodel import select

from envsim.config import EnvConfig
from envsim.generator import cannot_fill, stage_seed
from lab.engineers import LEARN_ANSWERS, LEARN_BOARDS, grid
from storage.db import make_engine, session, upgrade
from storage.models import Probe
from storage.settings import RunSettings
from training.policy import Policy, build_tiny, load_policy
from training.probe import (
    Band,
    ProbeResult,
    SizeProbe,
    measure,
    probe_config,
    probe_key,
    sampling_temperature,
    size_knobs,
)

T, F = True, False
SMALL = EnvConfig(data_ratio={3: 0.75, 4: 0.25}, hole_ratio={3: 0.2, 4: 0.3}, wait_ratio={3: 0.25, 4: 0.25},
                  num_agents=2, num_instances=16)


@pytest.fixture(scope="module")
def tiny():
    return load_policy("tiny")


def test_learnability_is_the_mean_of_each_boards_p_times_one_minus_p():
    valid = [[T, T, T, T], [T, F, F, F], [F, F, F, F], [T, T, F, F]]  # p_b: 1, 1/4, 0, 1/2
    optimal = [[T, F, F, F], [F, F, F, F], [F, F, F, F], [T, T, F, F]]
    probe = SizeProbe.of(5, valid, optimal)
    assert (probe.boards, probe.answers, probe.valid, probe.optimal) == (4, 4, 7, 3)
    assert probe.learnability == (0 + 0.25 * 0.75 + 0 + 0.5 * 0.5) / 4 == 0.109375
    assert (probe.p, probe.optimal_rate, probe.none_valid, probe.all_valid, probe.signal) == (
        7 / 16, 3 / 16, 0.25, 0.25, 0.5)
    assert probe.band == Band.LEARNABLE
    assert SizeProbe.of(3, [[F, F], [F, F], [T, F]], [[F, F]] * 3).band == Band.TOO_HARD  # 2 of 3 all invalid
    assert SizeProbe.of(3, [[T, T], [T, T], [T, F]], [[F, F]] * 3).band == Band.TOO_EASY
    assert SizeProbe.of(3, [[T, T], [F, F]], [[F, F]] * 2).band == Band.LEARNABLE  # half is not more than half


def test_the_signal_share_is_weighted_by_the_data_ratios():
    easy = SizeProbe.of(3, [[T, T], [T, T]], [[F, F]] * 2)  # signal 0
    mixed = SizeProbe.of(4, [[T, F], [T, T]], [[F, F]] * 2)  # signal 1/2
    result = ProbeResult({3: easy, 4: mixed}, {3: 0.75, 4: 0.25}, 8, 1.0)
    assert result.signal_share == 0.125
    assert ProbeResult({3: easy, 4: mixed}, {3: 0.0, 4: 0.0}, 8, 1.0).signal_share == 0.25  # no data: unweighted


def test_the_probe_is_reproducible_for_a_seed(tiny):
    first = probe_config(tiny, SMALL, seed=3, boards=2, answers=3)
    again = probe_config(tiny, SMALL, seed=3, boards=2, answers=3)
    assert first.sizes == again.sizes and first.completions == 2 * 2 * 3
    assert set(first.sizes) == {3, 4} and first.data_ratio == {3: 0.75, 4: 0.25}
    alone = probe_config(tiny, SMALL, seed=3, boards=2, answers=3, sizes=[4])
    assert alone.sizes == {4: first.sizes[4]}  # a size's numbers do not depend on the other sizes probed
    other = [probe_config(tiny, SMALL, seed=s, boards=2, answers=3).sizes for s in (4, 5, 6)]
    assert any(o != first.sizes for o in other)  # the seed matters


def test_a_probe_key_without_a_random_share_is_the_one_stored_before_it_existed_and_a_share_changes_it():
    assert probe_key(SMALL, "tiny", 1, 2, 2, 1.0) == "3306a41bb112aea7fda90b1dc7a566e1"
    broad = EnvConfig(**{**SMALL.model_dump(), "random_share": 0.5})
    assert probe_key(broad, "tiny", 1, 2, 2, 1.0) != probe_key(SMALL, "tiny", 1, 2, 2, 1.0)
    assert broad.one_size(3).random_share == 0.5  # a size's boards are drawn as the config draws them
    assert size_knobs(broad, 3) != size_knobs(SMALL, 3)  # so a size measured without the share is not reused


def test_a_second_ask_is_answered_from_the_table_without_sampling(tiny, tmp_path):
    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    loads = []

    def load():
        loads.append(1)
        return tiny

    first = measure(engine, SMALL, "tiny", policy=load, seed=1, boards=2, answers=2)
    assert not first.cached and loads == [1]

    def refuse():
        raise AssertionError("a cached probe must not sample")

    second = measure(engine, SMALL, "tiny", policy=refuse, seed=1, boards=2, answers=2)
    assert second.cached and second.sizes == first.sizes and second.key == first.key
    assert (second.completions, second.seconds) == (first.completions, first.seconds)
    with session(engine) as s:
        row = s.exec(select(Probe)).one()
    assert (row.key, row.checkpoint, row.seed, row.boards, row.answers, row.completions) == (
        probe_key(SMALL, "tiny", 1, 2, 2, 1.0), "tiny", 1, 2, 2, 8)
    third = measure(engine, SMALL, "tiny", policy=load, seed=2, boards=2, answers=2)  # another seed: measured
    assert not third.cached and loads == [1, 1]
    engine.dispose()


def test_a_size_with_the_knobs_of_one_measured_before_is_reused_not_sampled(tiny, tmp_path):
    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    first = measure(engine, SMALL, "tiny", policy=tiny, seed=1, boards=2, answers=2)
    size = max(SMALL.sizes)
    changed = SMALL.model_copy(update={"hole_ratio": {**SMALL.hole_ratio, size: 0.0}})  # one size's knob differs
    asked = []

    def once_for_the_changed_size():
        asked.append(1)
        return tiny

    second = measure(engine, changed, "tiny", policy=once_for_the_changed_size, seed=1, boards=2, answers=2)
    assert not second.cached and asked == [1] and second.reused == len(SMALL.sizes) - 1
    assert second.completions == 2 * 2  # one size sampled
    assert {s: p for s, p in second.sizes.items() if s != size} == {s: p for s, p in first.sizes.items() if s != size}
    alone = probe_config(tiny, changed, seed=1, boards=2, answers=2, sizes=[size])
    assert second.sizes[size] == alone.sizes[size]  # what sampling that size alone gives
    other_seed = measure(engine, changed, "tiny", policy=tiny, seed=3, boards=2, answers=2)
    assert other_seed.reused == 0 and other_seed.completions == len(SMALL.sizes) * 2 * 2  # another seed: no reuse
    engine.dispose()


def test_probes_that_differ_only_in_thinking_or_completion_length_do_not_share_a_cache_entry(tiny, tmp_path):
    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    keys = {}
    for name, settings in {"defaults": {}, "thinking": {"thinking": "on"}, "length": {"completion_length": 4}}.items():
        loads = []
        result = measure(engine, SMALL, "tiny", policy=lambda loads=loads: loads.append(1) or tiny,
                         settings=RunSettings(stages=1, **settings),
                         seed=1, boards=2, answers=2)
        assert not result.cached and result.reused == 0 and loads == [1]  # measured: nothing shared, no size reused
        keys[name] = result.key
    assert len(set(keys.values())) == 3
    assert keys["defaults"] == probe_key(SMALL, "tiny", 1, 2, 2, 1.0)  # a probe stored before keeps its key
    again = measure(engine, SMALL, "tiny", policy=None, settings=RunSettings(stages=1, completion_length=4), seed=1,
                    boards=2, answers=2)
    assert again.cached and again.key == keys["length"]
    engine.dispose()


def test_a_probe_that_loads_its_policy_answers_as_the_runs_settings_say(tmp_path, monkeypatch):
    """Without a loader `measure` loads the checkpoint itself: with the run's thinking mode and answer budget."""
    chat = build_tiny(0, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=32)
    chat.tokenizer.chat_template = "{{ messages[0].content }}"
    chat.prompt_style = "chat"
    folder = chat.save(tmp_path / "chat")
    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    answered = []
    generate = Policy.generate

    def spy(self, prompts, max_new_tokens, **kwargs):
        answered.append((self.thinking, max_new_tokens))
        return generate(self, prompts, max_new_tokens, **kwargs)

    monkeypatch.setattr(Policy, "generate", spy)
    measure(engine, SMALL.one_size(3), str(folder), settings=RunSettings(stages=1, thinking="on", completion_length=5),
            seed=1, boards=1, answers=1)
    assert answered == [(True, 5)]  # not the chat default of 512 tokens
    engine.dispose()


def test_the_probe_samples_at_the_stages_temperature():
    assert sampling_temperature({}) == 1.0  # TRL's default
    assert sampling_temperature({"temperature": 0.7}) == 0.7


def test_a_probe_of_no_answers_is_refused(tiny):
    with pytest.raises(ValueError, match="boards = 0"):
        probe_config(tiny, SMALL, boards=0)



def test_a_learnability_proposal_probes_the_runs_checkpoint_and_keeps_its_compute(tmp_path):
    """The propose job with the real tiny policy: 2 sizes x the 6 cells of the grid, stored, cached the second
    time; the proposal draws half of each size's boards broadly and the next stage can generate it, and replays the
    most learnable boards probed, none of the run's validation boards among them, each one a probe drew."""
    from lab.engineers import SFL_RHO
    from lab.jobs.worker import WorkerOptions, run_worker
    from lab.loop import create_run, held_out_of, run_propose_job
    from storage.models import Job, Proposal, Run, Stage
    from training.probe import probe_boards

    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    with session(engine) as s:
        run = create_run(s, name="l", config=SMALL, engineer="learnability", seed=2,
                         settings=RunSettings(stages=2, auto_apply=True, validation_agents=(2,)))  # 2-agent boards
        stage = s.exec(select(Stage).where(Stage.run_id == run.id)).one()
        stage.status, stage.checkpoint = "done", "tiny"
        s.add(stage)
        job = s.exec(select(Job)).one()
        job.status = "done"
        s.add(job)
        s.commit()
        run_id = run.id
    from storage.queue import enqueue

    for _ in range(2):
        with session(engine) as s:
            enqueue(s, "propose", {"run_id": run_id, "after_stage": 0, "replaces": None}, run_id=run_id, target=0)
        assert run_worker(engine, {"propose": run_propose_job}, WorkerOptions(once=True, poll_s=0.01))
    with session(engine) as s:
        first, second = s.exec(select(Proposal).order_by(Proposal.id)).all()
        probes = s.exec(select(Probe)).all()
    assert first.error is None and first.engineer == "learnability"
    assert first.compute["probes"] == len(probes) == 2 * 6 and first.compute["completions"] == 2 * 6 * 16 * 8
    assert first.compute["cached"] == 0 and first.compute["seconds"] > 0
    assert {p.checkpoint for p in probes} == {"tiny"}
    assert {(p.seed, p.boards, p.answers) for p in probes} == {(2, LEARN_BOARDS, LEARN_ANSWERS)} == {(2, 16, 8)}
    assert {(h, w) for p in probes for h, w in zip(p.config["hole_ratio"].values(), p.config["wait_ratio"].values(),
                                                   strict=True)} == set(grid(2))
    assert second.compute == {"completions": 0, "seconds": 0.0, "probes": 12, "cached": 12}  # all from the table
    assert second.projected_config == first.projected_config and second.rationale.splitlines()[:2] == \
        first.rationale.splitlines()[:2]
    proposed = EnvConfig.model_validate(first.projected_config)
    assert proposed.random_share == 0.5 and cannot_fill(proposed, stage_seed(2, 1)) is None
    assert first.rationale.splitlines()[0].startswith("size 3: hole ")
    replayed = [] if first.replay is None else list(first.replay.boards)
    assert second.replay == first.replay and len(replayed) <= round(SFL_RHO * SMALL.num_instances)
    with session(engine) as s:
        held_out = held_out_of(engine, s.get(Run, run_id))
    assert len(held_out) == 240 and not {b.id for b in replayed} & held_out  # the standard validation set
    probed = {b.id for p in probes for size in p.config["data_ratio"]
              for b in probe_boards(EnvConfig.model_validate(p.config), int(size), p.boards, p.seed)}
    assert {b.id for b in replayed} <= probed and first.rationale.splitlines()[-2].startswith(
        f"buffer: {len(replayed)} of the stage's {SMALL.num_instances} boards replayed")
    engine.dispose()
