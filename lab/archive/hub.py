"""A trained stage to the Hugging Face Hub (`envlab push`): its policy folder and a model card, as one folder.

The card says how the policy came to be, from what the lab stores and computes already: the policy the run
started from, the config timeline with who set each value (`lab.runs.config_timeline`, the Stage review tab's),
every decision (`lab.proposals.proposal_states`), each stage's validation rates
(`lab.results.stage_summaries`, pooled as everywhere, docs/results.md) and the benchmark tables of the stages
evaluated on it (`lab.runs.benchmark_report`, with the hash of their boards). Nothing here computes a number of its own.

A card is public: who decided, the notes they kept and this machine's paths (a policy or an engineer's model loaded
from a folder) stay out of it unless the push asks for them (`with_notes`, `envlab push --with-notes`).

The folder is `<run folder>/hub/stage-<k>/`, made anew on each push; the checkpoint's files are hard links where the
filesystem allows (a large policy is not copied), else copies. Uploading is `HfApi().create_repo(exist_ok=True)` and
`upload_folder`, with the token `huggingface_hub` finds (`HF_TOKEN`, or `hf auth login`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sqlalchemy import Engine

from lab.loop import missing_checkpoint, stages_of
from lab.proposals import proposal_states
from lab.results import stage_summaries
from lab.runs import ConfigStep, benchmark_checkpoints, benchmark_report, config_timeline
from storage.db import UnsafePath, checkpoint_of, run_folder, session
from storage.models import Run, Stage, StageStatus

CARD_HEADER = "---\nlibrary_name: transformers\ntags:\n- envlab\n- mapf-frozenlake\n- grpo\n---\n"


class PushError(RuntimeError):
    """A stage that cannot be pushed, or an upload that failed: the message says why in one line."""


def pushed_stage(engine: Engine, run_id: int, stage_index: int | None) -> tuple[Run, Stage, Path]:
    """The run, the stage to push (`stage_index`, else its last finished trained stage) and its checkpoint folder."""
    with session(engine) as s:
        run, stages = s.get(Run, run_id), stages_of(s, run_id)
    if run is None:
        raise PushError(f"no run {run_id} in this database")
    done = [stage for stage in stages if stage.status == StageStatus.DONE and stage.index > 0]
    if stage_index is None:
        if not done:
            raise PushError(f"run {run_id} has no trained stage yet (stage 0 is its starting policy, {run.policy})")
        stage_index = done[-1].index
    stage = next((stage for stage in stages if stage.index == stage_index), None)
    if stage is None or stage_index == 0:
        raise PushError(f"run {run_id} has no stage {stage_index}" if stage is None else
                        f"stage 0 of run {run_id} is its starting policy ({run.policy}), not trained by the run")
    if stage.status != StageStatus.DONE:
        raise PushError(f"stage {stage_index} of run {run_id} is {stage.status}: only a finished stage is pushed")
    if (why := missing_checkpoint(engine, run_id, stage_index)) is not None:
        raise PushError(why)
    return run, stage, Path(checkpoint_of(engine, stage))


def _cell(value: object) -> str:
    """Text for a Markdown table cell: one line, no column breaks."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _changes(step: ConfigStep) -> str:
    if step.stage_index == 0:
        return f"`{step.config.model_dump_json()}`"
    return "; ".join(f"{c.field} {c.old:.4g} → {c.new:.4g} ({step.set_by[c.field]})" for c in step.changes) or \
        "no value changed"


def _local(spec: str) -> bool:
    """Whether a policy or model spec names a folder on this machine (not a name such as `tiny` or `Qwen/Qwen3-4B`)."""
    return spec.startswith(("/", "~", ".")) or Path(spec).exists()


def _spec(spec: str, with_notes: bool) -> str:
    """A policy or model spec as the card shows it: a folder of this machine only `with_notes`."""
    return f"`{spec}`" if with_notes or not _local(spec) else "a local folder (its path left out)"


