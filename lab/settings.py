"""The command line's and the page's side of a run's settings (`storage.settings.RunSettings`, the typed record):
the flags every command that creates runs takes (`settings_arguments`, each `dest` a field's name, read back by
`settings_from_args`), and the bounds of the counts a person types (`Count`), one bound for every way in.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from envsim.suite import DEV_PER_SIZE
from storage.settings import RunSettings


@dataclass(frozen=True)
class Count:
    """A whole number from `low` to `high`, one bound for every way in: argparse calls it with the text of a flag
    (`type=`), a page's number box goes through `check`. A number out of range is refused saying why the bound is
    where it is (`why` above, `too_few` below), in the same words on both."""

    low: int
    high: int
    why: str
    too_few: str = ""

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(self._not_whole(repr(text))) from None
        if (why := self.refusal(value)) is not None:
            raise argparse.ArgumentTypeError(why)
        return value

    def check(self, value: Any) -> int:
        """A number box's value (None when it is empty; a float, since a box that rounds would hide a fraction)
        as a whole number in range; a ValueError with `refusal`'s words otherwise."""
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value // 1:
            shown = "nothing" if value in (None, "") else f"{value:g}" if isinstance(value, float) else repr(value)
            raise ValueError(self._not_whole(shown))
        if (why := self.refusal(int(value))) is not None:
            raise ValueError(why)
        return int(value)

    def refusal(self, value: int) -> str | None:
        """Why `value` is out of range, None when it is in."""
        if value < self.low:
            return f"{value:,} is less than {self.low}" + (f": {self.too_few}" if self.too_few else "")
        if value > self.high:
            return f"{value:,} is more than {self.high:,}: {self.why}"
        return None

    def _not_whole(self, shown: str) -> str:
        return f"{shown} is not a whole number from {self.low} to {self.high:,}"


# The bounds of the counts a run takes on the command line and in the page's form, each with why it is where it is.
MAX_STAGES = Count(1, 1000, "each stage trains and evaluates the policy (minutes to hours); run again from "
                            "the last stage's checkpoint for more", "a run trains at least 1 stage")
MAX_BOARDS = Count(1, 100_000, "a config's num_instances is at most 100,000 boards per stage",
                   "a stage trains on at least 1 board")
VALIDATION_BOARDS = Count(1, 100_000, "more boards than a validation set of 10,000 per size holds",
                          "evaluate on at least 1 board")
PER_SIZE = Count(1, 10_000, "10,000 boards per size is 80,000 boards to evaluate after every stage",
                 "a size needs at least 1 validation board")
DEV_BOARDS = Count(3, 10_000, "10,000 boards per size is 80,000 boards to evaluate after every stage",
                   "the dev split needs at least 3 boards per size (one per wait subset)")
COMPLETION_TOKENS = Count(1, 32768, "longer than any chat model here answers; a plan needs far fewer tokens",
                          "an answer needs at least 1 token")
LORA_RANK = Count(0, 4096, "a LoRA rank above a model's width adds nothing (Gemma 3 270M: 640)")
SEED = Count(0, 2**31 - 1, "a run's seed is stored in a 32-bit column (PostgreSQL's integer)",
             "numpy's generators take no negative seed")


def settings_arguments(parser: argparse.ArgumentParser, *, experiment: bool = False) -> None:
    """The flags of a run's settings, for every command that creates runs; each `dest` is a RunSettings field.
    `experiment`: the flags of `envlab experiment new` (its runs always auto-apply; the context is each arm's)."""
    from lab.context import CONTEXT_PRESETS, DEFAULT_PRESET  # here: the presets' names, for the flag's choices

    parser.add_argument("--stages", type=MAX_STAGES, default=3)
    parser.add_argument("--base-url", help="base URL of an OpenAI-compatible server (openai: backends)")
    parser.add_argument("--lora", type=LORA_RANK, default=0, metavar="RANK",
                        help="train LoRA adapters of this rank (needs peft), e.g. 16 for a large policy; 0: every "
                             "weight")
    parser.add_argument("--validation-boards", type=VALIDATION_BOARDS, metavar="N",
                        help="evaluate each stage on N of the validation boards, spread over the sizes (default: all)")
    parser.add_argument("--validation-per-size", type=PER_SIZE, metavar="N", default=120 if experiment else None,
                        help="validation boards per map size (e.g. 120: 960 boards; 30: the standard 240; default "
                             f"{120 if experiment else 30})")
    parser.add_argument("--keep-checkpoints", action="store_true", default=None,
                        help="keep TRL's intermediate checkpoints (checkpoint-*/) of every stage; by default a "
                             "finished stage keeps only its final weights")
    parser.add_argument("--allow-cpu", action="store_true", default=None,
                        help="let a worker without a GPU run a large pretrained policy (see ENVLAB_GPU_ABOVE)")
    parser.add_argument("--dev-per-size", type=DEV_BOARDS, default=DEV_PER_SIZE, metavar="N",
                        help=f"dev boards per map size, evaluated after each stage: what the engineers read, never the "
                             f"validation boards (a multiple of 3; default {DEV_PER_SIZE})")
    parser.add_argument("--thinking", choices=("off", "on"), default=None,
                        help="a chat template's thinking mode (Qwen3's enable_thinking) in every prompt (default off)")
    parser.add_argument("--completion-length", type=COMPLETION_TOKENS, metavar="TOKENS",
                        help="new tokens per answer in training, validation, the benchmark and probes (default: 512 "
                             "for a chat policy, by board size for a compact one)")
    parser.add_argument("--validation-decoding", choices=("greedy", "sampled"), default=None,
                        help="how validation and the benchmark decode: greedy, or sampled with the model's own "
                             "generation_config (default greedy)")
    if experiment:
        return
    parser.add_argument("--auto-apply", action="store_true", default=None,
                        help="apply every proposal without waiting for a person")
    parser.add_argument("--context", dest="context_preset", default=DEFAULT_PRESET, choices=list(CONTEXT_PRESETS),
                        help="the llm engineer's context preset (docs/engineers.md)")
    parser.add_argument("--remeasure", action="store_true", default=None,
                        help="the llm engineer probes its answer on the policy and is asked once more where a size "
                             "it changed measures too easy or too hard (docs/engineers.md)")
    parser.add_argument("--probe-boards", type=int, metavar="B", help="boards per size in a probe (Measure, the llm "
                                                                       "engineer's measured context; default 8)")
    parser.add_argument("--probe-answers", type=int, metavar="K",
                        help="sampled answers per board in a probe (default 8)")


def settings_from_args(args: argparse.Namespace, **values: Any) -> RunSettings:
    """The settings of a command's flags (`settings_arguments`: every flag whose `dest` is a field's name and that
    was given), with `values` on top. `--grpo` collects KEY=VALUE pairs that the command parses (with its
    scenario's): it arrives in `values`."""
    given = {name: getattr(args, name) for name in RunSettings.model_fields
             if name != "grpo" and getattr(args, name, None) is not None}
    return RunSettings.checked(**{**given, **values})
