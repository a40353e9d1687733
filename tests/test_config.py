"""Scenario and plan models: one level parser, one plan, scenario files checked before
anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlab.errors import InputError
from loadlab.experiment.scenarios import load_scenario
from loadlab.spec.plan import KneeSearch, LoadPlan, parse_levels
from loadlab.spec.scenario import Scenario
from loadlab.spec.validate import plan_from_flags

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


@pytest.mark.parametrize(("text", "integer", "levels"), [
    ("1,2,4,8", True, [1, 2, 4, 8]),
    ("1:2:64", True, [1, 2, 4, 8, 16, 32, 64]),
    ("1:2:48", True, [1, 2, 4, 8, 16, 32, 48]),
    ("1:1.5:10", True, [1, 2, 3, 5, 8, 10]),
    ("0.5:2:5", False, [0.5, 1.0, 2.0, 4.0, 5.0]),
    ([3, 6], True, [3, 6]),
    (7, True, [7]),
])
def test_levels_from_lists_text_and_series(text, integer, levels):
    assert parse_levels(text, integer) == levels


@pytest.mark.parametrize("bad", ["", "1,x", "0,1", "1:1:8", "4:2:2", "a:b:c", "1.5,2", [1, None]])
def test_bad_levels_are_refused(bad):
    with pytest.raises(ValueError):
        parse_levels(bad, integer=True)


def test_plan_modes_steps_and_round_trip():
    closed = LoadPlan(concurrency="2:2:8", step_duration_s=20, warmup_s=4)
    assert closed.mode == "closed" and [s.concurrency for s in closed.steps] == [2, 4, 8]
    assert all(s.duration_s == 20 and s.warmup_s == 4 for s in closed.steps)
    rate = LoadPlan(rate="1,2.5", burstiness=0.5)
    assert rate.mode == "rate" and [s.target_rate for s in rate.steps] == [1.0, 2.5]
    assert rate.gamma_shape == 0.5 and LoadPlan(rate=[1]).gamma_shape is None
    replay = LoadPlan(trace="t.csv", trace_duration_s=30.0, warmup_s=5)
    assert replay.mode == "replay" and len(replay.steps) == 1 and replay.steps[0].duration_s > 30
    search = LoadPlan(search=KneeSearch(start=4, max=14, resolution=4))
    assert search.mode == "closed" and search.steps == () and search.search.grid() == [4, 8, 12, 14]
    for plan in (closed, rate, replay, search):
        described = plan.describe()
        assert described["mode"] == plan.mode
        assert LoadPlan.from_description(described) == plan


@pytest.mark.parametrize(("fields", "flag"), [
    ({"concurrency": "1,2", "rate": "1"}, "plan"),
    ({"concurrency": "2,x"}, "--concurrency"),
    ({"rate": "-1"}, "--rate"),
    ({"concurrency": "2", "step_duration_s": 10, "warmup_s": 10}, "plan"),
    ({"rate": "2", "burstiness": 0}, "--burstiness"),
])
def test_plan_flag_errors_name_the_flag(fields, flag):
    with pytest.raises(InputError) as info:
        plan_from_flags(**fields)
    assert info.value.field == flag and info.value.fix


def test_points_of_a_matrix_and_of_arms():
    base = {
        "target": {"launch": "sim"},
        "load": {"concurrency": [1]},
        "flags": {"--max-num-seqs": 4},
    }
    matrix = Scenario.model_validate({**base, "sweep": {"matrix": {
        "block-size": [16, 32], "enable_prefix_caching": [True, False]}}})
    assert matrix.sweep_mode == "matrix" and matrix.baseline is None
    assert [p.name for p in matrix.points()] == [
        "block-size-16_enable-prefix-caching-on", "block-size-16_enable-prefix-caching-off",
        "block-size-32_enable-prefix-caching-on", "block-size-32_enable-prefix-caching-off"]
    assert matrix.points()[3].flags == {
        "max_num_seqs": 4,
        "block_size": 32,
        "enable_prefix_caching": False,
    }
    arms = Scenario.model_validate({**base, "sweep": {"arms": {"a": {"max-num-seqs": 8}, "b": {}}}})
    assert arms.sweep_mode == "ab" and arms.baseline == "a"
    assert [(p.name, p.flags["max_num_seqs"]) for p in arms.points()] == [("a", 8), ("b", 4)]
    single = Scenario.model_validate(base)
    assert single.sweep_mode == "single" and [p.name for p in single.points()] == ["run"]


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_validates(path):
    scenario = load_scenario(path)
    assert scenario.name == path.stem and scenario.description
    assert scenario.points()
    if scenario.target.url is None:
        assert scenario.sweep is not None and len(scenario.points()) >= 2


def test_the_shipped_set():
    assert {p.stem for p in SCENARIOS.glob("*.yaml")} >= {
        "demo", "prefix-caching-ab", "chunked-prefill-ab", "nightly-sweep", "pre-launch"}
    assert load_scenario(SCENARIOS / "pre-launch.yaml").target.url is not None


GOOD = """\
target:
  launch: sim
workload:
  profile: azure-conv
load:
  concurrency: [1, 2]
sweep:
  arms:
    cache-on: {enable-prefix-caching: true}
    cache-off: {enable-prefix-caching: false}
