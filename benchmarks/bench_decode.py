"""Transformers' `generate`, envlab's decode loop and the loop with drafts (`training.decode`) side by side, on the
same boards and seed, in one process: greedy validation of a fixed board set (the three, with the model's forwards
each took), GRPO steps of the shipped tiny policy (sampled: the drafted loop's answers come from the same
distribution, not the same draws, so only the loop's loss curve is compared with generate's), and (`--run`) a whole
small run (stage 0 evaluated, one GRPO stage, evaluated again: `benchmarks/stage_breakdown.py`'s). Each part runs
its paths in turns, twice unless `--quick`, and prints the seconds, generate's time over each other path's and
whether the answers (validation), the loss curve (GRPO) and the stage's valid rates (run) are the same.

    OMP_NUM_THREADS=1 python benchmarks/bench_decode.py                # 210 boards, 4 GRPO steps of 32 completions
    OMP_NUM_THREADS=1 python benchmarks/bench_decode.py --run          # and the whole small run
    OMP_NUM_THREADS=1 python benchmarks/bench_decode.py --quick        # the CI budget: 12 boards, 1 step, no run
    OMP_NUM_THREADS=1 python benchmarks/bench_decode.py --paged --boards 128   # and transformers' paged batching

`--paged` also answers the validation boards with transformers' continuous batching (`generate_batch`: a paged KV
cache, a finished row's place taken by the next board at once) and with the loop, both at the largest budget of the
boards, greedy, and prints the two times and whether the answers are the same.

The ratio is the one to quote: the seconds move with the machine's load, the two paths alike.
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback

import training.policy
import training.stage
from envsim.config import EnvConfig
from envsim.generator import generate
from envsim.instance import Instance
from training.evaluate import answer_budget, evaluate
from training.policy import Decoder, Policy, load_policy
from training.rewards import REWARDS
from training.stage import StageArgs, Trainer, dataset, grpo_config

PATHS: tuple[Decoder, ...] = ("transformers", "loop", "drafted")
PAGE = 256  # tokens a page of the paged KV cache (`--paged`)


@dataclass
class Args:
    boards: int = 210  # validation boards (agents and sizes as below, in equal shares)
    agents: str = "3,4,5"
    sizes: str = "5,6,7,8,9,10"
    batch: int = 64  # validation boards a batch (the lab's)
    steps: int = 4  # GRPO steps timed, after one of warm-up
    prompts: int = 4  # boards a GRPO step
    generations: int = 8  # completions a board
    repeats: int = 2  # turns of each path
    run: bool = False  # also a whole small run (stage_breakdown's), each path once a turn
    threads: int = 1
    quick: bool = False  # the CI budget: 12 boards, 1 step, 1 turn
    paged: bool = False  # also transformers' continuous batching (`generate_batch`) against the loop, validation


def boards_of(args: Args, n: int, seed: int) -> list[Instance]:
    agents = [int(a) for a in args.agents.split(",")]
    sizes = tuple(int(s) for s in args.sizes.split(","))
    config = EnvConfig.default(sizes=sizes, num_instances=n).model_copy(
        update={"agent_ratio": {k: 1 / len(agents) for k in agents}})
    return generate(config, n, seed=seed)


def validation(policy: Policy, boards: list[Instance], args: Args) -> dict[Decoder, Any]:
    """Seconds of each path (the mean of its turns), its answers and the model's forwards it took (a turn's)."""
    seconds: dict[Decoder, list[float]] = {p: [] for p in PATHS}
    answers: dict[Decoder, list[str]] = {}
    forwards: dict[Decoder, int] = {}
    for path in PATHS:  # warm-up: first-call allocations
        policy.decoder = path
        evaluate(policy, boards[:2], batch_size=2)
    calls = [0]
    hook = policy.model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    for _ in range(args.repeats):
        for path in PATHS:
            policy.decoder = path
            calls[0] = 0
            t0 = time.perf_counter()
            results = evaluate(policy, boards, batch_size=args.batch)
            seconds[path].append(time.perf_counter() - t0)
            answers[path], forwards[path] = [r.completion for r in results], calls[0]
            valid = sum(r.outcome.valid for r in results)
    hook.remove()
    return {"seconds": {p: statistics.mean(s) for p, s in seconds.items()}, "answers": answers, "valid": valid,
            "forwards": forwards}


def paged(policy: Policy, boards: list[Instance], batch: int) -> dict[str, Any]:
    """Greedy answers to `boards` by transformers' continuous batching (`generate_batch`, a paged KV cache) and by the
    loop (`Policy.generate`, batches of `batch`), both at the largest budget of the boards: seconds, answers."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    prompts = [policy.prompt(b) for b in boards]
    budget = max(answer_budget(policy, b) for b in boards)
    tok, model = policy.tokenizer, policy.model
    policy.decoder = "loop"
    t0 = time.perf_counter()
    loop = policy.generate(prompts, max_new_tokens=budget, batch_size=batch)
    seconds = {"loop": time.perf_counter() - t0}
    # its paged cache sized for `batch` answers at once, as the loop's batches (left to itself, transformers sizes it
    # from the memory free: 12.8 GB on this machine, which the kernel's OOM killer took back)
    longest = max(len(policy.token_ids(p)) for p in prompts) + budget
    config = GenerationConfig(max_new_tokens=budget, do_sample=False, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    paging = ContinuousBatchingConfig(page_size=PAGE, num_blocks=batch * -(-longest // PAGE), max_batch_tokens=512,
                                      max_requests_per_batch=batch)
    model.eval()
    t0 = time.perf_counter()
    out = model.generate_batch(inputs=[policy.token_ids(p) for p in prompts], generation_config=config,
                               continuous_batching_config=paging, progress_bar=False)
    seconds["paged"] = time.perf_counter() - t0
    answers = [tok.decode(out[f"req_{i}"].generated_tokens, skip_special_tokens=True) for i in range(len(boards))]
    return {"seconds": seconds, "budget": budget, "same": sum(a == b for a, b in zip(loop, answers, strict=True))}


def steps_of(policy: Policy, boards: list[Instance], answers: list[str], batch: int) -> tuple[int, int]:
    """The decode steps validation takes (each batch runs to its longest answer, eos included; batches as
    `evaluate` makes them) and the tokens it writes: what a batch kept full would need, tokens / rows."""
    prompts = [policy.prompt(b) for b in boards]
    order = sorted(range(len(boards)), key=lambda i: (len(prompts[i]), i))
    budget = [answer_budget(policy, b) for b in boards]
    written = [len(policy.tokenizer(a)["input_ids"]) for a in answers]
    steps = tokens = 0
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        cap = max(budget[i] for i in chunk)
        lengths = [min(written[i] + 1, cap) for i in chunk]
        steps, tokens = steps + max(lengths), tokens + sum(lengths)
    return steps, tokens


class Steps(TrainerCallback):
    """Each optimizer step's seconds and logged loss."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.losses: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._t0)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def grpo(boards: list[Instance], args: Args, path: Decoder) -> Steps:
    """`args.steps + 1` GRPO steps of the shipped tiny policy with the stage's trainer and config, seed 0."""
    policy = load_policy("tiny")
    policy.decoder = path
    steps = Steps()
    with tempfile.TemporaryDirectory() as folder:
        stage = StageArgs(run_id=0, stage_index=1, seed=0, policy="tiny", config=EnvConfig.default(sizes=(5,)),
                          run_dir=Path(folder), run_uuid="bench")
        overrides = dict(max_steps=args.steps + 1, num_generations=args.generations, save_strategy="no",
                         per_device_train_batch_size=args.prompts * args.generations, report_to=[])
        config = grpo_config(stage, overrides, max(answer_budget(policy, b) for b in boards), policy.prompt_style)
        data = dataset(policy, boards)
        cells = {p: (b.num_agents, b.size) for p, b in zip(data["prompt"], boards, strict=True)}
        trainer = Trainer(model=policy.model, reward_funcs=list(REWARDS), args=config, train_dataset=data,
                          processing_class=policy.tokenizer, callbacks=[steps], cell_of=cells,
                          on_cells=lambda _: None, decoder=path)
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    return steps


@contextmanager
def decoding(path: Decoder) -> Iterator[None]:
    """Every policy the lab loads answers through `path` meanwhile (its `generate` and the stage's trainer)."""
    generate_, init = training.policy.Policy.generate, training.stage.Trainer.__init__

    @functools.wraps(generate_)
    def policy_generate(self: Policy, *a: Any, **kw: Any) -> list[str]:
        self.decoder = path
        return generate_(self, *a, **kw)

    @functools.wraps(init)
    def trainer_init(self: Trainer, *a: Any, **kw: Any) -> None:
        init(self, *a, **{**kw, "decoder": path})

    training.policy.Policy.generate, training.stage.Trainer.__init__ = policy_generate, trainer_init
    try:
        yield
    finally:
        training.policy.Policy.generate, training.stage.Trainer.__init__ = generate_, init


def whole_run(args: Args) -> dict[str, Any]:
    """stage_breakdown's small run with each path: its seconds (the mean of its turns) and its parts."""
    import stage_breakdown

    seconds: dict[Decoder, list[float]] = {p: [] for p in PATHS}
    parts: dict[Decoder, dict[str, float]] = {}
    for _ in range(args.repeats):
        for path in PATHS:
            with decoding(path):
                figures = stage_breakdown.main(stage_breakdown.Args(threads=args.threads))
            seconds[path].append(figures["seconds"])
            parts[path] = figures
    return {"seconds": {p: statistics.mean(s) for p, s in seconds.items()}, "parts": parts}


def name(path: Decoder) -> str:
    """A path as the lines name it: transformers' path is `generate`."""
    return "generate" if path == "transformers" else path


def ratio_line(what: str, seconds: dict[Decoder, float], unit: Callable[[float], str] = "{:.2f} s".format) -> str:
    """`what: generate 9.00 s, loop 3.00 s, drafted 2.00 s; ratio 3.00x, 4.50x`: each path's time and generate's
    time over each other path's, in the order of `PATHS`."""
    old, paths = seconds["transformers"], [p for p in PATHS if p in seconds and p != "transformers"]
    times = ", ".join(f"{name(p)} {unit(seconds[p])}" for p in ("transformers", *paths))
    return f"{what}: {times}; ratio " + ", ".join(f"{old / seconds[p]:.2f}x" for p in paths)


def main(args: Args) -> dict[str, float]:
    if args.quick:
        args.boards, args.steps, args.prompts, args.repeats, args.run = 12, 1, 2, 1, False
    torch.set_num_threads(args.threads)
    print(f"tiny policy (shipped), {args.threads} torch thread(s); agents {args.agents}, sizes {args.sizes}; "
          f"each path {args.repeats} turn(s)")
    boards = boards_of(args, args.boards, seed=7)
    checked = validation(load_policy("tiny"), boards, args)
    same = {p: sum(a == b for a, b in zip(checked["answers"]["transformers"], checked["answers"][p], strict=True))
            for p in PATHS[1:]}
    print(ratio_line(f"validation, {len(boards)} boards greedy in batches of {args.batch}", checked["seconds"]) +
          "; answers identical " + ", ".join(f"{same[p]}/{len(boards)}" for p in PATHS[1:]) +
          f"; valid {checked['valid']}/{len(boards)}")
    steps, tokens = steps_of(load_policy("tiny"), boards, checked["answers"]["loop"], args.batch)
    print(f"  {steps} decode steps for {tokens} tokens: {tokens / steps:.1f} rows a step on average of the "
          f"{min(args.batch, len(boards))} a batch starts with; forwards of the model: " +
          ", ".join(f"{name(p)} {checked['forwards'][p]}" for p in PATHS))
    if args.paged:
        cb = paged(load_policy("tiny"), boards, args.batch)
        loop, pages = cb["seconds"]["loop"], cb["seconds"]["paged"]
        print(f"validation, {len(boards)} boards greedy at a budget of {cb['budget']} tokens: transformers' continuous "
              f"batching (generate_batch) {pages:.2f} s, loop {loop:.2f} s; ratio {pages / loop:.2f}x the loop's time; "
              f"answers identical {cb['same']}/{len(boards)}")
    train = boards_of(args, args.prompts * (args.steps + 1), seed=8)
    timed = {path: grpo(train, args, path) for path in PATHS}
    step = {p: statistics.median(t.seconds[1:] or t.seconds) for p, t in timed.items()}
    losses = timed["transformers"].losses, timed["loop"].losses
    gap = max((abs(a - b) for a, b in zip(*losses, strict=True)), default=0.0)
    print(ratio_line(f"GRPO step, {args.prompts} boards x {args.generations} completions (median of {args.steps} "
                     "after a warm-up)", step) +
          f"; loss curves of {len(losses[0])} steps differ by at most {gap:.2g} (loop; drafted samples other "
          "answers from the same distribution)")
    figures = {"validation": checked["seconds"]["transformers"] / checked["seconds"]["loop"],
               "drafted step": step["transformers"] / step["drafted"],
               "drafted": checked["seconds"]["transformers"] / checked["seconds"]["drafted"],
               "same": min(same.values()), "forwards": checked["forwards"], "boards": len(boards),
               "step": step["transformers"] / step["loop"], "loss_gap": gap}
    if args.run:
        run = whole_run(args)
        tokens = {p: sum(v for k, v in run["parts"][p].items() if k.endswith("token generation")) for p in PATHS}
        print(ratio_line("a whole small run (stage 0 evaluated, 16 GRPO steps, evaluated again)", run["seconds"]) +
              "; token generation " + ", ".join(f"{p} {tokens[p]:.1f} s" for p in PATHS))
        figures["run"] = run["seconds"]["transformers"] / run["seconds"]["drafted"]
    return figures


if __name__ == "__main__":
    from flags import parse

    main(parse(Args, __doc__))
