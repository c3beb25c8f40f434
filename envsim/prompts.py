"""What a policy sees: an Instance as a chat prompt for an instruction-tuned LLM, or as a compact token line
for a tiny policy trained from scratch.

The chat prompt is one user message (every chat template accepts a lone user turn; some reject a system
turn) holding the rules in brief, the board with row and column numbers, each agent's start and goal as
(row, col), and the answer format that `envsim.parser` reads: `Agent i: ACTION ...` lines inside
`<answer>...</answer>`.

The compact prompt is a single line of space-separated tokens, all from `COMPACT_VOCAB`, in this order:

    size <n> agents <k> | holes (r,c) (r,c) ... | agent <i> start (r,c) goal (r,c) | ... | plan

A cell is one word, `(r,c)` with no spaces (the vocabulary has one for every cell of the largest board);
other numbers are spelled digit by digit (`12` is `1 2`). The board is its list of holes in row-major
order (a board without holes reads `holes |`), not a picture. Both choices are for a tiny transformer
trained from scratch: "is the cell I am about to enter a hole?" becomes "does this word occur in the hole
list?", the one thing attention does best, and a move is a look-up from one cell word to its neighbour.
(Measured on the warm start, docs/training.md: with cells as words the policy learned about twice as fast
per CPU-minute as with cells spelled `r , c`, which in turn beat a picture of the grid.) A 3x3 board with
two agents reads (one line, wrapped here)

    size 3 agents 2 | holes (0,2) (2,0) | agent 0 start (0,0) goal (2,2) |
    agent 1 start (1,0) goal (0,1) | plan

and its completion (`compact_answer(plan, board)`) is a trace per agent: the start cell, then each action
(short form) followed by the cell it leads to, one agent per line:

    Agent 0: (0,0) R (0,1) D (1,1) D (2,1) R (2,2)
    Agent 1: (1,0) U (0,0) R (0,1)

The cells are notes that `envsim.parser` skips (the plan is the actions: `R D D R` and `U R`); they are
there for the model, which then reads where it stands from its own line instead of summing its moves.

`compact_tokens` is the pre-tokenisation for a word-level tokenizer: cells whole, letters in runs, every
other digit and every other symbol on its own, and a line break as the token `<nl>`. Its tokens hold no
whitespace, so a `WordLevel` tokenizer with a `WhitespaceSplit` pre-tokenizer reads `" ".join(tokens)` back
into the same tokens, and its decoded text (`Agent 0 : (0,0) R (0,1) ... <nl> Agent 1 : ...`) is still a
plan to the parser, which takes `<nl>` for a line break.
"""

from __future__ import annotations

import re

from envsim.instance import Instance
from envsim.parser import Plan
from envsim.rules import ACTION_CODE, ACTIONS, DELTAS, MAX_SIZE, SHORT, Cell, horizon

# each action's short form in compact answers (`UP` -> `U`)
SHORT_OF: dict[str, str] = {word: short for short, word in SHORT.items()}
_TOKEN = re.compile(r"<nl>|\([0-9]++,[0-9]++\)|[0-9]|[^\W\d_]+|\S")
_LINE_BREAK = re.compile(r"\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")

# Specials first (padding, unknown word, end of answer: a tokenizer and a sampler need them though no
# compact text contains them), then everything compact prompts and answers are made of, then one word per
# cell of the largest board. `.`, `H` and `;` are no longer in compact texts but keep their ids: new words
# go at the end, so ids never move.
COMPACT_VOCAB: tuple[str, ...] = (
    "<pad>", "<unk>", "<eos>", "<nl>",
    *"0123456789",
    "size", "agents", "|", ".", "H", "agent", "start", ",", "goal", "plan",
    "Agent", ":", *(SHORT_OF[a] for a in ACTIONS), "holes", ";",
    *(f"({r},{c})" for r in range(MAX_SIZE) for c in range(MAX_SIZE)),
)


