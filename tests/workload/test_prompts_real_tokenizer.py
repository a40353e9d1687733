"""Prompt calibration against a REAL BPE tokenizer: the tiny Llama tokenizer that
tools/install_vllm.sh builds (vocab ~4k, so most words cost 1.5 tokens), loaded with
the `tokenizers` library inside .vllm-venv. Skips with instructions when that is absent."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".vllm-venv" / "bin" / "python"
TINY = Path(os.environ.get("LOADLAB_TINY_MODEL", REPO / ".cache" / "tiny-llama"))

SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from tokenizers import Tokenizer
    from loadlab.workload import load_profile
    tok = Tokenizer.from_file(sys.argv[2] + "/tokenizer.json")
    def count(text):
        return len(tok.encode(text).ids)
    profile = load_profile("sharegpt")
    sampler, synth = profile.sampler(1), profile.prompt_synth(1, counter=count)
    specs = [sampler.spec(i) for i in range(60)]
    exact = sum(synth.prompt(s).counted_tokens == s.prompt_tokens == count(synth.prompt(s).text)
                for s in specs)
    group = load_profile("mooncake-conversation")
    gsynth = group.prompt_synth(1, counter=count)
    from loadlab.workload import RequestSpec
    a = tok.encode(gsynth.prompt(RequestSpec(1, 3000, 5, 3, 1536, None)).text).ids
    b = tok.encode(gsynth.prompt(RequestSpec(2, 2500, 5, 3, 1536, None)).text).ids
    same = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
    # two turns of a chat session: the second resends the first (but its marker) and adds
    first, second = (gsynth.prompt(RequestSpec(seq, n, 5, 9, n - 1, None, turn))
                     for seq, n, turn in ((40, 2500, 0), (56, 3100, 1)))
    c, d = tok.encode(first.text).ids, tok.encode(second.text).ids
    turns = next(k for k, (x, y) in enumerate(zip(c, d)) if x != y)
    print(json.dumps({"exact": exact, "n": len(specs), "shared_ids": same,
                      "words_per_token": synth.words_per_token, "turn_shared_ids": turns,
                      "turn_counts": [first.counted_tokens, second.counted_tokens,
                                      len(c), len(d)]}))
    """
)


@pytest.mark.vllm
def test_calibration_is_exact_on_a_real_bpe_tokenizer() -> None:
    if not VENV_PYTHON.exists() or not (TINY / "tokenizer.json").exists():
        pytest.skip("needs .vllm-venv and the tiny model: run `bash tools/install_vllm.sh`")
    res = subprocess.run(
        [str(VENV_PYTHON), "-c", SCRIPT, str(REPO), str(TINY)],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["exact"] == out["n"]
    assert out["words_per_token"] < 0.9  # words cost more than a token here, and it was measured
    # requests of one group share ~1536 leading tokens, within the words-per-token estimate
    assert abs(out["shared_ids"] - 1536) <= 40
    # a session's next turn shares the previous prompt but its marker ("#40": a few tokens)
    assert out["turn_counts"] == [2500, 3100, 2500, 3100]
    assert 2500 - 6 <= out["turn_shared_ids"] < 2500
