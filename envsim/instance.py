"""An instance: a board with holes, agents' starts and goals, and the solver's exact labels.

The canonical text form is the board (`.` ice, `H` hole) followed by one line per agent,
`A0 (r,c) -> (r,c)`. `from_str` also reads a POGEMA-style picture where agent `i`'s start is
the letter `A`+i and its goal `a`+i, which is what people paste into the playground.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cached_property

from pydantic import BaseModel, ConfigDict, model_validator

from envsim.rules import ACTIONS, MAX_AGENTS, MAX_SIZE, MIN_AGENTS, MIN_SIZE, Cell

_AGENT_LINE = re.compile(r"^A(\d+)\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*->\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)$")


class Instance(BaseModel):
    """A MAPF-FrozenLake board; immutable, always well-formed (the constructor checks it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size: int
    holes: tuple[Cell, ...]  # sorted, no repeats
    starts: tuple[Cell, ...]
    goals: tuple[Cell, ...]
    # Exact labels from the solver; None until labelled.
    opt_soc: int | None = None
    opt_makespan: int | None = None
    needs_wait: bool | None = None
    reference_plan: tuple[tuple[str, ...], ...] | None = None

    @model_validator(mode="after")
    def _well_formed(self) -> Instance:
        problems = self.problems()
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def problems(self) -> list[str]:
        """Every way this instance breaks the rules, as messages naming the offending part."""
        out: list[str] = []
        n, k = self.size, len(self.starts)
        if not MIN_SIZE <= n <= MAX_SIZE:
            return [f"size {n} is outside {MIN_SIZE}..{MAX_SIZE}"]
        if not MIN_AGENTS <= k <= MAX_AGENTS:
            out.append(f"{k} agents: the count must be {MIN_AGENTS}..{MAX_AGENTS}")
        if len(self.goals) != k:
            out.append(f"{k} starts but {len(self.goals)} goals")
        for name, cells in (("hole", self.holes), ("start", self.starts), ("goal", self.goals)):
            for r, c in cells:
                if not (0 <= r < n and 0 <= c < n):
                    out.append(f"{name} ({r},{c}) is off the {n}x{n} board")
        if list(self.holes) != sorted(set(self.holes)):
            out.append("holes must be sorted and distinct")
        if len(set(self.starts)) != len(self.starts):
            out.append("two agents share a start")
        if len(set(self.goals)) != len(self.goals):
            out.append("two agents share a goal")
        holes = set(self.holes)
        for i, (s, g) in enumerate(zip(self.starts, self.goals, strict=False)):
            if s in holes:
                out.append(f"agent {i}'s start {s} is a hole")
            if g in holes:
                out.append(f"agent {i}'s goal {g} is a hole")
            if s == g:
                out.append(f"agent {i}'s start and goal are the same cell {s}")
        if self.reference_plan is not None:
            if len(self.reference_plan) != k:
                out.append(f"reference plan has {len(self.reference_plan)} lists for {k} agents")
            if any(a not in ACTIONS for plan in self.reference_plan for a in plan):
                out.append("reference plan uses an unknown action word")
        return out

    @property
    def num_agents(self) -> int:
        return len(self.starts)

    @property
    def hole_set(self) -> frozenset[Cell]:
        return frozenset(self.holes)

    @property
    def labelled(self) -> bool:
        return self.opt_soc is not None

    @cached_property
    def id(self) -> str:
        """A stable content hash of the board and agents (labels excluded)."""
        return hashlib.sha256(self.to_str().encode()).hexdigest()[:12]

    def rows(self) -> list[str]:
        holes = self.hole_set
        return ["".join("H" if (r, c) in holes else "." for c in range(self.size)) for r in range(self.size)]

    def to_str(self) -> str:
        """Canonical text: board rows, then `A<i> (r,c) -> (r,c)` per agent."""
        pairs = enumerate(zip(self.starts, self.goals, strict=True))
        agents = [f"A{i} ({s[0]},{s[1]}) -> ({g[0]},{g[1]})" for i, (s, g) in pairs]
        return "\n".join(self.rows() + agents)

    def picture(self) -> str:
        """The board with start letters `A, B, ...` and goal letters `a, b, ...` drawn in, which `from_str` reads
        back to this board (labels aside).

        A goal may lie under another agent's start (agents swap places, say), and one cell holds one letter:
        such a board is drawn in the canonical text form instead, whose agent lines say where each one is.
        """
        if set(self.starts) & set(self.goals):
            return self.to_str()
        grid = [list(row) for row in self.rows()]
        for i, (r, c) in enumerate(self.goals):
            grid[r][c] = chr(ord("a") + i)
        for i, (r, c) in enumerate(self.starts):
            grid[r][c] = chr(ord("A") + i)
        return "\n".join("".join(row) for row in grid)

    @classmethod
    def from_str(cls, text: str) -> Instance:
        """Read the canonical text form or a lettered picture; raises ValueError naming the problem."""
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        board = [ln for ln in lines if not ln.startswith("A") or not _AGENT_LINE.match(ln)]
        agent_lines = [ln for ln in lines if _AGENT_LINE.match(ln)]
        if not board:
            raise ValueError("no board rows found")
        size = len(board)
        holes: list[Cell] = []
        starts: dict[int, Cell] = {}
        goals: dict[int, Cell] = {}
        for r, row in enumerate(board):
            row = row.replace(" ", "")
            if len(row) != size:
                raise ValueError(f"row {r} has {len(row)} cells; a {size}-row board needs {size}")
            for c, ch in enumerate(row):
                _read_cell(ch, (r, c), holes, starts, goals, lettered=not agent_lines)
        for ln in agent_lines:
            i, sr, sc, gr, gc = map(int, _AGENT_LINE.match(ln).groups())
            if i in starts:
                raise ValueError(f"agent {i} is listed twice")
            starts[i], goals[i] = (sr, sc), (gr, gc)
        if sorted(starts) != list(range(len(starts))) or sorted(goals) != sorted(starts):
            raise ValueError(f"agents must be numbered 0..K-1 with a start and a goal each; got starts "
                             f"{sorted(starts)} and goals {sorted(goals)}")
        return cls(size=size, holes=tuple(sorted(holes)), starts=tuple(starts[i] for i in sorted(starts)),
                   goals=tuple(goals[i] for i in sorted(goals)))

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> Instance:
        return cls.model_validate(json.loads(text))

    def with_labels(self, *, opt_soc: int, opt_makespan: int, needs_wait: bool,
                    reference_plan: tuple[tuple[str, ...], ...]) -> Instance:
        return self.model_copy(update=dict(opt_soc=opt_soc, opt_makespan=opt_makespan, needs_wait=needs_wait,
                                           reference_plan=reference_plan))


AGENT_LETTERS = "ABCDEFG"  # starts; their lower case are the goals ('H' is a hole)


def _read_cell(ch: str, cell: Cell, holes: list[Cell], starts: dict[int, Cell], goals: dict[int, Cell],
               lettered: bool) -> None:
    """One character of a board picture into holes, starts or goals; a stray character, a letter in a board
    whose agents come on lines of their own, or an agent's second start (or goal) is refused, named."""
    if ch == "H":
        holes.append(cell)
        return
    if ch == ".":
        return
    r, c = cell
    if not lettered:
        raise ValueError(f"cell ({r},{c}) holds {ch!r}; with agent lines the board uses only '.' and 'H'")
    if ch.upper() not in AGENT_LETTERS:
        raise ValueError(f"cell ({r},{c}) holds {ch!r}, a stray character; use '.', 'H', A-G for starts, a-g for goals")
    agent = AGENT_LETTERS.index(ch.upper())
    placed, what = (starts, "start") if ch.isupper() else (goals, "goal")
    if agent in placed:
        first = placed[agent]
        raise ValueError(f"agent {agent} has two {what}s ({ch!r} at ({first[0]},{first[1]}) and at ({r},{c})); "
                         "each agent has one start (upper case) and one goal (lower case)")
    placed[agent] = cell
