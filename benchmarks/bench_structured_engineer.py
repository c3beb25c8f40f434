"""Gemma 3 270M (base) as the llm engineer, without and with constrained decoding, on the example run.

Run: `OMP_NUM_THREADS=1 python benchmarks/bench_structured_engineer.py [--seeds 5] [--summaries 0] [--max-tokens 384]
[--temperature 0.7] [--threads 1] [--show]`.

The evidence is what the loop gives the engineer (`lab.loop.evidence_for`) after each of the 4 stages of the shipped
example run (assets/example-run.zip, imported into a temporary database): stage results per size, the history, the
paper-best context. After the last stage the summary is taken as if one more stage were to come. Each summary is
asked `--seeds` times (seeds 0, 1, ...), so 4 x 5 = 20 proposals by default (`--summaries N`: after the first N
stages only), and every proposal is asked twice in a row, first free text (`structured=False`, the answer read out
of the text as before) and then held to the answer schema (llguidance), one answer each (`max_attempts=1`), so both
modes see the same machine load. Prints per mode: legal configs out of the proposals, answers the projection had to
adjust (renormalised shares, clamps), seconds per proposal, and tokens per second (the answer's tokens, counted by
re-tokenising it, over the seconds of the whole call, prompt reading included). Nothing is asserted.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without an install

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from lab.context import Evidence  # noqa: E402
from lab.engineers import llm  # noqa: E402
from lab.llm import _load, complete  # noqa: E402
from training.gemma import gemma_checkpoint  # noqa: E402

BACKEND = "hf:gemma3-270m"
EXAMPLE = Path(__file__).resolve().parent.parent / "assets" / "example-run.zip"
MODES = {"free text": False, "constrained": True}


def example_summaries(folder: Path) -> list[Evidence]:
    """The engineer's evidence after each stage of the example run, read back from a database."""
    from sqlmodel import select

    from lab.archive import import_run
    from lab.loop import evidence_for
    from storage.db import make_engine, session, upgrade
    from storage.models import Run, Stage

    engine = make_engine(f"sqlite:///{folder / 'example.db'}")
    upgrade(engine)
    run_id = import_run(engine, EXAMPLE)
    with session(engine) as s:
        run = s.get(Run, run_id)
        stages = sorted(st.index for st in s.exec(select(Stage).where(Stage.run_id == run_id)))
        summaries = [evidence_for(s, run, k) for k in stages]
    return [dataclasses.replace(ev, rounds_left=max(ev.rounds_left, 1)) for ev in summaries]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5, help="proposals per stage summary")
    p.add_argument("--summaries", type=int, default=0, help="ask after the first N stages only (0: every stage)")
    p.add_argument("--max-tokens", type=int, default=384)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--show", action="store_true", help="print every raw answer")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    gemma_checkpoint()  # built once from its package where it is not yet
    tokenizer = _load(BACKEND.removeprefix("hf:"))[1]  # the model `complete` loads, loaded once
    complete(BACKEND, [{"role": "user", "content": "Hello"}], max_tokens=1, temperature=0, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        summaries = example_summaries(Path(tmp))[:args.summaries or None]
    print(f"setup (example run, Gemma load): {time.perf_counter() - t0:.1f} s; "
          f"{len(summaries)} stage summaries x {args.seeds} seeds", flush=True)

    rows: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for evidence in summaries:
        for seed in range(args.seeds):
            for mode, structured in MODES.items():
                t = time.perf_counter()
                answer = llm(evidence, seed=seed, backend=BACKEND, max_attempts=1, max_tokens=args.max_tokens,
                             temperature=args.temperature, structured=structured)
                seconds = time.perf_counter() - t
                tokens = len(tokenizer(answer.raw, add_special_tokens=False)["input_ids"])
                rows[mode].append({"legal": answer.projection is not None, "seconds": seconds, "tokens": tokens,
                                   "adjusted": bool(answer.projection and answer.projection.adjustments),
                                   "error": answer.error})
                status = "legal config" if answer.projection else f"failed ({answer.error[:90]})"
                print(f"after stage {evidence.current.stage_index}, seed {seed}, {mode}: {seconds:.1f} s, "
                      f"{tokens} tokens, {status}", flush=True)
                if args.show:
                    print("  ---\n  " + answer.raw[:1500].replace("\n", "\n  "))

    n = len(rows["free text"])
    print(f"\n{BACKEND} on the example run: {len(summaries)} stage summaries x {args.seeds} seeds = {n} proposals, "
          f"one answer each, at most {args.max_tokens} new tokens, temperature {args.temperature}, "
          f"{args.threads} torch thread(s)")
    print("| mode | legal configs | adjusted by the projection | seconds per proposal (mean, min-max) "
          "| tokens per answer (mean) | tokens per second |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, found in rows.items():
        legal = sum(r["legal"] for r in found)
        seconds = [r["seconds"] for r in found]
        tokens = [r["tokens"] for r in found]
        print(f"| {mode} | {legal} of {n} | {sum(r['adjusted'] for r in found)} of {legal} | "
              f"{np.mean(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f}) | {np.mean(tokens):.0f} | "
              f"{sum(tokens) / sum(seconds):.1f} |")
    for mode, found in rows.items():
        errors = Counter((r["error"] or "").split(": ", 1)[-1][:80] for r in found if not r["legal"])
        print(f"why {mode} answers failed: {dict(errors.most_common(6))}")
    ratio = np.mean([r["seconds"] for r in rows["constrained"]]) / np.mean([r["seconds"] for r in rows["free text"]])
    print(f"constrained / free text, seconds per proposal: {ratio:.2f}")


if __name__ == "__main__":
    main()
