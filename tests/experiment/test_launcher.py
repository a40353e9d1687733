"""launch_target against a stand-in server process: health wait, failures, group stop."""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path

import httpx
import pytest

from loadlab.errors import InputError, TargetError
from loadlab.experiment.launcher import launch_target
from loadlab.experiment.log_cause import root_cause
from loadlab.experiment.server_flags import parse_flags
from loadlab.spec.secrets import redact

HERE = Path(__file__).parent
FIXTURES = HERE.parent / "fixtures" / "vllm-0.32-cpu"


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> Path:
    script = tmp_path / "vllm"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'fake_server.py'} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("LOADLAB_VLLM_BIN", str(script))
    return script


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    stat_line = Path(f"/proc/{pid}/stat")
    return stat_line.exists() and stat_line.read_text().split()[2] != "Z"


def test_launch_healthy_records_redacted_flags_and_stops_group(fake_vllm, tmp_path, monkeypatch):
    child_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_CHILD_PID_FILE", str(child_file))
    flags = ["my-model", "--max-num-seqs", "4", "--api-key", "s3cret", "--no-enable-prefix-caching",
             "--block-size=32", "--enforce-eager"]
    with launch_target("vllm", flags, tmp_path / "run", startup_timeout_s=30) as target:
        assert httpx.get(f"{target.base_url}/health").status_code == 200
        assert target.model == "fake-model"
        assert target.flags["max_num_seqs"] == 4
        assert target.flags["block_size"] == 32
        assert target.flags["enable_prefix_caching"] is False
        assert target.flags["enforce_eager"] is True
        assert target.flags["api_key"] == "***"
        assert "s3cret" not in str(target.manifest_entry())
        assert target.server_settings() == {"max_num_seqs": 4, "block_size": 32,
                                            "enable_prefix_caching": False}
        assert target.argv[:3] == [str(fake_vllm), "serve", "my-model"]
        pid, child_pid = target.pid, int(child_file.read_text())
        assert _alive(pid) and _alive(child_pid)
    assert not _alive(pid)
    assert not _alive(child_pid)


def test_children_of_a_dead_leader_are_stopped(fake_vllm, tmp_path, monkeypatch):
    """The leader dies first; its child ignores SIGTERM: the stop still ends with none left."""
    child_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_CHILD_PID_FILE", str(child_file))
    monkeypatch.setenv("FAKE_CHILD_IGNORES_TERM", "1")
    with launch_target("vllm", ["m"], tmp_path / "run", startup_timeout_s=30,
                       stop_timeout_s=1.0) as target:
        pid, child_pid = target.pid, int(child_file.read_text())
        os.kill(pid, signal.SIGKILL)
        assert target.proc is not None and target.proc.wait(30) == -signal.SIGKILL
    assert not _alive(child_pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)   # nothing of the server's process group is left


def test_server_that_dies_raises_with_log_tail(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "die")
    with (pytest.raises(TargetError, match="cannot allocate KV cache"),
          launch_target("vllm", ["m"], tmp_path, startup_timeout_s=30)):
        pytest.fail("must not yield")


def test_server_never_healthy_times_out(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "never")
    with (pytest.raises(TargetError, match="not healthy"),
          launch_target("vllm", ["m"], tmp_path, startup_timeout_s=1.5)):
        pytest.fail("must not yield")
    assert "fake server argv" in (tmp_path / "vllm-server.log").read_text()


def test_server_stopped_when_body_raises(fake_vllm, tmp_path):
    with (pytest.raises(KeyboardInterrupt),
          launch_target("vllm", ["m"], tmp_path, startup_timeout_s=30) as target):
        pid = target.pid
        raise KeyboardInterrupt
    assert not _alive(pid)


def test_bad_kind_and_missing_vllm(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="unknown target kind"), launch_target("tgi", [], tmp_path):
        pass
    monkeypatch.setenv("LOADLAB_VLLM_BIN", str(tmp_path / "absent"))
    with pytest.raises(InputError, match="install_vllm.sh"), launch_target("vllm", ["m"], tmp_path):
        pass


def test_parse_flags_and_redaction():
    parsed = parse_flags(["/models/x", "--max-num-seqs", "8", "--gpu-memory-utilization=0.5",
                          "--enable-chunked-prefill", "--served-model-name", "tiny"])
    assert parsed.positional == ["/models/x"]
    assert parsed.values == {"max_num_seqs": 8, "gpu_memory_utilization": 0.5,
                             "enable_chunked_prefill": True, "served_model_name": "tiny"}
    assert redact(["vllm", "--api-key", "k", "--api-key=k2", "--port", "1"]) == [
        "vllm", "--api-key", "***", "--api-key=***", "--port", "1"]
    with pytest.raises(InputError):
        parse_flags(["--max-num-seqs", "4", "stray", "value"])


