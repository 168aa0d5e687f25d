#!/usr/bin/env bash
# Prepare a real SGLang 0.5.23 on the CPU for `make test-engine`: a venv with torch's CPU build, sglang
# without its CUDA dependency list, the sgl_kernel stand-in beside it, and a tiny random-weight Llama.
#
# Usage: engines/sglang/setup.sh [DIR]
#   DIR  default ${OMNIGATE_ENGINE_CACHE:-$HOME/.cache/omnigate}/sglang-0.5.23
#        (DIR/venv, DIR/tiny-llama, DIR/ready: the stamp of the recipe that built them)
# Knobs: PYTHON (interpreter for the venv: python3.11, else python3),
#        TORCH_PIP_ARGS (default "torch==2.13.0"; where pip cannot find a CPU build, add pip options that
#        reach one, e.g. "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu").
# Idempotent: when DIR/ready matches this recipe (this script, constraints.txt, the model builder, the
# stand-in) it returns at once; otherwise it completes what is missing. Any failure exits non-zero.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SGLANG_VERSION=0.5.23
DIR="${1:-${OMNIGATE_ENGINE_CACHE:-$HOME/.cache/omnigate}/sglang-$SGLANG_VERSION}"
VENV="$DIR/venv"
MODEL_DIR="$DIR/tiny-llama"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
TORCH_PIP_ARGS="${TORCH_PIP_ARGS:-torch==2.13.0}"
RECIPE="$(cat "$HERE/setup.sh" "$HERE/constraints.txt" "$HERE/make_tiny_model.py" \
  "$HERE/sgl_kernel_cpu_shim/sgl_kernel/__init__.py" | sha256sum | cut -c1-16)"
T0=$(date +%s)
log() { echo "[engine setup $(($(date +%s) - T0))s] $*"; }

if [ -f "$DIR/ready" ] && [ "$(cat "$DIR/ready")" = "$RECIPE" ] && [ -x "$VENV/bin/python" ]; then
  log "ready: $DIR (recipe $RECIPE)"
  exit 0
fi
rm -f "$DIR/ready"
mkdir -p "$DIR"

if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check install -q)

# 1. torch's CPU build; 2.13.x because the torchvision below is built against it.
if ! "$PY" -c 'import torch,sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
  log "installing $TORCH_PIP_ARGS"
  # shellcheck disable=SC2086
  "${PIP[@]}" $TORCH_PIP_ARGS
fi

# 2. sglang without its dependency list, which pins CUDA-only wheels (sglang-kernel, flashinfer,
#    flash-attn-4, cuda-python, torch==2.14.1, ...).
if ! "$PY" -c "import importlib.metadata as m,sys; sys.exit(m.version('sglang')!='$SGLANG_VERSION')" 2>/dev/null; then
  log "installing sglang==$SGLANG_VERSION (--no-deps)"
  "${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
fi

# 3. The pure-Python runtime dependencies at the versions constraints.txt records (triton comes with
#    xgrammar: imported, never run on this path). pip's resolver warns about sglang's missing CUDA
#    dependencies; that is expected and filtered.
log "installing runtime dependencies (constraints.txt)"
"${PIP[@]}" -c "$HERE/constraints.txt" \
  "transformers==5.19.0" "tokenizers==0.23.2" "xgrammar==0.2.7" "openai==2.8.0" \
  "openai-harmony==0.0.4" "sentencepiece==0.2.1" protobuf "mistral_common>=1.11.5" \
  "compressed-tensors==0.18.0" msgspec orjson pyzmq fastapi "uvicorn>=0.51" uvloop \
  python-multipart "prometheus-client>=0.20.0" psutil setproctitle pybase64 \
  partial_json_parser pillow einops gguf interegular "llguidance>=1.7.6,<2" tiktoken \
  "soundfile==0.13.1" zstandard watchfiles jsonschema dill aiohttp requests regex tqdm \
  pydantic scipy xxhash "blobfile==3.0.0" distro safetensors huggingface_hub numpy \
  packaging "python-dateutil<3" anthropic easydict IPython \
  2> >(grep -vE "is ignored: it is neither|dependency resolver does not|^sglang $SGLANG_VERSION requires" >&2)

# 4. torchvision's pure-Python part (sglang imports torchvision.transforms at start-up); its wheel's C
#    extension is a CUDA build. torchvision 0.28 registers fake kernels for nms/qnms unconditionally,
#    which fails when that extension did not load: guard those two as the file guards the others.
if ! "$PY" -c 'import importlib.metadata as m,sys; sys.exit(not m.version("torchvision").startswith("0.28.0"))' 2>/dev/null; then
  log "installing torchvision==0.28.0 (--no-deps)"
  "${PIP[@]}" --no-deps "torchvision==0.28.0"
fi
TV_META="$("$PY" -c 'import importlib.util as u; print(u.find_spec("torchvision").submodule_search_locations[0])')/_meta_registrations.py"
if grep -q '^@torch\.library\.register_fake("torchvision::' "$TV_META"; then
  log "guarding torchvision's nms/qnms fake kernels"
  sed -i 's/^@torch\.library\.register_fake("torchvision::/@(torch.library.register_fake if torchvision.extension._has_ops() else (lambda *a, **k: (lambda f: f)))("torchvision::/' "$TV_META"
fi

# 5. The sgl_kernel stand-in goes into the venv itself, so the server needs no PYTHONPATH.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$SITE/sgl_kernel"
cp -r "$HERE/sgl_kernel_cpu_shim/sgl_kernel" "$SITE/sgl_kernel"

log "import check"
SGLANG_USE_CPU_ENGINE=1 "$PY" -W ignore -c 'import torch, torchvision, sglang, sgl_kernel, sglang.srt.entrypoints.http_server
print("torch", torch.__version__, "| torchvision", torchvision.__version__, "| sglang", sglang.__version__)'

# 6. The tiny model (no network: the tokenizer comes from the mistral_common wheel).
if [ ! -f "$MODEL_DIR/model.safetensors" ] || [ ! -f "$MODEL_DIR/tokenizer.json" ]; then
  log "building the tiny model in $MODEL_DIR"
  "$PY" -W ignore "$HERE/make_tiny_model.py" "$MODEL_DIR"
fi
echo "$RECIPE" >"$DIR/ready"
log "done: venv=$VENV model=$MODEL_DIR"
