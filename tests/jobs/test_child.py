"""A job in a process of its own (`lab.jobs.worker.run_child`, `lab.jobs.child`): Cancel ends its whole process group, a
child that dies is a failed attempt with its stderr's last lines, and a stage run there stores what it stores in
the worker's own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from sqlmodel import select

from envsim.config import EnvConfig
from lab.jobs.worker import (
    ACCELERATE_CONFIGS,
    InChild,
    WorkerOptions,
    child_command,
    child_env,
    handlers,
    run_child,
    run_worker,
    split_gpus,
    stage_needs_fsdp,
    warm_children,
)
from lab.jobs.zygote import import_key
from lab.loop import LoopError, after_job, create_run, prune_checkpoints
from lab.runs import disk_use
from storage import queue
from storage.db import make_engine, run_folder, session, upgrade
from storage.models import Episode, Job, JobKind, JobStatus, Run, Stage, StageStatus
from storage.settings import RunSettings
from training.resolve import policy_params, resolve_policy

CONFIG = EnvConfig.default(sizes=(3, 4), num_instances=4)
ROOT = Path(__file__).resolve().parents[2]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie waiting for its parent (or for init) to collect it has ended
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def _claimed(engine, payload: dict) -> Job:
    with session(engine) as s:
        queue.enqueue(s, "probe", payload)
        return queue.claim(s, "test-worker")


def test_cancel_ends_the_childs_whole_process_group(empty_lab, tmp_path):
    pids = tmp_path / "pids"
    job = _claimed(empty_lab, {"pids": str(pids)})
    ended: list[Job] = []
    watcher = threading.Thread(target=lambda: ended.append(
        run_child(empty_lab, job, InChild("tests.child_jobs:stubborn"), poll_s=0.05, cancel_grace_s=0.5)))
    watcher.start()
    deadline = time.monotonic() + 120
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    child, grandchild = map(int, pids.read_text().split())
    assert not _gone(child) and not _gone(grandchild)
    with session(empty_lab) as s:
        queue.request_cancel(s, job.id)
    watcher.join(timeout=60)
    assert not watcher.is_alive()
    assert (ended[0].status, ended[0].error) == (JobStatus.CANCELLED, "the job's process was killed by signal SIGTERM")
    deadline = time.monotonic() + 10
    while not (_gone(child) and _gone(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child) and _gone(grandchild)


def test_a_child_killed_with_sigkill_is_a_failed_attempt_with_its_stderr_tail(empty_lab):
    job = _claimed(empty_lab, {})
    ended = run_child(empty_lab, job, InChild("tests.child_jobs:killed"), poll_s=0.05)
    assert ended.status == JobStatus.FAILED
    assert ended.error == "the job's process was killed by signal SIGKILL: loading 9 GB of weights into 8 GB of memory"
    tail = ended.log_tail.splitlines()
    assert "halfway" in tail and "-- the job's process was killed by signal SIGKILL; its last lines of stderr:" in tail
    assert tail[-1] == "loading 9 GB of weights into 8 GB of memory"
    assert ended.step == 1 and ended.total == 2  # what the child reported before it died stays


def test_a_child_reports_through_the_same_rows_and_ends_its_job(empty_lab):
    job = _claimed(empty_lab, {"echo": "hello"})
    ended = run_child(empty_lab, job, InChild("tests.child_jobs:answer"), poll_s=0.05)
    assert ended.status == JobStatus.DONE and ended.result["echo"] == "hello"
    assert ended.result["pid"] != os.getpid() and f"pid {ended.result['pid']}" in ended.log_tail



def test_a_child_whose_worker_is_gone_ends_at_its_next_word_and_leaves_the_job_to_be_handed_back(empty_lab):
    """The child's output pipe closed by its worker's death (a worker SIGKILLed mid-stage, before its zygote ends
    the child): the child's next write ends it by SIGPIPE. The job is not ended failed with a BrokenPipeError,
    a cause that is not the job's; it stays running, for the worker's reaper or the Slurm driver to hand back."""
    job = _claimed(empty_lab, {})
    proc = subprocess.Popen(child_command(job, InChild("tests.child_jobs:says"), ()), cwd=ROOT,
                            env={**child_env(empty_lab, ()), "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc.stdout.close()  # the reader is gone before the child says a word
    assert proc.wait(timeout=120) == -signal.SIGPIPE
    with session(empty_lab) as s:
        row = s.get(Job, job.id)
    assert (row.status, row.error, row.step) == (JobStatus.RUNNING, None, 0)


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "cold"])
def test_a_cpu_child_is_forked_from_a_zygote_that_imported_the_training_stack_once(empty_lab, monkeypatch, tmp_path,
                                                                                  forked):
    """Two jobs' children: forked from one zygote (the same parent, not this process), which imported TRL before
    either job started; each still gets the environment and working folder of its own start. With
    `ENVLAB_ZYGOTE=0` each child starts cold: this process's own child, nothing imported."""
    monkeypatch.setenv("ENVLAB_ZYGOTE", "1" if forked else "0")
    seen = []
    for given in ("first", "second"):
        monkeypatch.setenv("ENVLAB_TEST_GIVEN", given)
        folder = tmp_path / given
        folder.mkdir()
        monkeypatch.chdir(folder)
        monkeypatch.syspath_prepend(str(ROOT))  # the cold child finds `tests` from its working folder's path
        monkeypatch.setenv("PYTHONPATH", str(ROOT))
        ended = run_child(empty_lab, _claimed(empty_lab, {}), InChild("tests.child_jobs:where"), poll_s=0.05)
        assert ended.status == JobStatus.DONE, ended.log_tail
        seen.append(ended.result)
    assert [(r["given"], r["cwd"], r["trl"]) for r in seen] == [
        ("first", str(tmp_path / "first"), forked), ("second", str(tmp_path / "second"), forked)]
    assert seen[0]["pid"] != seen[1]["pid"]
    if forked:
        assert seen[0]["parent"] == seen[1]["parent"] != os.getpid()
    else:
        assert seen[0]["parent"] == seen[1]["parent"] == os.getpid()


