"""GRPO rewards for MAPF-FrozenLake: plain TRL reward callables `(completions, **kwargs) -> list[float]`.

Each function reads the board from the dataset's `instance` column (an `Instance.to_json()` string; TRL
passes every extra dataset column to the reward functions as a keyword list, one entry per completion)
and scores the completion with the project's own parser and scorer (`envsim.scoring.score_answer`), so a
reward and an evaluation never disagree about what an answer means. The four terms, for one completion
on a board with K agents and exact labels `opt_makespan`, `opt_soc`:

    format      = 1 if the answer parses into one action list for each agent 0..K-1, else 0
                  (0 exactly for `parse_error` and `wrong_agent_count`)
    validity    = 1 if the plan is valid (no failure of any type, docs/rules.md), else 0
    optimality  = (opt_makespan / makespan + opt_soc / soc) / 2 for a valid plan, else 0
                  (1 exactly when the plan is makespan-optimal, the paper's "optimal", and SoC-optimal;
                  partial credit otherwise, since makespan >= opt_makespan and soc >= opt_soc)
    progress    = the share of agents that end on their goal and are named in no failure event (no hole,
                  illegal move, conflict or over-long list of theirs); 0 for an answer that does not parse.
                  A shaped term: it pays for getting some agents home cleanly before the whole plan is
                  valid. It is POGEMA's ISR without the credit a plain ISR gives to two agents that
                  collide on the way and still both end on their goals.

The trainer sums them with `GRPOConfig.reward_weights` (default `DEFAULT_WEIGHTS`: validity 1, optimality 1,
format 0.2, progress 0.2), so the solver's reference plan on a board where it is also makespan-optimal earns
2.4, and garbage earns 0. TRL logs each term as `rewards/<function name>/mean`.

All four functions share one cached scoring per (board, completion): TRL calls them one after another on
the same batch, and each prompt's board repeats `num_generations` times.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from envsim.instance import Instance
from envsim.rules import Failure
from envsim.scoring import Outcome, score_answer

_UNREAD = (Failure.PARSE_ERROR, Failure.WRONG_AGENT_COUNT)


@lru_cache(maxsize=256)
def _board(instance_json: str) -> Instance:
    return Instance.from_json(instance_json)


@lru_cache(maxsize=8192)
def _outcome(instance_json: str, text: str) -> Outcome:
    return score_answer(_board(instance_json), text)


def _text(completion: Any) -> str:
    """A completion is a string, or for conversational prompts a list of messages (the last one is the answer)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def outcomes(completions: Sequence[Any], instance: Sequence[str]) -> list[Outcome]:
    """The scored outcome of each completion on its board (the `instance` column, JSON strings)."""
    if len(completions) != len(instance):
        raise ValueError(f"{len(completions)} completions but {len(instance)} instances")
    return [_outcome(board, _text(c)) for c, board in zip(completions, instance, strict=True)]


def format_reward(completions: Sequence[Any], instance: Sequence[str], **kwargs: Any) -> list[float]:
    """1.0 when the answer reads as a plan for exactly the board's agents, else 0.0."""
    return [float(o.failure not in _UNREAD) for o in outcomes(completions, instance)]


def validity_reward(completions: Sequence[Any], instance: Sequence[str], **kwargs: Any) -> list[float]:
    """1.0 for a valid plan, else 0.0."""
    return [float(o.valid) for o in outcomes(completions, instance)]


def optimality_reward(completions: Sequence[Any], instance: Sequence[str], **kwargs: Any) -> list[float]:
    """(opt_makespan / makespan + opt_soc / soc) / 2 for a valid plan, else 0.0."""
    out = []
    for o, board in zip(outcomes(completions, instance), instance, strict=True):
        inst = _board(board)
        out.append((inst.opt_makespan / o.makespan + inst.opt_soc / o.soc) / 2 if o.valid else 0.0)
    return out


def progress_reward(completions: Sequence[Any], instance: Sequence[str], **kwargs: Any) -> list[float]:
    """The share of agents that end on their goal and take part in no failure event; 0.0 when unread."""
    out = []
    for o, board in zip(outcomes(completions, instance), instance, strict=True):
        goals = _board(board).goals
        involved = {agent for event in o.events for agent in event.agents}
        home = [i for i, cell in enumerate(o.positions[-1]) if cell == goals[i] and i not in involved]
        out.append(len(home) / len(goals))
    return out


REWARDS = (validity_reward, optimality_reward, format_reward, progress_reward)
DEFAULT_WEIGHTS = (1.0, 1.0, 0.2, 0.2)  # in the order of REWARDS