def chat_text(instance: Instance) -> str:
    """The whole task as one plain string, for models without a chat template."""
    n, k = instance.size, instance.num_agents
    agents = "\n".join(f"- Agent {i} starts at {_rc(s)} and must reach its goal at {_rc(g)}."
                       for i, (s, g) in enumerate(zip(instance.starts, instance.goals, strict=True)))
    answer = "\n".join(f"Agent {i}: ACTION ACTION ..." for i in range(k))
    return f"""\
Plan the moves of {k} agent{"s" * (k > 1)} on a frozen lake, a {n}x{n} grid.

Rules:
- A cell is (row, col): row 0 is the top row, col 0 the left column. "." is ice, "H" is a hole.
- Actions: UP (row - 1), DOWN (row + 1), LEFT (col - 1), RIGHT (col + 1), WAIT (stay in place).
- All agents act at the same time, one action each per step. An agent whose actions have run out stays \
where it is and still occupies its cell.
- The plan fails if an agent steps into a hole, an agent moves off the grid, two agents are in the same \
cell at the same time, or two agents swap cells in one step. Moving into a cell that another agent leaves \
in the same step is allowed.
- Every agent must end on its goal. No agent may have more than {horizon(n)} actions (the horizon).
- Find the shortest joint plan: every agent should reach its goal as early as possible, with no \
needless moves or waits.

Board (row numbers on the left, column numbers on top):
{_board(instance)}

Agents:
{agents}

Answer format: give the plan inside <answer>...</answer>, one line per agent, actions separated by spaces:
<answer>
{answer}
</answer>
Each ACTION is one of UP, DOWN, LEFT, RIGHT, WAIT."""


def chat_prompt(instance: Instance) -> list[dict[str, str]]:
    """Messages for a chat template: one user turn holding `chat_text(instance)`."""
    return [{"role": "user", "content": chat_text(instance)}]


def compact_prompt(instance: Instance) -> str:
    """The single-line token form of the module docstring; ends with the token `plan`."""
    parts = [f"size {_digits(instance.size)} agents {_digits(instance.num_agents)}"]
    parts.append(" ".join(["holes", *map(_cell, instance.holes)]))
    parts += [f"agent {_digits(i)} start {_cell(s)} goal {_cell(g)}"
              for i, (s, g) in enumerate(zip(instance.starts, instance.goals, strict=True))]
    parts.append("plan")
    return " | ".join(parts)


def compact_answer(plan: Plan, board: Instance | None = None) -> str:
    """The completion a compact prompt expects: `Agent i: R D W` lines in short forms.

    With `board`, each line is a trace (the tiny policy's form): the agent's start cell, then every action
    followed by the cell it leads to, `Agent 0: (0,0) R (0,1) D (1,1)`. The cells are notes the parser
    skips (envsim.parser, rule 3); writing them lets a small model read where it is from the line itself
    and check the next cell against the hole list, instead of summing its own moves. A move off the grid
    leaves the agent where it is, as in the rules.
    """
    lines = []
    for i, actions in enumerate(plan):
        if board is None:
            lines.append(f"Agent {i}:" + "".join(" " + SHORT_OF[a] for a in actions))
            continue
        cell = board.starts[i]
        words = [_cell(cell)]
        for a in actions:
            step = (cell[0] + DELTAS[ACTION_CODE[a]][0], cell[1] + DELTAS[ACTION_CODE[a]][1])
            cell = step if 0 <= step[0] < board.size and 0 <= step[1] < board.size else cell
            words.append(f"{SHORT_OF[a]} {_cell(cell)}")
        lines.append(f"Agent {i}: " + " ".join(words))
    return "\n".join(lines)


def compact_tokens(text: str) -> list[str]:
    """Split compact text into vocabulary tokens; `" ".join` of the result splits back into the same list."""
    return _TOKEN.findall(_LINE_BREAK.sub(" <nl> ", text))


def _digits(number: int) -> str:
    return " ".join(str(number))


def _cell(cell: Cell) -> str:
    return f"({cell[0]},{cell[1]})"


def _rc(cell: Cell) -> str:
    return f"({cell[0]}, {cell[1]})"


def _board(instance: Instance) -> str:
    width = len(str(instance.size - 1))
    header = " " * (width + 1) + " ".join(f"{c:>{width}}" for c in range(instance.size))
    rows = [f"{r:>{width}} " + " ".join(f"{ch:>{width}}" for ch in row)
            for r, row in enumerate(instance.rows())]
    return "\n".join([header, *rows])
