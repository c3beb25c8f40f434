"""The Runs tab: every run, the form that creates one and queues its stage 0, and a run in one file: the open
run exported for download, a downloaded one imported (`lab.archive`, docs/archive.md)."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
from sqlalchemy import Engine

from envsim.config import AGENT_RATIO, KNOB_HELP, KNOBS, ConfigError, EnvConfig, mix_text, project
from envsim.generator import placement
from lab.archive import ArchiveError, export_run, import_archive, read_manifest
from lab.engineers import names
from lab.loop import LoopError, missing_checkpoint
from lab.pages.common import BAD_ROW, KNOB_COLUMNS, Page, config_from_table, config_rows, no_progress, table, when
from lab.pages.tempfiles import EXPORTS, FILES_AGE_S, sweep
from lab.proposals import fill_check
from lab.runs import RunRow, Waiting, new_run, run_list, waiting_proposals
from lab.settings import MAX_BOARDS, SEED
from lab.settings import agent_counts as read_agent_counts
from lab.settings import validation_agents as read_validation_agents
from lab.text import NAME_LIMIT, TEXT_LIMIT, as_text
from storage.settings import MAX_STAGES, NEW_RUN, RunSettings

DECLARED = RunSettings.model_fields  # each setting's declaration: the form's defaults are theirs


def ordered_runs(engine: Engine) -> list[Any]:
    """The lab's own runs newest first, then the runs of experiments: on a first start the example run heads
    the list, not the shipped study's runs imported after it."""
    return sorted(run_list(engine), key=lambda row: row.run.experiment_id is not None)


def run_choices(engine: Engine, ordered: Sequence[RunRow] | None = None) -> list[tuple[str, int]]:
    """The "Open run" dropdown's choices: the lab's own runs newest first, then the experiments'. `ordered`: the
    runs as `ordered_runs` read them already (None: read now)."""
    ordered = ordered_runs(engine) if ordered is None else ordered
    return [(f"#{row.run.id} {row.run.name} ({row.run.status})", row.run.id) for row in ordered]


def runs_table(engine: Engine, ordered: Sequence[RunRow] | None = None,
               waiting: Sequence[Waiting] | None = None) -> dict[str, Any]:
    """Every run, with the proposal that waits for a decision in it (the banner above the tabs links each).
    `ordered` and `waiting`: the runs and the waiting proposals as read already (None: read now)."""
    waiting = {w.run_id: w for w in (waiting_proposals(engine) if waiting is None else waiting)}
    rows = []
    for row in ordered_runs(engine) if ordered is None else ordered:
        r = row.run
        engineer = r.engineer + (f" ({r.engineer_backend})" if r.engineer_backend else "")
        try:
            stages = f"{row.trained}/{r.settings.stages} trained"
            auto = "on" if r.settings.auto_apply else "off"
        except BAD_ROW:  # one run's unreadable settings leave the others' rows as they are
            stages, auto = "? (its settings are unreadable)", "?"
        w = waiting.get(r.id)
        waits = f"proposal #{w.proposal_id} (stage {w.for_stage})" if w else ""
        rows.append([r.id, r.name, r.status, waits, r.policy, engineer, stages, auto, size_text(row.disk),
                     when(r.created_at)])
    return table(["id", "name", "status", "waits for you", "policy", "engineer", "stages", "auto-apply", "disk",
                  "created"], rows)


