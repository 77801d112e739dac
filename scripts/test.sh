#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (GoogleTest suites, CLI smoke tests
# and the Hugging Face reference check, through ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Hugging Face reference test needs numpy and safetensors, the plot test matplotlib;
# without them those tests are skipped.
if ! python3 -c "import numpy, safetensors.numpy, matplotlib" 2>/dev/null; then
  python3 -m pip install --quiet numpy safetensors matplotlib 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages numpy safetensors matplotlib 2>/dev/null ||
    echo "numpy/safetensors/matplotlib unavailable: the tests that need them will be skipped"
fi
# The export test also loads the exported models in transformers, when PyTorch and
# transformers can be installed (Debian's python3-torch, transformers from PyPI).
if torch_python=$(scripts/torch_env.sh build/torch-venv); then
  export PPTRAIN_TORCH_PYTHON=$torch_python
else
  echo "PyTorch/transformers unavailable: the export test checks with numpy only"
fi
# The offline GPT-2 tokenizer test (prepare_data.py --gpt2-ranks) needs tiktoken and
# GPT-2's byte-pair ranks, which openai-whisper's source distribution ships; without them
# it is skipped.
python3 -c "import tiktoken" 2>/dev/null ||
  python3 -m pip install --quiet tiktoken 2>/dev/null ||
  python3 -m pip install --quiet --break-system-packages tiktoken 2>/dev/null || true
ranks=build/gpt2.tiktoken
if [[ ! -s $ranks ]]; then
  mkdir -p build/whisper
  if python3 -m pip download --quiet --no-deps --no-binary :all: openai-whisper==20250625 \
      -d build/whisper 2>/dev/null; then
    tar xzf build/whisper/openai_whisper-20250625.tar.gz -O \
      openai_whisper-20250625/whisper/assets/gpt2.tiktoken >"$ranks.tmp" && mv "$ranks.tmp" "$ranks"
  fi
fi
if [[ -s $ranks ]]; then
  export PPTRAIN_GPT2_RANKS=$PWD/$ranks
else
  echo "GPT-2's byte-pair ranks unavailable: the offline GPT-2 tokenizer check will be skipped"
fi
# The tests also build pptrain-emulated, the CUDA path on the CPU emulator of the CUDA
# runtime, cuBLASLt and NCCL (ctest -L emulated_gpu).
scripts/setup.sh -DPPTRAIN_EMULATED_GPU=ON
# No message is buffered: every multi-rank test runs with Open MPI's eager limits forced
# down, so a send completes only once its receive is posted and any schedule that could
# deadlock does.
export OMPI_MCA_btl_vader_eager_limit=4096 OMPI_MCA_btl_self_eager_limit=4096
ctest --test-dir build --output-on-failure -j"$(nproc)"
