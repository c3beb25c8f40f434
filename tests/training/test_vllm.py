"""vLLM's code paths that run without vLLM: TRL's fields for colocate and server mode, the `trl vllm-serve` command,
the worker's server lifecycle (a stand-in server process answers `/health`: vLLM needs CUDA, which this machine
lacks), the weight-sync link closed after a stage, sampling settings for evaluation, and the fallback to
transformers where vLLM is not installed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlmodel import select

import training.settings
from envsim.config import EnvConfig
from lab.jobs.worker import InChild, WorkerOptions, run_worker
from lab.loop import create_run
from storage.db import make_engine, session, upgrade
from storage.models import Job, JobStatus
from storage.settings import RunSettings
from training import vllm
from training.policy import TINY_DIR
from training.stage import StageArgs, grpo_config

# A stand-in for `trl vllm-serve`: an HTTP server on the given port whose /health answers 200, in a process that
# starts a child of its own (as vLLM starts its engine core), so stopping must end the whole process group.
FAKE_SERVER = """
import http.server, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def fake_command(model: str, port: int) -> list[str]:
    return [sys.executable, "-c", FAKE_SERVER, str(port)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split()[2] != "Z"


@pytest.fixture(autouse=True)
def no_server():
    yield
    vllm.stop_server()


def test_colocate_and_server_mode_fields_for_trl():
    assert vllm.vllm_fields({"learning_rate": 1e-6}) == {"learning_rate": 1e-6}  # no vLLM asked: untouched
    assert vllm.vllm_fields({"use_vllm": True}) == {"use_vllm": True, "vllm_mode": "colocate",
                                                   "vllm_gpu_memory_utilization": 0.3, "vllm_enable_sleep_mode": True}
    own = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.5}
    assert vllm.vllm_fields(own)["vllm_gpu_memory_utilization"] == 0.5  # the run's own value stays
    server = {"use_vllm": True, "vllm_mode": "server"}
    assert vllm.vllm_fields(server, "http://127.0.0.1:9") == {**server, "vllm_server_base_url": "http://127.0.0.1:9"}
    given = {**server, "vllm_server_base_url": "http://gpu-box:8000"}
    assert vllm.vllm_fields(given, "http://127.0.0.1:9") == given


def test_a_colocated_engine_gets_a_context_of_the_longest_prompt_plus_the_completion(empty_lab, tmp_path: Path):
    """Left to the model's config, a colocated engine sizes its KV cache for every position (Qwen3: 40,960, about
    6 GB for 4B): the stage gives it its longest prompt, as TRL tokenizes the stage's prompts, plus its completion
    budget. Server mode's engine is the worker's server, sized where it starts; the run's own value stays."""
    assert vllm.vllm_fields({"use_vllm": True, "max_completion_length": 512}, longest_prompt=300)[
        "vllm_max_model_length"] == 812
    assert "vllm_max_model_length" not in vllm.vllm_fields(
        {"use_vllm": True, "vllm_mode": "server", "max_completion_length": 512}, longest_prompt=300)
    assert vllm.vllm_fields({"use_vllm": True, "max_completion_length": 512, "vllm_max_model_length": 4096},
                            longest_prompt=300)["vllm_max_model_length"] == 4096
    from training.policy import load_policy
    from training.stage import trainer_for

    config = EnvConfig.default(sizes=(3, 5), num_instances=4)
    grpo = {"use_vllm": True, "vllm_mode": "colocate", "num_generations": 2, "per_device_train_batch_size": 4}
    args = StageArgs(run_id=0, stage_index=1, seed=0, policy="tiny", config=config, run_dir=tmp_path, run_uuid="u",
                     settings=RunSettings(stages=1, grpo=grpo))
    trainer, _, _ = trainer_for(empty_lab, args, load_policy("tiny"), lambda *a, **k: False)
    longest = max(len(trainer.processing_class(p)["input_ids"]) for p in trainer.train_dataset["prompt"])
    assert trainer.args.vllm_max_model_length == longest + trainer.args.max_completion_length
    assert 0 < longest < trainer.args.vllm_max_model_length < 1024  # the tiny policy's boards, not 40,960