"""


@pytest.mark.parametrize(
    ("old", "new", "field", "fix"),
    [
        (
            "concurrency: [1, 2]",
            "concurency: [1, 2]",
            "load.concurency",
            "allowed here: concurrency",
        ),
        ("concurrency: [1, 2]", "concurrency: 1,two", "load.concurrency", "1:2:64"),
        ("launch: sim", "launch: tgi", "target.launch", "sim (built-in simulator) or vllm"),
        ("launch: sim", "url: 127.0.0.1:8000", "target", "http://127.0.0.1:8000"),
        ("profile: azure-conv", "profile: nope", "workload.profile", "azure-conv"),
        (
            "enable-prefix-caching: true}",
            "enable-prefix-cachin: true}",
            "sweep.arms.cache-on.enable_prefix_cachin",
            "enable_prefix_caching",
        ),
        ("    cache-off: {enable-prefix-caching: false}\n", "", "sweep", "add a second arm"),
        ("    cache-off:", "    off:", "sweep.arms", "quote"),
        (
            "  concurrency: [1, 2]",
            "  concurrency: [1, 2]\n  warmup_s: 90",
            "load",
            "fifth of the step",
        ),
        ("load:", "load: [", "line", "YAML syntax"),
        (
            "workload:",
            "isolation: {server_cpus: 0-1, client_cpus: 1}\nworkload:",
            "isolation",
            "own CPUs",
        ),
        (
            "workload:",
            "isolation: {client_cpus: one}\nworkload:",
            "isolation.client_cpus",
            "taskset",
        ),
        (
            "workload:",
            "isolation: {server_cpus: 2-1}\nworkload:",
            "isolation.server_cpus",
            "low-high",
        ),
        # bounds, before anything starts: a typo, not a load test
        ("concurrency: [1, 2]", "concurrency: [1000000000]", "load.concurrency", "100,000 users"),
        ("concurrency: [1, 2]", "concurrency: 1:1.0001:90000", "load.concurrency",
         "fewer levels"),
        ("concurrency: [1, 2]", "rate: [5, 1e9]", "load.rate", "100,000 requests/s"),
        ("  concurrency: [1, 2]", "  concurrency: [1, 2]\n  step_duration_s: .inf",
         "load.step_duration_s", "seconds per step"),
        ("  concurrency: [1, 2]", "  concurrency: [1, 2]\n  step_duration_s: 1e308",
         "load.step_duration_s", "seconds per step"),
        ("  concurrency: [1, 2]", "  concurrency: [1, 2]\n  burstiness: .nan",
         "load.burstiness", "gamma shape"),
        # the name becomes part of the sweep folder's: it must stay one folder name
        ("target:", "name: ../../escape\ntarget:", "name", "letters, digits"),
        ("target:", "name: ..\ntarget:", "name", "letters, digits"),
    ],
)
def test_scenario_errors_name_file_field_and_fix(tmp_path, old, new, field, fix):
    path = tmp_path / "bad.yaml"
    assert old in GOOD
    path.write_text(GOOD.replace(old, new))
    with pytest.raises(InputError) as info:
        load_scenario(path)
    err = info.value
    assert err.source == str(path) and err.field.startswith(field) and fix in err.fix, str(err)
    assert "\n" not in str(err)


def test_scenario_file_missing_or_not_a_mapping(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        load_scenario(tmp_path / "absent.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(InputError, match="mapping"):
        load_scenario(tmp_path / "list.yaml")


def test_a_scenario_not_in_utf8_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(GOOD.replace("target:", "# caf\xe9\ntarget:").encode("latin-1"))
    with pytest.raises(InputError) as info:
        load_scenario(path)
    err = info.value
    assert (err.source, err.field, err.fix) == (str(path), "line 1", "save the file as UTF-8")
    assert "0xe9" in err.message


def test_a_file_name_that_cannot_name_a_folder_gives_a_safe_default_name(tmp_path):
    path = tmp_path / "my sweep (v2).yaml"
    path.write_text(GOOD)
    assert load_scenario(path).name == "my_sweep__v2_"


def test_relative_profile_resolves_against_the_scenario(tmp_path):
    (tmp_path / "w").mkdir()
    source = Path(__file__).parent / "vllm" / "profiles" / "tiny-shared.yaml"
    (tmp_path / "w" / "mine.yaml").write_text(source.read_text())
    (tmp_path / "s.yaml").write_text(GOOD.replace("profile: azure-conv", "profile: w/mine.yaml"))
    scenario = load_scenario(tmp_path / "s.yaml")
    assert Path(scenario.workload.profile) == tmp_path / "w" / "mine.yaml"


def test_isolation_reads_taskset_lists_numbers_and_lists(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        GOOD.replace("workload:", "isolation:\n  server_cpus: 0-2,5\n  client_cpus: 3\nworkload:")
    )
    isolation = load_scenario(path).isolation
    assert (
        isolation is not None
        and isolation.server_cpus == {0, 1, 2, 5}
        and isolation.client_cpus == {3}
    )
    path.write_text(GOOD.replace("workload:", "isolation: {client_cpus: [6, 4]}\nworkload:"))
    assert load_scenario(path).isolation.manifest_entry() == {
        "server_cpus": None,
        "client_cpus": [4, 6],
    }
