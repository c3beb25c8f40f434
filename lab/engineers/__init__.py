"""Environment engineers: from the evidence of a run, the config of its next stage.

Each engineer is a function `engineer(evidence, *, seed, **options) -> EngineerAnswer`, chosen by name
from `ENGINEERS`. Options an engineer does not use are ignored, so a caller passes the same ones to all.
What one needs beyond the evidence (a probe, the checkpoint's folder, a language model's backend) it declares
beside its code, listed in `NEEDS` (`needs`): the loop reads that, never the engineer's name. One module per family:

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
- `evidence`: reads the dev failures board by board; per size it moves the hole and wait ratios toward them
  and weights the data by them, keeping a size whose config works; no probe compute.
- `language_model`: `llm` asks a language model (the policy itself, Gemma, or any OpenAI-compatible server);
  `reading` reads its JSON back, and `envsim.config.project` makes it legal, the error shown to the model when
  the answer is unusable.

An answer whose `projection` is None has failed: `error` says why, and the caller keeps the previous
config. No engineer raises on anything a model writes.
"""

from __future__ import annotations

from collections.abc import Callable

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
from lab.engineers.needs import NOTHING, Needs
from lab.engineers.reading import (
    MAX_ANSWER_CHARS,
    MAX_NUMBER_DIGITS,
    RATIONALE,
    RATIONALE_CHARS,
    Unreadable,
    read_config,
)
from storage.settings import Held, RunSettings

ENGINEERS: dict[str, Callable[..., EngineerAnswer]] = {
    "fixed": fixed,
    "random": random_config,
    "heuristic": heuristic,
    "learnability": learnability,
    "evidence": evidence_engineer,
    "llm": llm,
    Held.STATIC: static,
    Held.SCHEDULE: schedule,
    "bandit": bandit,
}

# The engineers a run alone can be given (the Runs page's choices): a held one runs only as an experiment's arm, whose
# runs store the configs of its file (`check_engineer` refuses it elsewhere, naming the arm to make).
ALONE = tuple(name for name in ENGINEERS if name not in set(Held))

# What each engineer needs besides the evidence (`lab.engineers.needs`), declared beside it; one left out needs
# nothing more.
NEEDS: dict[str, Callable[[RunSettings], Needs]] = {
    "learnability": learnability_needs,
    "evidence": evidence_needs,
    "llm": llm_needs,
    Held.STATIC: held_needs,
    Held.SCHEDULE: held_needs,
}


# The engineers whose answer is a function of the stage's evidence alone: asked again on the same stage (a person
# rejected the proposal), they answer the same config; the others draw from a seed that each rejection moves on
# (`lab.loop.proposal_seed`).
SAME_WHEN_ASKED_AGAIN = frozenset({"fixed", "heuristic", "evidence", "bandit", Held.STATIC, Held.SCHEDULE})


def needs_of(engineer: str, settings: RunSettings) -> Needs:
    """What `engineer` needs for a run with these settings."""
    declared = NEEDS.get(engineer)
    return NOTHING if declared is None else declared(settings)


__all__ = [
    "ALONE", "ANSWER_FORMAT", "CONFLICTS", "CONSTRAINED_RATIONALE_CHARS", "DOMINANT", "ENGINEERS", "FLOOR",
    "HOLE_CELLS",
    "HOLE_STEP", "INSTRUCTIONS", "LEARN_ANSWERS", "LEARN_BOARDS", "LEARN_FLOOR", "MASTERED", "MAX_ANSWER_CHARS",
    "MAX_NUMBER_DIGITS", "RANDOM_DRAWS", "RATIONALE", "RATIONALE_CHARS", "REMEASURE", "RETRY", "SFL_RANDOM_SHARE",
    "SFL_RHO",
    "NEEDS", "SAME_WHEN_ASKED_AGAIN", "SHARE_STEP", "UNLEARNED", "WAIT_CELLS", "WAIT_STEP", "Complete",
    "EngineerAnswer", "HeldFileError", "MAX_HELD_BYTES", "Needs", "ProbeFn", "Unreadable", "answer_of",
    "answer_schema", "bandit", "buffer", "changed_sizes", "check_held", "compute_of", "engineer_prompt",
    "evidence_engineer", "fixed", "grid", "heuristic", "learnability", "llm", "needs_of", "random_config",
    "read_config", "read_held", "schedule", "shares", "static",
]
