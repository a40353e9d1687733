"""How fast the workload side is: spec() per request, prompt text per request, profile load.

Side by side in one run (the machine is shared, so read the ratios, and CPU seconds):
- ``RequestSampler.spec(seq)`` per shipped profile, against the same draw done with a
  numpy Generator built per request from ``SeedSequence([seed, seq])`` (the other way
  to make spec() a pure function of (seed, seq)).
- ``PromptSynth.prompt(spec)`` for mooncake-conversation (long prompts, ~12k tokens)
  and sharegpt, without a counter and with an in-process whitespace counter (what
  calibration costs beyond the server's /tokenize round trips).
- ``load_profile`` per shipped profile (libyaml).

    python benchmarks/bench_workload.py [--n 20000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from loadlab.workload import list_profiles, load_profile


def cpu_per_call(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    start = time.process_time()
    for i in range(n):
        fn(i)
    return (time.process_time() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    n = parser.parse_args().n

    print(
        f"{'profile':24s} {'spec() us':>10s} {'numpy-per-seq us':>17s} {'ratio':>6s} "
        f"{'load ms':>8s}"
    )
    for name in list_profiles():
        t0 = time.process_time()
        profile = load_profile(name)
        load_ms = (time.process_time() - t0) * 1e3
        sampler = profile.sampler(1)
        ours = cpu_per_call(sampler.spec, n)
        table = profile.model.lengths.input

        def numpy_draw(seq: int, p: list[float] = table.p, v: list[float] = table.v) -> float:
            gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence([1, seq])))
            return float(np.interp(gen.random(), p, v))

        alt = cpu_per_call(numpy_draw, n)
        print(f"{name:24s} {ours * 1e6:10.1f} {alt * 1e6:17.1f} {alt / ours:6.2f} {load_ms:8.1f}")

    print()
    print(f"{'prompts':42s} {'ms/prompt':>10s} {'M tokens/s':>11s} {'mean tokens':>12s}")
    for name in ("mooncake-conversation", "sharegpt"):
        profile = load_profile(name)
        specs = [profile.sampler(1).spec(i) for i in range(min(n, 400))]
        tokens = sum(s.prompt_tokens for s in specs)
        for label, counter in (
            ("no counter", None),
            ("whitespace counter", lambda t: len(t.split())),
        ):
            synth = profile.prompt_synth(1, counter=counter)
            start = time.process_time()
            for spec in specs:
                synth.prompt(spec)
            cpu = time.process_time() - start
            print(
                f"{name + ', ' + label:42s} {cpu / len(specs) * 1e3:10.2f} "
                f"{tokens / cpu / 1e6:11.2f} "
                f"{tokens / len(specs):12.0f}"
            )


if __name__ == "__main__":
    main()