def test_without_vllm_a_stage_that_asks_for_it_generates_with_transformers(tmp_path: Path, caplog):
    args = StageArgs(run_id=0, stage_index=1, seed=0, policy="", config=EnvConfig.default(), run_dir=tmp_path,
                     run_uuid="u")
    config = grpo_config(args, {"use_vllm": True, "vllm_mode": "colocate"}, 16, "chat")
    assert config.use_vllm is False and "vLLM is not installed" in caplog.text
    assert not vllm.available()


def test_the_serve_command_and_evaluation_sampling():
    command = vllm.serve_command("/runs/u/stage-1/policy", 8123, gpu_memory_utilization=0.8)
    assert Path(command[0]).name == "trl" and command[1:] == [
        "vllm-serve", "--model", "/runs/u/stage-1/policy", "--host", "127.0.0.1", "--port", "8123",
        "--gpu_memory_utilization", "0.8"]
    assert vllm.sampling_kwargs(64, sampled=False, seed=3) == {"max_tokens": 64, "seed": 3,
                                                               "skip_special_tokens": True, "temperature": 0.0}
    qwen3 = SimpleNamespace(temperature=0.6, top_k=20, top_p=0.95)  # Qwen3's own generation_config
    assert vllm.sampling_kwargs(64, sampled=True, seed=3, min_tokens=8, generation_config=qwen3) == {
        "max_tokens": 64, "seed": 3, "skip_special_tokens": True, "min_tokens": 8, "temperature": 0.6,
        "top_k": 20, "top_p": 0.95}


def test_the_workers_server_lives_across_stages_and_stops_with_its_process_group():
    server = vllm.ensure_server("model-a", command=fake_command)
    assert server.healthy() and server.url == f"http://127.0.0.1:{server.port}"
    assert os.environ[vllm.SERVER_URL_SETTING] == server.url  # the stages it runs find it here
    child = int(server.process.stdout.readline())
    assert vllm.ensure_server("model-a") is server  # the next stage of the same policy: the same server
    other = vllm.ensure_server("model-b", command=fake_command)
    assert other is not server and not server.running()  # another policy: the old server is stopped
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)  # with its whole process group
    vllm.stop_server()
    assert not other.running() and vllm.SERVER_URL_SETTING not in os.environ


def test_a_server_that_dies_before_it_is_ready_says_what_it_printed():
    command = [sys.executable, "-c", "print('CUDA error: no kernel image'); raise SystemExit(3)"]
    with pytest.raises(vllm.VLLMError, match=r"exited with 3 before it was ready: CUDA error: no kernel image"):
        vllm.Server("m", command, vllm.free_port()).start(timeout=30)


def test_a_stage_closes_its_weight_sync_link():
    closed = []
    client = SimpleNamespace(base_url="http://127.0.0.1:9", close_communicator=lambda: closed.append(True))
    vllm.close_link(SimpleNamespace(vllm_generation=SimpleNamespace(vllm_client=client)))
    assert closed == [True]
    vllm.close_link(SimpleNamespace())  # colocate or transformers: nothing to close


def test_the_worker_hook_serves_only_stages_that_ask_for_a_server(tmp_path: Path, monkeypatch):
    engine = make_engine(f"sqlite:///{tmp_path / 'envlab.db'}")
    upgrade(engine)
    monkeypatch.setattr(vllm, "available", lambda: True)  # as on a GPU with vLLM installed
    monkeypatch.setattr(training.settings, "installed", lambda package: True)
    with session(engine) as s:
        run = create_run(s, name="server", config=EnvConfig.default(sizes=(3,), num_instances=8),
                         settings=RunSettings(stages=1, grpo={"use_vllm": True, "vllm_mode": "server"}))
    served: list[str] = []
    monkeypatch.setattr(vllm, "ensure_server",
                        lambda model, gpus=None: served.append(model) or SimpleNamespace(url="http://x:1"))
    seen: list[str | None] = []

    def stage(engine, job, progress):
        seen.append(job.kind)
        return {}

    run_worker(engine, {"stage": stage}, WorkerOptions(once=True, poll_s=0.01))
    assert served == [str(TINY_DIR)] and seen == ["stage"]  # the run's policy's folder, served before its stage
    with session(engine) as s:
        job = s.exec(select(Job).where(Job.run_id == run.id)).one()
    assert job.status == JobStatus.DONE and "the worker's vLLM server for this run's policy: http://x:1" in job.log_tail
    engine.dispose()