def size_text(size: int | None) -> str:
    """Bytes for people: `12.3 MB`, `4.1 GB`; empty where there is nothing on disk here."""
    if size is None:
        return ""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def create_run_from_form(engine: Engine, name: str, description: str, policy: str, engineer: str, backend: str,
                         base_url: str, stages: Any, instances: Any, agents: Any, seed: Any, auto_apply: bool,
                         rows: Sequence[Sequence[Any]], agent_counts: str | None = "",
                         validation_agents: str | None = "") -> tuple[str, int | None]:
    """Validate the form, store the run and queue its stage 0; returns (message, new run id or None). The counts are
    checked with the command line's bounds (`lab.settings`), the name and the description by `create_run`; the agent
    counts (`--agent-counts`) and the validation agents (`--validation-agents`) are read as their flags are, and a
    box left empty is a flag not given (the config in force's counts; the default validation agents)."""
    name, description, policy, backend, base_url = ((v or "").strip() for v in (name, description, policy, backend,
                                                                               base_url))  # hidden fields send None
    counts: dict[str, int] = {}
    wrong = []
    for label, value, bounds in (("Training stages", stages, MAX_STAGES),
                                 ("Training instances per stage", instances, MAX_BOARDS), ("Seed", seed, SEED)):
        try:
            counts[label] = bounds.check(value)
        except ValueError as err:
            wrong.append(f"{label}: {err}")
    agent_settings: dict[str, tuple[int, ...]] = {}
    for label, field, text, read in (("Agent counts", "agent_counts", agent_counts, read_agent_counts),
                                     ("Validation agents", "validation_agents", validation_agents,
                                      read_validation_agents)):
        if (text or "").strip():
            try:
                agent_settings[field] = read(text.strip())
            except argparse.ArgumentTypeError as err:
                wrong.append(f"{label}: {err}")
    if wrong:
        return "✗ Not created: " + "; ".join(wrong) + ".", None
    try:
        config = project(config_from_table(rows, agents, instances), strict=True).config
    except ConfigError as err:
        return "✗ The initial config is not valid, nothing was stored: " + "; ".join(err.problems), None
    if (why := fill_check(counts["Seed"], 1)(config)) is not None:
        return f"✗ The initial config cannot be generated, nothing was stored: {why}", None
    try:
        settings = RunSettings.checked(**{**NEW_RUN, "stages": counts["Training stages"],
                                          "auto_apply": bool(auto_apply), "base_url": base_url or None,
                                          **agent_settings})
        run = new_run(engine, name=name or "run", description=description, config=config, settings=settings,
                      policy=policy or "tiny", engineer=engineer, engineer_backend=backend, seed=counts["Seed"])
    except (LoopError, ValueError, TypeError) as err:
        return f"✗ Not created: {err}", None
    return (f"✓ Created run #{run.id} **{as_text(run.name)}**: stage 0 (the starting policy, evaluated on the "
            "validation set) is queued. Follow it in the Train tab."), run.id


def form_check(rows: Sequence[Sequence[Any]], agents: Any, instances: Any, seed: Any) -> tuple[str, bool]:
    """The initial config checked as it is typed, as the first decision checks the config it applies (the
    generator's check for stage 1 with the run's seed, `lab.proposals.fill_check`): why it cannot be stored, or what
    the generator does with it (each agent count only on the sizes that hold it); and whether it can be stored.
    Numbers out of their bounds are left to the create button's answer, which names them."""
    try:
        run_seed = SEED.check(seed)
        config = project(config_from_table(rows, agents, instances), strict=True).config
    except ConfigError as err:
        return "✗ The initial config is not valid: " + "; ".join(err.problems) + ".", False
    except ValueError:
        return "", True
    if (why := fill_check(run_seed, 1)(config)) is not None:
        return f"✗ The initial config cannot be generated: {why}.", False
    notes = placement(config).notes(config)
    return "The generator can draw the stages' boards from this config" + (
        f": {'; '.join(notes)}." if notes else "."), True


def _holds(manifest: dict[str, Any]) -> str:
    """What a run file holds, in a few words."""
    rows = {name: entry["rows"] for name, entry in manifest["tables"].items()}
    text = f"{rows.get('stages', 0)} stages, {rows.get('episodes', 0):,} episodes"
    if manifest["checkpoints"]:
        text += f", {len(manifest['checkpoints'])} checkpoints"
    return text