def test_launch_builtin_simulator(tmp_path):
    flags = ["--max-num-seqs", "4", "--served-model-name", "simtiny", "--num-gpu-blocks-override",
             "64", "--block-size", "32", "--max-model-len", "1024"]
    with launch_target("sim", flags, tmp_path, startup_timeout_s=60) as target:
        assert target.model == "simtiny"
        assert target.flags["max_num_seqs"] == 4
        metrics = httpx.get(f"{target.base_url}/metrics").text
        assert 'num_gpu_blocks="64"' in metrics
        pid = target.pid
    assert not _alive(pid)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable CPUs")
def test_server_cpus_hold_every_thread_of_the_tree(fake_vllm, tmp_path, monkeypatch):
    """Started on the set (inherited) and, once healthy, narrowed to it: a child that bound
    itself elsewhere on its own (as vLLM's worker does) is brought back."""
    import psutil

    allowed = sorted(os.sched_getaffinity(0))
    server, elsewhere = frozenset(allowed[:1]), allowed[-1]
    child_file = tmp_path / "child.pid"
    monkeypatch.setenv("FAKE_CHILD_PID_FILE", str(child_file))
    monkeypatch.setenv("FAKE_CHILD_CPUS", str(elsewhere))
    with launch_target(
        "vllm", ["m"], tmp_path / "run", startup_timeout_s=30, server_cpus=server
    ) as target:
        procs = [psutil.Process(target.pid), psutil.Process(int(child_file.read_text()))]
        threads = [t.id for p in procs for t in p.threads()]
        assert len(threads) >= 2
        assert {t: os.sched_getaffinity(t) for t in threads} == dict.fromkeys(threads, server)
    assert os.sched_getaffinity(0) == set(allowed)  # the launcher's own thread got its CPUs back


def test_explicit_vllm_thread_binding_outside_the_server_cpus_is_refused(fake_vllm, tmp_path):
    with (pytest.raises(InputError, match="VLLM_CPU_OMP_THREADS_BIND"),
          launch_target("vllm", ["m"], tmp_path, env={"VLLM_CPU_OMP_THREADS_BIND": "0-1"},
                        server_cpus=frozenset({5}))):
        pytest.fail("must not start")


def test_a_server_that_fails_to_start_is_quoted_by_its_root_cause(fake_vllm, tmp_path,
                                                                     monkeypatch):
    """The log a real vLLM wrote when it refused ``--gpu-memory-utilization 2``: the error
    names the field and why in one line, and the log's path. On main: "exited with code 1"
    and 20 lines of log tail whose cause sits in the middle."""
    log = FIXTURES / "start-failure-gpu-memory-utilization-2.log"
    monkeypatch.setenv("FAKE_MODE", "log")
    monkeypatch.setenv("FAKE_LOG", str(log))
    with pytest.raises(TargetError) as caught, \
            launch_target("vllm", ["m"], tmp_path, startup_timeout_s=30):
        pytest.fail("must not yield")
    assert str(caught.value) == (
        "server exited with code 1 before it was healthy: pydantic_core._pydantic_core."
        "ValidationError: 1 validation error for CacheConfig / gpu_memory_utilization / "
        "Input should be less than or equal to 1 [type=less_than_equal, input_value=2.0, "
        f"input_type=float] (the whole log: {tmp_path / 'vllm-server.log'})")


def test_root_cause_skips_the_lines_that_point_up_to_it():
    """The exception lines of a real vLLM (0.32, CPU) that asked for more KV cache than the
    node has: the worker's ValueError, then two RuntimeErrors pointing up to it."""
    cause = ("ValueError: Available memory on node 0 (9.65/11.96 GiB) on kv cache allocation is "
             "less than requested memory for kv (100000.0 GiB). Decrease "
             "--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by "
             "other processes.")
    log = (f"(Worker pid=16624) ERROR 12-01 07:40:38 [multiproc_executor.py:1063] {cause}\n"
           "(EngineCore pid=16054) ERROR 12-01 07:40:38 [core.py:1510] RuntimeError: Worker "
           f"failed with error '{cause}', please check the stack trace above for the root cause\n"
           "Traceback (most recent call last):\n"
           "RuntimeError: Engine core initialization failed. See root cause above. "
           "Failed core proc(s): {}\n")
    assert root_cause(log) == cause