def test_server_mode_gets_gpus_of_its_own_and_a_group_port_of_its_own(tmp_path: Path, monkeypatch):
    assert vllm.split_for_server(["0", "1", "2"]) == (("0", "1"), ("2",))  # the last serves, the rest train
    assert vllm.split_for_server(["0", "1", "2", "3"], ["3"]) == (("0", "1", "2"), ("3",))
    assert vllm.split_for_server([]) == ((), ())  # no CUDA here: nothing to split
    with pytest.raises(vllm.VLLMError, match="server mode needs a GPU of its own beside the training ones, and this "
                                             "worker owns GPU 0 only: use vllm_mode colocate"):
        vllm.split_for_server(["0"])
    with pytest.raises(vllm.VLLMError, match="--vllm-gpus 0,1 leaves no GPU of 0,1 to train on"):
        vllm.split_for_server(["0", "1"], ["0", "1"])
    first = vllm.ensure_server("model-a", "1", command=fake_command)
    assert first.gpus == "1" and int(os.environ[vllm.GROUP_PORT_SETTING]) > 0
    fields = vllm.vllm_fields({"use_vllm": True, "vllm_mode": "server"})
    assert (fields["vllm_server_base_url"], fields["vllm_group_port"]) == (first.url,
                                                                          int(os.environ[vllm.GROUP_PORT_SETTING]))
    assert vllm.ensure_server("model-a", "2", command=fake_command) is not first  # other devices: another server
    vllm.stop_server()
    assert vllm.GROUP_PORT_SETTING not in os.environ

    engine = make_engine(f"sqlite:///{tmp_path / 'envlab.db'}")
    upgrade(engine)
    monkeypatch.setattr(vllm, "available", lambda: True)  # as on a GPU with vLLM installed
    monkeypatch.setattr(training.settings, "installed", lambda package: True)
    with session(engine) as s:
        create_run(s, name="server", config=EnvConfig.default(sizes=(3,), num_instances=8),
                   settings=RunSettings(stages=1, grpo={"use_vllm": True, "vllm_mode": "server"}))
    run_worker(engine, {"stage": InChild("tests.child_jobs:answer")}, WorkerOptions(once=True, poll_s=0.01, gpus=["0"]))
    with session(engine) as s:
        job = s.exec(select(Job)).one()
    assert (job.status, job.error) == (JobStatus.FAILED, "training.vllm.VLLMError: server mode needs a GPU of its own "
                                       "beside the training ones, and this worker owns GPU 0 only: use vllm_mode "
                                       "colocate (the one-GPU way), or give the worker two GPUs")
    engine.dispose()


def test_a_stage_run_in_the_workers_own_process_gets_a_server_on_a_gpu_it_does_not_train_on(tmp_path: Path,
                                                                                              monkeypatch):
    """`envlab worker --in-process` on GPUs 0 and 1: the server goes on GPU 1, the stage trains on GPU 0; on one GPU
    the stage fails saying why, as a stage in a child process does, instead of sharing the device with the server."""
    engine = make_engine(f"sqlite:///{tmp_path / 'envlab.db'}")
    upgrade(engine)
    monkeypatch.setattr(vllm, "available", lambda: True)  # as on a GPU with vLLM installed
    monkeypatch.setattr(training.settings, "installed", lambda package: True)
    served: list[str | None] = []
    monkeypatch.setattr(vllm, "ensure_server",
                        lambda model, gpus=None: served.append(gpus) or SimpleNamespace(url="http://x:1"))

    def stage(engine, job, progress):
        return {}

    for gpus in (["0", "1"], ["0"]):
        with session(engine) as s:
            create_run(s, name=f"on {len(gpus)}", config=EnvConfig.default(sizes=(3,), num_instances=8),
                       settings=RunSettings(stages=1, grpo={"use_vllm": True, "vllm_mode": "server"}))
        run_worker(engine, {"stage": stage}, WorkerOptions(once=True, poll_s=0.01, gpus=gpus))
    with session(engine) as s:
        two, one = s.exec(select(Job).order_by(Job.id)).all()
    assert served == ["1"] and two.status == JobStatus.DONE
    assert (one.status, one.error) == (JobStatus.FAILED, "training.vllm.VLLMError: server mode needs a GPU of its own "
                                       "beside the training ones, and this worker owns GPU 0 only: use vllm_mode "
                                       "colocate (the one-GPU way), or give the worker two GPUs")
    engine.dispose()