def _zygotes_of(pid: int) -> set[int]:
    """The zygote processes `pid` started (its children running `lab.jobs.zygote`)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
            command = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"lab.jobs.zygote" in command:
            found.add(int(stat.parent.name))
    return found


def test_a_warmed_zygote_is_the_one_the_first_jobs_child_forks_from(empty_lab, monkeypatch, tmp_path):
    """`warm_children` (what `envlab run` does before it creates the run) starts the zygote at once, before any job:
    the first job's child forks from that one and no second zygote starts. What the training stack's own import
    sets in the environment (torch's compile cache folder) does not part a child from its zygote."""
    monkeypatch.setenv("ENVLAB_ZYGOTE", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("ENVLAB_TEST_GIVEN", "warm")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    before = _zygotes_of(os.getpid())
    warm_children(empty_lab)
    warmed = _zygotes_of(os.getpid()) - before
    assert len(warmed) == 1  # started, not waited for: this test goes on while it imports
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # as importing torch's compiler does
    ended = run_child(empty_lab, _claimed(empty_lab, {}), InChild("tests.child_jobs:where"), poll_s=0.05)
    assert ended.status == JobStatus.DONE, ended.log_tail
    assert (ended.result["parent"], ended.result["trl"], ended.result["given"]) == (warmed.pop(), True, "warm")
    assert _zygotes_of(os.getpid()) - before == {ended.result["parent"]}
    env = child_env(empty_lab, ())
    assert import_key({**env, "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}) == import_key(env)
    assert import_key({**env, "OMP_NUM_THREADS": "7"}) != import_key(env)


def test_a_zygote_that_cannot_start_leaves_the_child_to_start_cold(empty_lab, monkeypatch, tmp_path, caplog):
    """The zygote's imports fail (a broken `trl` first on the path): the job's child starts cold and the job ends
    done, with a warning that says why."""
    broken = tmp_path / "broken" / "trl"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('a trl broken on purpose')\n")
    monkeypatch.setenv("ENVLAB_ZYGOTE", "1")
    monkeypatch.setenv("PYTHONPATH", f"{broken.parent}{os.pathsep}{ROOT}")
    ended = run_child(empty_lab, _claimed(empty_lab, {"echo": "cold"}), InChild("tests.child_jobs:answer"),
                      poll_s=0.05)
    assert (ended.status, ended.result["echo"]) == (JobStatus.DONE, "cold")
    assert "no zygote (the zygote ended before it started the child); the child starts cold" in caplog.text


def test_the_zygote_and_its_children_end_with_the_workers_process(tmp_path):
    """A worker's process killed with SIGKILL (no atexit runs): the zygote sees its socket close and ends the
    child it forked, with the child's own children."""
    pids = tmp_path / "pids"
    db = tmp_path / "lab.db"
    script = (
        "import sys\n"
        "from storage.db import make_engine, upgrade, session\n"
        "from storage import queue\n"
        "from lab.jobs.worker import InChild, run_child\n"
        f"engine = make_engine({str(db)!r}); upgrade(engine)\n"
        "with session(engine) as s:\n"
        f"    queue.enqueue(s, 'probe', {{'pids': {str(pids)!r}}})\n"
        "    job = queue.claim(s, 'w')\n"
        "run_child(engine, job, InChild('tests.child_jobs:stubborn'))\n")
    worker = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT,
                              env={**os.environ, "ENVLAB_ZYGOTE": "1", "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 120
        while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
            time.sleep(0.1)
        child, grandchild = map(int, pids.read_text().split())
        assert int(Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()[1]) != worker.pid  # forked
        worker.kill()
        worker.wait()
        deadline = time.monotonic() + 20
        while not (_gone(child) and _gone(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child) and _gone(grandchild)
    finally:
        if worker.poll() is None:
            worker.kill()


def test_the_childs_command_and_environment_follow_the_workers_gpus(empty_lab, monkeypatch):
    monkeypatch.delenv("ENVLAB_ALLOW_DOWNLOADS", raising=False)
    job = _claimed(empty_lab, {})
    plain = child_command(job, InChild("m:f"), [])
    assert plain[1:] == ["-m", "lab.jobs.child", str(job.id), "m:f"]
    launched = child_command(job, InChild("m:f"), ["2", "3"])
    assert launched[1:7] == ["-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIGS /
                             "multi-gpu.yaml"), "--multi_gpu", "--num_processes"] and launched[7] == "2"
    assert launched[-4:] == ["-m", "lab.jobs.child", str(job.id), "m:f"]
    one = child_command(job, InChild("m:f"), ["1"])
    assert one[3:7] == ["--config_file", str(ACCELERATE_CONFIGS / "one-gpu.yaml"), "--num_processes", "1"]
    from accelerate.commands.config.config_args import load_config_from_file  # the lab's configs are accelerate's

    assert [(load_config_from_file(str(ACCELERATE_CONFIGS / name)).distributed_type, name) for name in
            ("one-gpu.yaml", "multi-gpu.yaml")] == [("NO", "one-gpu.yaml"), ("MULTI_GPU", "multi-gpu.yaml")]
    env = child_env(empty_lab, ["2", "3"])
    assert (env["CUDA_VISIBLE_DEVICES"], env["HF_HUB_OFFLINE"]) == ("2,3", "1")
    assert child_env(empty_lab, [])["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.setenv("ENVLAB_ALLOW_DOWNLOADS", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert "HF_HUB_OFFLINE" not in child_env(empty_lab, [])
    # blocks of a stage's processes: a worker owns as many GPUs as the stages it claims were planned for
    assert split_gpus(["0", "1", "2"], 2) == [["0"], ["1"]] and split_gpus(["0"], 3) == [["0"], [], []]
    assert split_gpus(["0", "1", "2", "3"], 2, each=2) == [["0", "1"], ["2", "3"]]
    assert split_gpus(["0", "1", "2"], 2, each=2) == [["0", "1"], []]


def test_two_multi_gpu_stages_on_one_node_meet_at_two_different_free_ports(empty_lab):
    """accelerate's default `--main_process_port` is 29500 for every launch: two multi-GPU stages on one node (two
    workers, two Slurm tasks) would collide there. Each launch gets a free port of its own, while the first one's
    processes listen on theirs; a one-GPU launch starts one process and meets nobody."""
    import socket

    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    job = _claimed(empty_lab, {})

    def port(command: list[str]) -> int:
        launch, _, _ = _validate_launch_command(launch_command_parser().parse_args(command[3:]))
        return launch.main_process_port

    first = child_command(job, InChild("m:f"), ["0", "1"])
    with socket.socket() as listening:  # the first stage's rendezvous, up while the second one launches
        listening.bind(("127.0.0.1", port(first)))
        listening.listen()
        second = child_command(job, InChild("m:f"), ["2", "3"], fsdp=True)
        assert port(second) not in (port(first), 29500)
        with socket.socket() as free:
            free.bind(("127.0.0.1", port(second)))  # free when it was handed out
    assert 1024 <= port(first) != 29500
    assert "--main_process_port" not in child_command(job, InChild("m:f"), ["0"])


def test_a_stage_that_needs_fsdp_is_launched_with_the_labs_fsdp_config(empty_lab):
    """The worker asks the stage's handler whether it runs under FSDP (only on several GPUs) and launches it with
    assets/accelerate/fsdp.yaml, which accelerate's own loader and launcher read as FSDP2 with sharded checkpoints
    and FSDP's own activation checkpointing, which the launch hands its processes."""
    job = _claimed(empty_lab, {})
    asked = []

    def decides(engine, job, gpus):
        asked.append(list(gpus))
        return True, "full fine-tune of 4.0B on 8 GPUs: 76.5 GB each unsharded, 13.1 GB with FSDP: using FSDP"

    child = InChild("m:f", fsdp=decides)
    gpus = [str(i) for i in range(8)]
    assert not child.sharded(empty_lab, job, ["0"]) and asked == []  # one GPU: nothing to shard, nothing asked
    assert child.sharded(empty_lab, job, gpus) and asked == [gpus]
    command = child_command(job, child, gpus, fsdp=True)
    assert command[1:8] == ["-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIGS / "fsdp.yaml"),
                            "--num_processes", "8", "--num_machines"]
    assert "--multi_gpu" not in command and command[-4:] == ["-m", "lab.jobs.child", str(job.id), "m:f"]
    one = child_command(job, child, ["0"], fsdp=True)
    assert one[3:5] == ["--config_file", str(ACCELERATE_CONFIGS / "one-gpu.yaml")]
    assert InChild("m:f", fsdp=lambda *a: 1 / 0).sharded(empty_lab, job, gpus) is False  # a failed decision: DDP
    assert handlers()[JobKind.STAGE].fsdp is stage_needs_fsdp

    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    config = load_config_from_file(str(ACCELERATE_CONFIGS / "fsdp.yaml"))
    assert (config.distributed_type, config.num_machines, config.mixed_precision) == ("FSDP", 1, "no")
    assert config.fsdp_config == {
        "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_reshard_after_forward": True,
        "fsdp_offload_params": False, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": False, "fsdp_activation_checkpointing": True}
    launch = launch_command_parser().parse_args(command[3:])
    launch, _, _ = _validate_launch_command(launch)
    assert (launch.use_fsdp, launch.multi_gpu, launch.num_processes, str(launch.fsdp_version)) == (True, False, 8, "2")
    assert (launch.fsdp_state_dict_type, launch.fsdp_auto_wrap_policy) == ("SHARDED_STATE_DICT",
                                                                          "TRANSFORMER_BASED_WRAP")
    from accelerate.utils.launch import prepare_multi_gpu_env

    env = prepare_multi_gpu_env(launch)
    assert (env["ACCELERATE_USE_FSDP"], env["FSDP_ACTIVATION_CHECKPOINTING"]) == ("true", "true")
    assert launch.fsdp_transformer_layer_cls_to_wrap is None  # the model's own `_no_split_modules` decide


def _stage0(tmp_path: Path, in_child: bool) -> list[tuple]:
    engine = make_engine(str(tmp_path / "lab.db"))
    upgrade(engine)
    with session(engine) as s:
        run = create_run(s, name="r", config=CONFIG, settings=RunSettings(stages=1, validation_boards=3),
                         engineer="fixed", seed=3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        stage = {"stage": handlers(in_child=in_child)["stage"]}
        assert run_worker(engine, stage, WorkerOptions(once=True, poll_s=0.01, run_id=run.id)) == 1
    finally:
        torch.set_num_threads(threads)
    with session(engine) as s:
        job = s.exec(select(Job)).one()
        assert job.status == JobStatus.DONE, job.log_tail
        rows = s.exec(select(Episode).where(Episode.run_id == run.id).order_by(Episode.id)).all()
        out = [(e.instance_id, e.completion, e.valid, e.outcome) for e in rows]
    engine.dispose()
    return out


def test_a_stage_in_its_own_process_stores_what_it_stores_in_the_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "here").mkdir()
    (tmp_path / "there").mkdir()
    here, there = _stage0(tmp_path / "here", in_child=False), _stage0(tmp_path / "there", in_child=True)
    assert len(here) == 3 and here == there


def test_a_policy_that_cannot_load_here_is_refused_before_anything_is_stored(empty_lab, monkeypatch, capsys, tmp_path):
    from lab import cli

    monkeypatch.delenv("ENVLAB_ALLOW_DOWNLOADS", raising=False)
    db = str(tmp_path / "cli.db")
    assert cli.main(["run", "--policy", "no-such-model", "--engineer", "fixed", "--db", db]) == 2
    assert capsys.readouterr().err == (
        "envlab run: policy 'no-such-model': not a local folder with config.json, and model-hub downloads are off "
        "(set ENVLAB_ALLOW_DOWNLOADS=1 to let envlab fetch it from the Hugging Face hub)\n")
    engine = make_engine(db)
    with session(engine) as s:
        assert s.exec(select(Run)).all() == []
    engine.dispose()
    (tmp_path / "empty").mkdir()
    with session(empty_lab) as s, \
            pytest.raises(LoopError, match=r"^policy '.*empty': the folder .* has no config.json"):
        create_run(s, name="r", config=CONFIG, settings=RunSettings(stages=1), policy=str(tmp_path / "empty"))
    with session(empty_lab) as s, pytest.raises(LoopError, match=r"^policy './gone': no such folder$"):
        create_run(s, name="r", config=CONFIG, settings=RunSettings(stages=1), policy="./gone")
    with session(empty_lab) as s:
        assert s.exec(select(Run)).all() == []


def _finished_stage(engine, keep: bool) -> Path:
    with session(engine) as s:
        run = create_run(s, name="r", config=CONFIG, settings=RunSettings(stages=1, keep_checkpoints=keep),
                         engineer="fixed")
        stage = s.exec(select(Stage).where(Stage.run_id == run.id)).one()
        stage.index, stage.status = 0, StageStatus.DONE
        s.add(Stage(run_id=run.id, index=1, config=stage.config, status=StageStatus.DONE))
        s.commit()
    trl = run_folder(engine, run.uuid) / "stage-1" / "trl"
    for name in ("checkpoint-2", "checkpoint-4"):
        (trl / name).mkdir(parents=True)
        (trl / name / "model.safetensors").write_bytes(b"x" * 1000)
    (run_folder(engine, run.uuid) / "stage-1" / "policy").mkdir()
    (run_folder(engine, run.uuid) / "stage-1" / "policy" / "model.safetensors").write_bytes(b"y" * 500)
    return trl


def test_a_finished_stage_keeps_its_weights_and_drops_the_trainers_checkpoints(empty_lab):
    trl = _finished_stage(empty_lab, keep=False)
    folder = trl.parent.parent
    assert disk_use(folder) == 2500
    with session(empty_lab) as s:
        queue.request_cancel(s, 1)  # stage 0's job, queued with the run
        job = queue.enqueue(s, "stage", {"run_id": 1, "stage_index": 1}, run_id=1, target=1)
        assert queue.claim(s, "w").id == job.id
        ended = queue.finish(s, job.id, {})
    after_job(empty_lab, ended)
    assert sorted(p.name for p in trl.iterdir()) == [] and (folder / "stage-1" / "policy").is_dir()
    assert disk_use(folder) == 500
    kept = _finished_stage(empty_lab, keep=True)
    assert prune_checkpoints(empty_lab, 2, 1) == [] and sorted(p.name for p in kept.iterdir()) == [
        "checkpoint-2", "checkpoint-4"]


def test_the_child_process_benchmark_runs_at_a_tiny_budget(capsys, monkeypatch):
    import importlib.util

    monkeypatch.setenv("ENVLAB_ZYGOTE", "1")  # the benchmark sets it per measurement; given back after

    spec = importlib.util.spec_from_file_location("bench_child", Path(__file__).parents[2] / "benchmarks" /
                                                  "bench_child.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up while they are made
    spec.loader.exec_module(bench)
    figures = bench.main(bench.Args(quick=True))  # in the worker's process and forked (cold: the full budget's)
    out = capsys.readouterr().out
    assert "ratio" not in figures and "stages in cold child processes: not measured at this budget" in out
    assert figures["ratio_forked"] > 0 and "stages in forked child processes / in the worker's process" in out
    assert len(figures["added_forked_s"]) == 2  # stage 0, whose child starts the zygote, and stage 1
    assert [line.split(":")[0] for line in out.splitlines() if " s in a forked child " in line] == ["stage 0",
                                                                                                    "stage 1"]


def test_a_large_policy_needs_a_gpu_worker_unless_the_run_allows_the_cpu(empty_lab, tmp_path, monkeypatch):
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)  # 500 bf16 weights
    assert policy_params(str(folder)) == 500
    assert [policy_params(n) for n in ("Qwen/Qwen3-4B", "Qwen/Qwen3-0.6B", "gemma3-270m", "tiny")] == [
        4_000_000_000, 600_000_000, 268_000_000, 1_400_000]
    monkeypatch.setenv("ENVLAB_GPU_ABOVE", "400")
    with session(empty_lab) as s:
        big = create_run(s, name="big", config=CONFIG, settings=RunSettings(stages=1), policy=str(folder),
                         engineer="fixed")
        cpu = create_run(s, name="cpu", config=CONFIG, settings=RunSettings(stages=1, allow_cpu=True),
                         policy=str(folder), engineer="fixed")
        needs = {j.run_id: j.needs_gpu for j in s.exec(select(Job))}
        assert needs == {big.id: True, cpu.id: False}
        assert queue.claim(s, "cpu-worker", gpu=False).run_id == cpu.id
        assert queue.claim(s, "cpu-worker", gpu=False) is None


def test_the_converted_gemma_folder_is_where_its_policy_is_never_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVLAB_CACHE", str(tmp_path))
    (tmp_path / "gemma3-270m").mkdir()
    (tmp_path / "gemma3-270m" / "config.json").write_text("{}")
    assert resolve_policy("gemma3-270m") == str(tmp_path / "gemma3-270m")
    assert resolve_policy("tiny").endswith("assets/tiny-policy")
