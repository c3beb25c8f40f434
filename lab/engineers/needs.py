"""What an engineer's propose job must give it besides the evidence, its seed and the fill check.

Each engineer that needs more declares it beside its code, as a function of the run's settings
(`storage.settings.RunSettings`) registered with it (`Engineer.needs`); the loop reads the declaration (`Needs`) instead
of the engineer's name, to check a run before it is stored, to load what the job needs, and to choose where the job
runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Needs:
    """What an engineer's propose job gives it, for one run.

    `language_model`: a language model answers, through the run's engineer backend (`lab.llm`): a run must name
    one, and the job passes it with its base URL, the run's context modules and `remeasure`; on an `hf:` backend
    the model answers in the job's own process, and on `hf:policy` the run's own policy is that model.
    `policy_path`: the folder of the checkpoint the proposal follows. `probe`: the boards and answers of each probe
    `probe_fn` samples on that checkpoint (None: no probe). `reads_episodes`: it reads the stage's dev episodes,
    not only its per-size metrics, so they must all be stored. `held_configs`: the configs a person wrote down for
    the run (`RunSettings.held_configs`, stored with it when its arm was made), passed as `held`: a run must hold
    them, read for this engineer. `held_out`: the ids of the boards the run holds out (its validation and dev
    boards, and the benchmark's at its agent counts), passed as `held_out`: boards the engineer hands the next stage
    to train on as they are (`EngineerAnswer.replay`) are never among them.
    """

    language_model: bool = False
    policy_path: bool = False
    probe: Mapping[str, int] | None = None
    reads_episodes: bool = False
    held_configs: bool = False
    held_out: bool = False


NOTHING = Needs()  # the evidence alone: `fixed`, `random`, `heuristic`