def model_card(engine: Engine, run: Run, stage: Stage, repo: str, with_notes: bool = False) -> str:
    """The README.md of the pushed folder: the Hub's YAML header, then how the policy came to be (the stages up to
    `stage` and the decisions that led to them). Who decided, their notes and this machine's paths only
    `with_notes`."""
    backend = run.engineer_backend
    if backend:
        kind, _, name = backend.partition(":")
        backend = f"`{backend}`" if with_notes or not _local(name) else f"`{kind}:` a local folder (its path left out)"
    engineer = f"`{run.engineer}`" + (f" (backend {backend})" if backend else "")
    lines = [CARD_HEADER, f"# {repo}", "",
             f"Stage {stage.index} of envlab run #{run.id} `{run.name}`: a policy trained with GRPO (TRL) in stages on "
             "MAPF-FrozenLake. After each stage an environment engineer proposed the next stage's environment "
             "config, and a person (or the run itself, auto-apply) decided on it.", "",
             f"- Started from: {_spec(run.policy, with_notes)}", f"- Engineer: {engineer}", f"- Run seed: {run.seed}",
             "",
             "## Config timeline", "",
             "Each stage's config as it trained: stage 0's whole, then each value that changed from the stage before "
             "and who set it (engineer: proposed and accepted; person: a person's edit; auto-apply: applied by the "
             "run itself).", "", "| stage | config from | changed |", "| --- | --- | --- |"]
    lines += [f"| {step.stage_index} | {_cell(step.source if with_notes else step.origin)} | {_cell(_changes(step))} |"
              for step in config_timeline(engine, run.id) if step.stage_index <= stage.index]
    headers = ["proposal", "after stage", "engineer", "decision", *(("by", "note") if with_notes else ())]
    lines += ["", "## Decisions", "", "| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    for p in reversed(proposal_states(engine, run.id)):
        if p.decision is not None and p.proposal.after_stage < stage.index:
            said = (p.decision.user, p.decision.note) if with_notes else ()
            cells = [f"#{p.proposal.id}", p.proposal.after_stage, p.proposal.engineer, p.decision.action, *said]
            lines.append("| " + " | ".join(map(_cell, cells)) + " |")
    return "\n".join(lines + _rates(engine, run, stage)) + "\n"


def _rates(engine: Engine, run: Run, stage: Stage) -> list[str]:
    """The card's validation rates per stage, and the benchmark tables of the stages evaluated on it."""
    with session(engine) as s:
        summaries = stage_summaries(s, run.id)
    lines = ["", "## Validation", "", "Valid and optimal rates over each stage's validation episodes, pooled over map "
             "sizes.", "", "| stage | valid | optimal | episodes |", "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {t.valid_rate:.1%} | {t.optimal_rate:.1%} | {t.episodes} |"
              for k, t in ((k, summaries[k].pooled) for k in sorted(summaries) if k <= stage.index)]
    lines += ["", "## Benchmark", ""]
    stages = [k for run_id, k, _ in benchmark_checkpoints(engine) if run_id == run.id and k <= stage.index]
    if not stages:
        return [*lines, "No stage of this run was evaluated on the 3,150-board benchmark."]
    for k in stages:
        report = benchmark_report(engine, run.id, k)
        lines += [f"Stage {k}, on the boards with sha256 `{report.boards}` (`envlab bench-suite` prints it); the "
                  "mean over map sizes as the paper reports it:", "", report.to_markdown(), ""]
    return lines[:-1]


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_folder(engine: Engine, run_id: int, stage_index: int | None, repo: str, with_notes: bool = False) -> Path:
    """The folder to upload, made anew: the stage's checkpoint files and the model card (`model_card`; who decided,
    their notes and local paths only `with_notes`)."""
    run, stage, checkpoint = pushed_stage(engine, run_id, stage_index)
    try:
        folder = run_folder(engine, run.uuid) / "hub" / f"stage-{stage.index}"
    except UnsafePath as err:
        raise PushError(str(err)) from None
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(checkpoint, folder, copy_function=_link_or_copy)
    (folder / "README.md").unlink(missing_ok=True)  # a link into the checkpoint: never written through
    (folder / "README.md").write_text(model_card(engine, run, stage, repo, with_notes))
    return folder


def upload(folder: Path, repo: str) -> str:
    """`folder` to the Hub model repo `repo` (made when missing); its URL. A missing token, a refusal or a network
    error is a `PushError` in one line."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.errors import HTTPError

    if get_token() is None:
        raise PushError("no Hugging Face token: set HF_TOKEN or run `hf auth login` (--dry-run writes the folder only)")
    api = HfApi()
    try:
        url = api.create_repo(repo, exist_ok=True)
        api.upload_folder(repo_id=repo, folder_path=folder, commit_message=f"envlab push: {folder.name}")
    except (OSError, HTTPError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PushError(f"the upload to {repo} failed: {first}") from None
    return str(url)
