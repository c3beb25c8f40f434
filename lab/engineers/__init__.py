"""Environment engineers: from the evidence of a run, the config of its next stage.

Each engineer is an `Engineer` (`engineer`): its name, what it reads, whether asking again changes its answer, what
its propose job needs beyond the evidence (a probe, the checkpoint's folder, a language model's backend: `needs`,
declared beside its code), and `propose(evidence, *, seed, **options) -> EngineerAnswer`; options an engineer does
not use are ignored, so a caller passes the same ones to all. They are registered once, below, in `ENGINEERS`;
the loop, the command line, the page and the experiments read that, never a list of names. One module per family:

- `baselines`: `fixed` keeps the current config (the paper's fixed-environment baseline), `random` draws a
  legal config from the seed and the round (the paper's random baseline), `heuristic` is a transparent
  curriculum rule; its rationale has one line per change it makes.
- `held`: `static` proposes one config a person wrote down for every stage, `schedule` one per stage; read once
  from a file when an experiment's arm is made (`read_held`) and stored with its runs.
- `learnability`: sampling for learnability (SFL): per size it probes a grid of hole and wait ratios on the
  policy (`training.probe`), scores every probed board by p(1-p), replays the most learnable boards as half of the
  next stage (`EngineerAnswer.replay`) and draws the other half fresh from a config built from the same probes (each
  size on its most learnable cell, weighted by learnability, half of it broadly at random: `random_share`).
- `bandit`: a self-evolving curriculum (SEC): a bandit over (agent count, map size) cells whose reward is the mean
  |advantage| each cell's boards had in training (`training.advantage`), its Q a pure function of the run's stages;
  the Boltzmann shares over the cells become `data_ratio` and `agent_ratio`.
- `climb`: keeps what works: from the config of its run's stage that gained most on dev, one knob (holes, waits,
  the agent mix) stepped the way its own earlier stages' dev gains say.
- `levels`: a SEC bandit whose arms span difficulty: per knob (holes, waits, agent mix) a level drawn from the
  mean |advantage| the levels taught in its run's stages.
- `evidence`: reads the dev failures board by board; per size it moves the hole and wait ratios toward them
  and weights the data by them, keeping a size whose config works; no probe compute.
- `language_model`: `llm` asks a language model (the policy itself, Gemma, or any OpenAI-compatible server);
  `reading` reads its JSON back, and `envsim.config.project` makes it legal, the error shown to the model when
  the answer is unusable.

An answer whose `projection` is None has failed: `error` says why, and the caller keeps the previous
config. No engineer raises on anything a model writes.
"""

from __future__ import annotations

from lab.engineers.answer import SHARE_STEP, EngineerAnswer, ProbeFn, answer_of, shares
from lab.engineers.bandit import bandit
from lab.engineers.baselines import (
    CONFLICTS,
    DOMINANT,
    FLOOR,
    HOLE_STEP,
    MASTERED,
    RANDOM_DRAWS,
    UNLEARNED,
    WAIT_STEP,
    fixed,
    heuristic,
    random_config,
)
from lab.engineers.climb import climb
from lab.engineers.engineer import ENGINEERS, Engineer, Propose, names, names_text, register, unregister
from lab.engineers.evidence import evidence_engineer, evidence_needs
from lab.engineers.held import MAX_HELD_BYTES, HeldFileError, check_held, held_needs, read_held, schedule, static
from lab.engineers.language_model import (
    ANSWER_FORMAT,
    CONSTRAINED_RATIONALE_CHARS,
    INSTRUCTIONS,
    REMEASURE,
    RETRY,
    Complete,
    answer_schema,
    changed_sizes,
    engineer_prompt,
    llm,
    llm_needs,
)
from lab.engineers.learnability import (
    HOLE_CELLS,
    LEARN_ANSWERS,
    LEARN_BOARDS,
    LEARN_FLOOR,
    SFL_RANDOM_SHARE,
    SFL_RHO,
    WAIT_CELLS,
    buffer,
    compute_of,
    grid,
    learnability,
    learnability_needs,
)
from lab.engineers.levels import levels
from lab.engineers.needs import Needs
from lab.engineers.reading import (
    MAX_ANSWER_CHARS,
    MAX_NUMBER_DIGITS,
    RATIONALE,
    RATIONALE_CHARS,
    Unreadable,
    read_config,
)
from storage.settings import Held, RunSettings

_READS_STAGE = "it reads only this stage's results"
for _engineer in (
    Engineer("fixed", fixed, "nothing: it keeps the current config", True, _READS_STAGE),
    Engineer("random", random_config, "nothing: it draws a legal config from the seed and the round"),
    Engineer("heuristic", heuristic, "the stage's dev results per size", True, _READS_STAGE),
    Engineer("learnability", learnability, "probes of a grid of configs on the checkpoint (p(1-p) per board)",
             needs=learnability_needs),
    Engineer("evidence", evidence_engineer, "the stage's dev failures, board by board", True, _READS_STAGE,
             needs=evidence_needs),
    Engineer("llm", llm, "what its context modules show a language model", needs=llm_needs),
    Engineer(Held.STATIC, static, "the config its run holds", True, "it proposes the configs its run holds",
             needs=held_needs, alone=False),
    Engineer(Held.SCHEDULE, schedule, "the configs its run holds, one per stage", True,
             "it proposes the configs its run holds", needs=held_needs, alone=False),
    Engineer("bandit", bandit, "the mean |advantage| of each (agents, size) cell in its run's training logs", True,
             "it reads the training logs of its run's stages so far"),
    Engineer("climb", climb, "the dev gain of each of its run's stages and the config each trained on"),
    Engineer("levels", levels, "the mean |advantage| of each of its run's stages and the difficulty levels each "
             "trained on"),
):
    register(_engineer)


def needs_of(engineer: str, settings: RunSettings) -> Needs:
    """What `engineer` needs for a run with these settings."""
    return ENGINEERS[engineer].needs_for(settings)


__all__ = [
    "ANSWER_FORMAT", "CONFLICTS", "CONSTRAINED_RATIONALE_CHARS", "DOMINANT", "ENGINEERS", "FLOOR",
    "HOLE_CELLS",
    "HOLE_STEP", "INSTRUCTIONS", "LEARN_ANSWERS", "LEARN_BOARDS", "LEARN_FLOOR", "MASTERED", "MAX_ANSWER_CHARS",
    "MAX_NUMBER_DIGITS", "RANDOM_DRAWS", "RATIONALE", "RATIONALE_CHARS", "REMEASURE", "RETRY", "SFL_RANDOM_SHARE",
    "SFL_RHO",
    "SHARE_STEP", "UNLEARNED", "WAIT_CELLS", "WAIT_STEP", "Complete",
    "Engineer", "EngineerAnswer", "HeldFileError", "Propose", "names", "names_text", "register", "unregister",
    "MAX_HELD_BYTES", "Needs", "ProbeFn", "Unreadable", "answer_of",
    "answer_schema", "bandit", "buffer", "changed_sizes", "check_held", "compute_of", "engineer_prompt",
    "evidence_engineer", "fixed", "grid", "heuristic", "learnability", "llm", "needs_of", "random_config",
    "read_config", "read_held", "schedule", "shares", "static",
]
