"""A GRPO stage's learning signal per cell (agent count, map size): the mean absolute advantage of its answers.

GRPO learns from the differences within a group: a board's `num_generations` answers are scored, and each answer's
advantage is its reward minus the group's mean (divided by the group's spread where `scale_rewards` says so). A
group whose answers all earn the same reward has advantage 0 everywhere and moves no weight; the mean |advantage|
of a cell's answers is how much its boards taught the policy in this stage (the reward of the `bandit` engineer,
after Chen et al. 2025, "Self-Evolving Curriculum for LLM Reasoning").

Nothing is computed twice: the advantages are TRL's own, as `GRPOTrainer` computed and logged them for each
generation batch (`training.stage.Trainer` hands them here with each answer's cell). The stage writes the sums of
the batches it scored since its previous log into that step's `TrainingLog` row, under `CELLS`
(`records`), so a resumed stage keeps them exactly as it keeps its other logs; `read` sums a stage's rows back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

CELLS = "cells"  # the TrainingLog metrics key of the per-cell records

Cell = tuple[int, int]  # (agents, size) of a board


@dataclass(frozen=True)
class CellSignal:
    """What a cell's boards carried in a stage: its prompt groups, their answers and the sum of the answers'
    |advantage| (a sum, so that batches and log rows add up; `mean` is the cell's signal)."""

    groups: int
    completions: int
    abs_advantage: float

    @property
    def mean(self) -> float:
        """The mean |advantage| of the cell's answers (0 for a cell without any)."""
        return self.abs_advantage / self.completions if self.completions else 0.0

    def __add__(self, other: CellSignal) -> CellSignal:
        return CellSignal(self.groups + other.groups, self.completions + other.completions,
                          self.abs_advantage + other.abs_advantage)


def tally(cells: Sequence[Cell], advantages: Sequence[float], num_generations: int) -> dict[Cell, CellSignal]:
    """One generation batch per cell, in TRL's order: `cells[i]` is the cell of answer `i`'s board, `advantages[i]`
    its advantage, and each group's `num_generations` answers are consecutive (as TRL groups them)."""
    if len(cells) != len(advantages) or len(cells) % num_generations:
        raise ValueError(f"{len(cells)} cells and {len(advantages)} advantages: not whole groups of "
                         f"{num_generations}")
    out: dict[Cell, CellSignal] = {}
    for start in range(0, len(cells), num_generations):
        cell = cells[start]
        group = CellSignal(1, num_generations, sum(abs(a) for a in advantages[start:start + num_generations]))
        out[cell] = out[cell] + group if cell in out else group
    return out


def merged(parts: Iterable[Mapping[Cell, CellSignal]]) -> dict[Cell, CellSignal]:
    """Several tallies added up, cell by cell, fewest agents then smallest size first."""
    out: dict[Cell, CellSignal] = {}
    for part in parts:
        for cell, signal in part.items():
            out[cell] = out[cell] + signal if cell in out else signal
    return dict(sorted(out.items()))


def records(cells: Mapping[Cell, CellSignal]) -> list[dict[str, Any]]:
    """A tally as a log row stores it: `[{"agents", "size", "groups", "completions", "abs_advantage"}, ...]`."""
    return [{"agents": k, "size": s, "groups": c.groups, "completions": c.completions,
             "abs_advantage": c.abs_advantage} for (k, s), c in sorted(cells.items())]


def read(rows: Iterable[Mapping[str, Any]]) -> dict[Cell, CellSignal] | None:
    """A stage's signal per cell from its training-log rows' metrics, summed; None where no row has a record (stage
    0 trains nothing; a stage trained before the record existed)."""
    found = [row[CELLS] for row in rows if CELLS in row]
    if not found:
        return None
    return merged({(r["agents"], r["size"]): CellSignal(r["groups"], r["completions"], r["abs_advantage"])
                   for r in [record]} for row in found for record in row)
