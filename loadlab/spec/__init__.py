"""What to run, as data: scenario and load-plan models, their validation, scenario files.

- :mod:`~loadlab.spec.plan`: the load plan (levels, steps, warm-up, knee search, SLO).
- :mod:`~loadlab.spec.scenario`: a scenario (target, workload, plan, loadgen settings,
  CPU isolation, sweep, what-if) and the server configurations it expands into.
- :mod:`~loadlab.spec.fields`: the strict base model, errors carrying their fix.
- :mod:`~loadlab.spec.validate`: plain data (YAML, flags) into those models; errors
  name the file or flag, the field and the fix (exit 2).
- :mod:`~loadlab.spec.scenario_file`: scenario files, by path or by a shipped name.
- :mod:`~loadlab.spec.knee_search`: the levels a plan walks, fixed or searched.
- :mod:`~loadlab.spec.cpulist`: taskset-style CPU lists.
- :mod:`~loadlab.spec.datafiles`: where shipped data folders (profiles, scenarios) are.

Pure: nothing here starts a process or opens a socket, and nothing imports a layer above.
"""
