"""How well Gemma 3 270M (base) serves as the llm engineer: parse rate, projection adjustments, seconds.

Run: `python benchmarks/bench_gemma_engineer.py [--n 10] [--max-tokens 384] [--max-attempts 3] [--seed 0]
[--threads 1] [--show]`.

Builds `n` seeded evidence samples from scored episodes: labelled boards for sizes 3..10 (the generator),
each answered by the solver's reference plan with a per-size skill drawn for the sample, or else by a random
walk or a prose answer; the scorer turns them into per-size results and failure cases. Every sample has a
stage 0 on the round-0 default config and 0-2 later stages on random configs. The llm engineer then proposes
with `hf:gemma3-270m` (paper-best context, temperature 0.7). Prints, per answer and in total: how often the
answer held a JSON config that could be read, how often projection had to adjust it (and what), how many
proposals ended with a legal config, and seconds per proposal. Nothing is asserted.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without an install

import argparse  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from envsim.config import EnvConfig, project  # noqa: E402
from envsim.generator import generate  # noqa: E402
from envsim.instance import Instance  # noqa: E402
from envsim.parser import format_plan  # noqa: E402
from envsim.rules import ACTIONS  # noqa: E402
from envsim.scoring import Tally, score_answer  # noqa: E402
from lab.context import Evidence, FailureCase, StageResult  # noqa: E402
from lab.engineers import Unreadable, llm, random_config, read_config  # noqa: E402
from lab.llm import complete  # noqa: E402

BACKEND = "hf:gemma3-270m"
STAGES = 5


def answer_for(inst: Instance, skill: float, rng: np.random.Generator) -> str:
    """The reference plan with probability `skill`, else a random walk (mostly) or prose."""
    if rng.random() < skill:
        return format_plan(inst.reference_plan)
    if rng.random() < 0.1:
        return "The agents should move towards their goals."
    length = int(rng.integers(1, 2 * inst.size + 1))
    return "\n".join(f"Agent {i}: " + " ".join(ACTIONS[a] for a in rng.integers(0, 5, length))
                     for i in range(inst.num_agents))


def scored_stage(index: int, config: EnvConfig, boards: list[Instance], rng: np.random.Generator) -> StageResult:
    skill = {s: float(rng.uniform(0, 1) * (11 - s) / 8) for s in config.sizes}  # larger boards: less skill
    counts: dict[int, list] = {s: [0, 0, 0, Counter()] for s in config.sizes}
    cases = []
    for inst in boards:
        text = answer_for(inst, skill[inst.size], rng)
        outcome = score_answer(inst, text)
        row = counts[inst.size]
        row[0] += 1
        row[1] += outcome.valid
        row[2] += outcome.optimal
        if outcome.failure:
            row[3][outcome.failure.value] += 1
            if len(cases) < 3:
                cases.append(FailureCase(inst, text, outcome))
    by_size = {s: Tally(n, v, o, dict(f)) for s, (n, v, o, f) in counts.items() if n}
    return StageResult(index, config, by_size, tuple(cases))


def sample(k: int, boards: list[Instance]) -> Evidence:
    rng = np.random.default_rng([2606, k])
    stages = [scored_stage(0, EnvConfig.default(), boards, rng)]
    for index in range(1, k % 3 + 1):
        previous = Evidence(stages[-1], round_index=index)
        config = random_config(previous, seed=k).projection.config
        stages.append(scored_stage(index, config, boards, rng))
    current = stages[-1]
    return Evidence(current, tuple(stages[:-1]), round_index=current.stage_index + 1,
                    rounds_left=STAGES - current.stage_index, instances_per_stage=current.config.num_instances)


def adjustment_kind(reason: str) -> str:
    return re.sub(r"\(.*\)|[0-9.]+", "", reason).strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (on a busy 2-core machine, 2 threads run ~6x slower than 1)")
    p.add_argument("--show", action="store_true", help="print every raw answer")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    boards = generate(EnvConfig.default(), 48, seed=args.seed)  # 6 labelled boards per size 3..10
    complete("hf:gemma3-270m", [{"role": "user", "content": "Hello"}], max_tokens=1, temperature=0, seed=0)
    print(f"setup (boards, Gemma checkpoint and load): {time.perf_counter() - t0:.1f} s")

    answers: list[dict] = []
    proposals = []
    for k in range(args.n):
        evidence = sample(k, boards)

        def ask(messages, evidence=evidence, k=k):
            t = time.perf_counter()
            raw = complete(BACKEND, messages, max_tokens=args.max_tokens, temperature=args.temperature,
                           seed=args.seed * 1000 + k * 10 + len(answers))
            row = {"proposal": k, "seconds": time.perf_counter() - t, "raw": raw, "read": False,
                   "legal": False, "adjustments": []}
            try:
                proposed, _ = read_config(raw)
                row["read"] = True
                row["adjustments"] = list(project(proposed, base=evidence.current.config).adjustments)
                row["legal"] = True
            except Unreadable as err:
                row["error"] = f"unreadable: {err}"
            except (ValueError, TypeError, OverflowError) as err:
                row["error"] = f"illegal: {err}"
            answers.append(row)
            return raw

        t = time.perf_counter()
        answer = llm(evidence, seed=args.seed, complete_fn=ask, max_attempts=args.max_attempts)
        proposals.append((answer, time.perf_counter() - t))
        status = "legal config" if answer.projection else f"failed ({answer.error[:90]})"
        print(f"proposal {k}: {answer.attempts} answer(s), {proposals[-1][1]:.1f} s, {status}", flush=True)
        if args.show:
            for a in answers:
                if a["proposal"] == k:
                    print("  ---\n  " + a["raw"][:1500].replace("\n", "\n  "))

    n_answers = len(answers)
    read = sum(a["read"] for a in answers)
    legal = sum(a["legal"] for a in answers)
    adjusted = [a for a in answers if a["legal"] and a["adjustments"]]
    first = [next(a for a in answers if a["proposal"] == k) for k in range(args.n)]
    ok = [ans for ans, _ in proposals if ans.projection is not None]
    seconds = [s for _, s in proposals]
    kinds = Counter(adjustment_kind(adj.reason) for a in adjusted for adj in a["adjustments"])
    errors = Counter(a["error"].split(":")[0] + ": " + a["error"].split(": ", 2)[-1][:70]
                     for a in answers if not a["legal"])
    print(f"\n{BACKEND}, {args.n} proposals, max {args.max_attempts} answers each, {args.max_tokens} new tokens max,"
          f" temperature {args.temperature}, {args.threads} torch thread(s)")
    print(f"answers: {n_answers}; held a readable JSON object: {read} ({read / n_answers:.0%}); "
          f"projected to a legal config: {legal} ({legal / n_answers:.0%})")
    print(f"first answers readable: {sum(a['read'] for a in first)}/{args.n}, legal: {sum(a['legal'] for a in first)}"
          f"/{args.n}")
    print(f"proposals with a legal config: {len(ok)}/{args.n}; legal answers the projection adjusted: "
          f"{len(adjusted)}/{legal}")
    print(f"adjustments by kind: {dict(kinds.most_common())}")
    print(f"why answers failed: {dict(errors.most_common(8))}")
    print(f"seconds per proposal: mean {np.mean(seconds):.1f}, min {min(seconds):.1f}, max {max(seconds):.1f}; "
          f"per answer: mean {np.mean([a['seconds'] for a in answers]):.1f}")


if __name__ == "__main__":
    main()