def export_file(engine: Engine, run_id: Any, checkpoints: bool) -> tuple[str | None, str]:
    """Run `run_id` written to one file (with its stages' checkpoints when asked), for download; returns (the
    file's path or None, message)."""
    if run_id in (None, ""):
        return None, "Open a run first (“Open run” above the tabs)."
    if checkpoints and (why := missing_checkpoint(engine, int(run_id))) is not None:
        return None, f"✗ Not exported with checkpoints: {why}. Export it without them."
    sweep(EXPORTS, FILES_AGE_S)  # the page's download keeps its own copy: older exports are not needed
    path = Path(tempfile.mkdtemp(prefix=EXPORTS)) / f"envlab-run-{int(run_id)}.zip"
    try:
        export_run(engine, int(run_id), path, checkpoints=bool(checkpoints))
    except ArchiveError as err:
        return None, f"✗ Not exported: {err}"
    size = path.stat().st_size / 1e6
    return str(path), (f"✓ Run #{int(run_id)} exported ({_holds(read_manifest(path))}, {size:.1f} MB): download "
                       "it below; `envlab import` or this tab loads it into another lab.")


def import_file(engine: Engine, path: str | None, uploaded: bool = False) -> tuple[str, int | None]:
    """Load a run file into this lab with new ids; returns (message, the new run id or None). An `uploaded` file
    is deleted once read, imported or not: the server keeps no copy of what it was sent."""
    if not path:
        return "Choose a run file (.zip, from “Export this run” or `envlab export`).", None
    name = Path(path).name
    try:
        manifest = read_manifest(path)
        imported = import_archive(engine, path)
    except ArchiveError as err:  # said of the file by its name: where the server keeps uploads is nobody's business
        said = str(err).replace(str(Path(path)), name).replace(str(Path(path).parent), "")
        return f"✗ Not imported: {said}", None
    finally:
        if uploaded:
            Path(path).unlink(missing_ok=True)
    return (f"✓ {as_text(name)} imported as run #{imported.run_id} **{as_text(manifest['run']['name'])}** "
            f"({_holds(manifest)})"
            f"{imported.note()}; it is open above."), imported.run_id


@dataclass(eq=False)
class RunsTab:
    """The tab's widgets; `form` is the create form's inputs, in `create_run_from_form`'s order; `upload` takes
    a run file to import (wired in app.py, as an import opens the new run above the tabs)."""

    table: gr.Dataframe
    form: list[Any]
    create: gr.Button
    message: gr.Markdown
    upload: gr.File
    import_message: gr.Markdown
    check: gr.Markdown | None = None  # the initial config checked as it is typed (`form_check`)

    def checked(self, rows: Any, agents: Any, instances: Any, seed: Any) -> dict[Any, Any]:
        """The form's check as it is typed: its line, and the create button held while the config cannot be stored."""
        text, ok = form_check(rows or [], agents, instances, seed)
        return {self.check: text, self.create: gr.update(interactive=ok)}


