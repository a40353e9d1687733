"""CPU sets: parsing, checks, inheritance by a child, pinning every thread of a process tree."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from loadlab.errors import InputError
from loadlab.experiment.cpus import (
    check_available,
    check_omp_bind,
    default_split,
    format_cpu_list,
    inherited_affinity,
    parse_cpu_list,
    pin_tree,
    pinned_process,
)
from loadlab.spec.scenario import Isolation
from loadlab.spec.validate import validate

ALLOWED = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 usable CPUs")

# A parent with a second thread, and a child process with a second thread; each thread
# started before the parent prints the child's pid; all wait on stdin.
TREE = """
import subprocess, sys, threading
child = subprocess.Popen([sys.executable, "-c", "import sys, threading; "
                          "threading.Thread(target=sys.stdin.read, daemon=True).start(); "
                          "print('up', flush=True); sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
child.stdout.readline()
threading.Thread(target=sys.stdin.read, daemon=True).start()
print(child.pid, flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""


def test_parse_and_format_cpu_lists() -> None:
    assert parse_cpu_list("0", "--x") == {0}
    assert parse_cpu_list("0,2", "--x") == {0, 2}
    assert parse_cpu_list("0-3,6", "--x") == {0, 1, 2, 3, 6}
    assert format_cpu_list(frozenset({0, 1, 2, 5, 7, 8})) == "0-2,5,7-8"
    for bad in ("", "a", "1-", "3-1", "-1", "0,,1"):
        with pytest.raises(InputError, match="--client-cpus"):
            parse_cpu_list(bad, "--client-cpus")


def test_isolation_model_reads_taskset_lists_and_refuses_overlap() -> None:
    both = Isolation(server_cpus="0-2", client_cpus=3)
    assert (both.server_cpus, both.client_cpus) == ({0, 1, 2}, {3})
    assert both.manifest_entry() == {"server_cpus": [0, 1, 2], "client_cpus": [3]}
    assert (
        Isolation.model_validate(both.model_dump(mode="json")) == both
    )  # a manifest's copy reads back
    assert Isolation().manifest_entry() is None
    with pytest.raises(InputError, match=r"^isolation: server and client CPUs overlap on 1-2"):
        validate(Isolation, {"server_cpus": "0-2", "client_cpus": [1, 2]}, names={"": "isolation"})
    with pytest.raises(InputError, match=r"^client_cpus: not a list of CPU numbers"):
        validate(Isolation, {"client_cpus": [1, "a"]})


def test_check_available_names_the_field() -> None:
    missing = max(ALLOWED) + 1
    with pytest.raises(InputError, match=rf"--server-cpus: CPU {missing} is not available here"):
        check_available(Isolation(server_cpus=missing))
    with pytest.raises(InputError, match="f.yaml: isolation.client_cpus"):
        check_available(
            Isolation(client_cpus=missing),
            ("isolation.server_cpus", "isolation.client_cpus"),
            source="f.yaml",
        )
    ok = Isolation(server_cpus=ALLOWED[0])
    assert check_available(ok) is ok


def test_explicit_vllm_omp_binding_must_stay_inside_the_server_cpus() -> None:
    check_omp_bind(None, frozenset({0}))
    check_omp_bind("auto", frozenset({0}))
    check_omp_bind("0-1|2", frozenset({0, 1, 2}))
    with pytest.raises(InputError, match="outside --server-cpus 0"):
        check_omp_bind("0-1", frozenset({0}))


@two_cpus
def test_a_child_started_inside_inherits_and_the_caller_gets_its_cpus_back() -> None:
    before = os.sched_getaffinity(0)
    with inherited_affinity(frozenset({ALLOWED[0]})):
        out = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    assert out.strip() == f"[{ALLOWED[0]}]"
    assert os.sched_getaffinity(0) == before


@two_cpus
def test_pin_tree_reaches_every_thread_and_keeps_bindings_inside_the_set() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(proc.stdout.readline())
        threads = [t.id for p in (proc.pid, child) for t in psutil.Process(p).threads()]
        assert len(threads) >= 4
        first, last = frozenset(ALLOWED[:1]), frozenset(ALLOWED[-1:])
        # a thread bound inside the set keeps its binding (vLLM's OpenMP threads)
        os.sched_setaffinity(threads[-1], first)
        assert pin_tree(proc.pid, frozenset(ALLOWED)) == len(threads)
        assert os.sched_getaffinity(threads[-1]) == first
        # a thread outside the set is moved onto it; every thread of the tree ends inside
        os.sched_setaffinity(proc.pid, last)
        assert pin_tree(proc.pid, first) == len(threads)
        assert all(os.sched_getaffinity(t) == first for t in threads)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_default_split_gives_the_client_the_last_cpu() -> None:
    split = default_split()
    if len(ALLOWED) < 2:
        assert split.manifest_entry() is None
    else:
        assert split.client_cpus == {ALLOWED[-1]} and split.server_cpus == frozenset(ALLOWED[:-1])


@two_cpus
def test_pinned_process_moves_every_thread_and_gives_the_cpus_back() -> None:
    import threading

    before = os.sched_getaffinity(0)
    done = threading.Event()
    helper = threading.Thread(target=done.wait)
    helper.start()
    try:
        with pinned_process(frozenset({ALLOWED[-1]})):
            threads = [t.id for t in psutil.Process().threads()]
            assert all(os.sched_getaffinity(t) == {ALLOWED[-1]} for t in threads)
        assert all(os.sched_getaffinity(t) == before for t in threads)
    finally:
        done.set()
        helper.join()
