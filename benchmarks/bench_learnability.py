"""How much GRPO signal a scenario's boards carry for a policy, size by size: the reasoning behind `hard-start`
(docs/experiments.md), measured instead of assumed.

For each map size, boards drawn with the scenario's hole and wait ratios are each answered `--generations` times
by sampling at temperature 1 (a GRPO group, as a stage samples it). Per size: p, the share of valid answers; the
mean learnability p(1-p) over groups (the variance of a group's valid reward: 0 when every answer agrees); and
the share of groups whose answers are all invalid, which carry no advantage at all. Weighted by the scenario's
data ratios, it says how much of a stage's data can move the policy.

    python benchmarks/bench_learnability.py --scenario hard-start --boards 16
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from envsim.config import EnvConfig
from envsim.generator import generate
from envsim.parser import parse as parse_plan  # `parse` is the command line's (flags.parse) run as a script
from envsim.scoring import score
from lab.study.experiments import load_scenario
from training.evaluate import answer_budget
from training.policy import load_policy


@dataclass
class Args:
    scenario: str = "hard-start"
    boards: int = 16  # per size
    generations: int = 8
    policy: str = "tiny"
    threads: int = 1
    seed: int = 0


def main(args: Args) -> None:
    torch.set_num_threads(args.threads)
    scenario = load_scenario(args.scenario)
    policy = load_policy(args.policy)
    t0 = time.perf_counter()
    rows = []
    for size in scenario.config.sizes:
        one = EnvConfig(data_ratio={size: 1.0}, hole_ratio={size: scenario.config.hole_ratio[size]},
                        wait_ratio={size: scenario.config.wait_ratio[size]}, agent_ratio=scenario.config.agent_ratio)
        boards = generate(one, args.boards, seed=args.seed)
        prompts = [policy.prompt(b) for b in boards for _ in range(args.generations)]
        answers = policy.generate(prompts, max_new_tokens=answer_budget(policy, boards[0]), do_sample=True,
                                  seed=args.seed)
        valid = [score(b, parse_plan(answers[i * args.generations + g], b.num_agents)).valid
                 for i, b in enumerate(boards) for g in range(args.generations)]
        groups = [valid[i * args.generations:(i + 1) * args.generations] for i in range(len(boards))]
        shares = [sum(g) / len(g) for g in groups]
        rows.append((size, scenario.config.data_ratio[size], sum(valid) / len(valid),
                     sum(p * (1 - p) for p in shares) / len(shares), sum(p == 0 for p in shares) / len(shares)))
    print(f"scenario {args.scenario}, policy {args.policy}: {args.boards} boards per size, {args.generations} sampled "
          f"answers each (temperature 1), {time.perf_counter() - t0:.0f} s")
    print("| size | data share | holes | p (valid) | mean p(1-p) | groups all invalid |")
    print("|---|---|---|---|---|---|")
    for size, share, p, learn, dead in rows:
        print(f"| {size}x{size} | {share:.0%} | {scenario.config.hole_ratio[size]:.0%} | {p:.1%} | {learn:.3f} | "
              f"{dead:.0%} |")
    weighted = sum(share * learn for _, share, _, learn, _ in rows)
    dead = sum(share * d for _, share, _, _, d in rows)
    print(f"weighted by the data shares: mean p(1-p) {weighted:.3f}; groups with no advantage {dead:.0%}")


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