def build(page: Page) -> RunsTab:
    knob_help = " ".join(f"**{k}**: {v}." for k, v in KNOB_HELP.items() if k in (*KNOBS, AGENT_RATIO))
    default = EnvConfig.default()
    runs_df = gr.Dataframe(label="Runs (newest first); pick one in “Open run” above", interactive=False,
                           elem_id="runs-table")
    upload, import_message = _archive_widgets(page)
    with gr.Accordion("New run", open=True):
        with gr.Row():
            name = gr.Textbox(label="Name", value="my run", elem_id="new-name", max_length=NAME_LIMIT)
            policy = gr.Textbox(label="Policy", value="tiny",
                                info="`tiny` (ships in assets/, trains on a CPU), `gemma3-270m`, a "
                                     "checkpoint folder or a Hugging Face model name")
            engineer = gr.Dropdown(label="Engineer", choices=names(alone=True), value="heuristic",
                                   elem_id="new-engineer")
            backend = gr.Textbox(label="LLM backend", placeholder="hf:policy", visible=False,
                                 info="hf:policy (the policy itself, as in the paper), hf:gemma3-270m, "
                                      "or openai:<model> with a server URL")
            base_url = gr.Textbox(label="Server URL (openai backend)", visible=False,
                                  placeholder="http://localhost:8000/v1")
        with gr.Row():
            # No `minimum=` nor `precision=0`: Gradio would refuse a 0 in a line that names no field, and round 1.5 to
            # 2 unsaid; the form's check names the field and its range.
            stages = gr.Number(label="Training stages", value=NEW_RUN["stages"])
            instances = gr.Number(label="Training instances per stage", value=default.num_instances)
            agents = gr.Textbox(label="Agents per training board (count=share, e.g. 2=0.5, 3=0.5)",
                                value=mix_text(default.agent_ratio), max_lines=1)
            seed = gr.Number(label="Seed", value=0)
            auto = gr.Checkbox(label="Auto-apply proposals (no review)", value=DECLARED["auto_apply"].default)
        with gr.Row():
            counts = gr.Textbox(label="Agent counts the engineer may use (e.g. 2,3,4)", max_lines=1,
                                placeholder="the initial config's", elem_id="new-agent-counts",
                                info="the counts an engineer may put in a stage's agent mix (--agent-counts)")
            validation = gr.Textbox(label="Validation agents (e.g. 3,4,5)", max_lines=1,
                                    value=",".join(map(str, DECLARED["validation_agents"].default)),
                                    elem_id="new-validation-agents",
                                    info="the agent counts of the validation and dev boards, each on sizes "
                                         "max(3, K)..10 (--validation-agents)")
        description = gr.Textbox(label="Description (optional)", lines=1, max_length=TEXT_LIMIT)
        gr.Markdown(f"Initial config (stage 0 and the round-0 default), one row per map size. {knob_help}")
        config_df = gr.Dataframe(value=config_rows(default), headers=KNOB_COLUMNS, type="array", interactive=True,
                                 elem_id="new-config", label="Initial config")
        check = gr.Markdown(elem_id="new-config-check")
        create = gr.Button("Create run and queue stage 0", variant="primary", elem_id="create-run")
        message = gr.Markdown(elem_id="create-msg")

    def show_backend(chosen: str) -> dict[Any, Any]:
        return {backend: gr.update(visible=chosen == "llm"), base_url: gr.update(visible=chosen == "llm")}

    engineer.select(show_backend, engineer, [backend, base_url], trigger_mode="always_last")
    form = [name, description, policy, engineer, backend, base_url, stages, instances, agents, seed, auto, config_df,
            counts, validation]
    tab = RunsTab(runs_df, form, create, message, upload, import_message, check)
    gr.on([config_df.input, agents.input, instances.input, seed.input], tab.checked,
          [config_df, agents, instances, seed], [check, create], trigger_mode="always_last", **no_progress(page))
    return tab


def _archive_widgets(page: Page) -> tuple[gr.File, gr.Markdown]:
    """The accordion that exports the open run and imports a run file; returns the import's widgets."""
    with gr.Accordion("A run in one file: export, import", open=True, elem_id="archive"), gr.Row():
        with gr.Column():
            gr.Markdown("**Export this run**: the open run's rows (stages, proposals, decisions, episodes, "
                        "logs) in one .zip file (docs/archive.md).")
            with gr.Row():
                checkpoints = gr.Checkbox(label="with checkpoints (the trained stages' weights)", value=False,
                                          elem_id="export-checkpoints")
                export = gr.Button("Export this run", scale=0, min_width=180, elem_id="export-run")
            exported = gr.File(label="The run file", interactive=False, visible=False, elem_id="export-file")
            export_message = gr.Markdown(elem_id="export-msg")
        with gr.Column():
            gr.Markdown("**Import a run**: a file from “Export this run” or `envlab export`; it gets new ids here.")
            upload = gr.File(label="Run file (.zip)", file_types=[".zip"], type="filepath", elem_id="import-file")
            import_message = gr.Markdown(elem_id="import-msg")

    def export_clicked(run_id: Any, with_checkpoints: bool) -> dict[Any, Any]:
        path, text = export_file(page.engine, run_id, with_checkpoints)
        return {exported: gr.update(value=path, visible=path is not None), export_message: text}

    export.click(export_clicked, [page.run_pick, checkpoints], [exported, export_message])
    return upload, import_message
