"""Scripted parts the engineer tests share: a three-size config, its evidence, a scripted model and a
scripted probe."""

from __future__ import annotations

from envsim.config import EnvConfig
from envsim.scoring import Tally
from lab.context import Evidence, StageResult
from training.advantage import CellSignal
from training.probe import ProbeResult, SizeProbe

CONFIG = EnvConfig.default((3, 4, 5))
# What stage 1 trained on, per cell (agents, size): groups, answers, the sum of their |advantage| (`bandit` reads it).
CELLS = {(2, 3): CellSignal(4, 32, 6.4), (2, 4): CellSignal(4, 32, 16.0), (2, 5): CellSignal(4, 32, 3.2)}
GOOD = """Here is my proposal.
```json
{"data_ratio": {"3": 1, "4": 0.5, "5": 0.5}, "hole_ratio": {"3": 0.7}, "wait_ratio": {"4": 0.5}}
```
Size 3 is the most learnable, so it gets half of the data."""


def evidence(by_size: dict[int, Tally] | None = None, config: EnvConfig = CONFIG) -> Evidence:
    by_size = {
        3: Tally(10, 9, 8, {"hole": 1}),
        4: Tally(10, 5, 2, {"vertex_conflict": 4, "hole": 1}),
        5: Tally(10, 0, 0, {"hole": 7, "goal_not_reached": 3}),
    } if by_size is None else by_size
    return Evidence(StageResult(1, config, by_size, cells=CELLS), (StageResult(0, CONFIG, {}),), round_index=2,
                    rounds_left=3)


class Script:
    """A completion function that answers from a list, in order, and keeps every conversation it was sent."""

    def __init__(self, *answers: object):
        self.answers = list(answers)
        self.calls: list[list[dict[str, str]]] = []

    def __call__(self, messages: list[dict[str, str]]) -> str:
        self.calls.append(messages)
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]


class ScriptedProbe:
    """A measurement from a table: (size, hole, wait) -> learnability (default 0.05), p = 0.5; keeps every call.
    A pair in `unmakeable` raises as the generator does."""

    def __init__(self, table: dict[tuple[int, float, float], float], unmakeable: tuple = (), cached: bool = False):
        self.table, self.unmakeable, self.cached, self.calls = table, unmakeable, cached, []

    def __call__(self, config: EnvConfig) -> ProbeResult:
        (size,) = config.sizes
        pair = (size, config.hole_ratio[size], config.wait_ratio[size])
        self.calls.append(pair)
        if pair in self.unmakeable:
            from envsim.generator import GenerationError
            raise GenerationError(f"size {size}: cannot", size)
        learn = self.table.get(pair, 0.05)
        return ProbeResult({size: SizeProbe(size, 4, 8, 16, 3, learn, 0.25, 0.0)}, {size: 1.0}, 32, 2.0,
                           cached=self.cached)
