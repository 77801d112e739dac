#!/usr/bin/env bash
# A python with PyTorch and transformers, for the tests that load pptrain's exports with
# GPT2LMHeadModel.from_pretrained: Debian's python3-torch (CPU) and transformers 4.40.2
# from PyPI, in a venv that sees the system packages. Prints the python's path; exits 1
# with a message on stderr where they cannot be installed.
# Usage: scripts/torch_env.sh VENV_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$1
if ! "$venv/bin/python" -c "import torch, transformers" 2>/dev/null; then
  scripts/install_packages.sh python3-torch python3-venv >&2 ||
    { echo "python3-torch could not be installed" >&2; exit 1; }
  /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
  "$venv/bin/python" -m pip install --quiet transformers==4.40.2 >&2 ||
    { echo "transformers could not be installed" >&2; exit 1; }
  "$venv/bin/python" -c "import torch, transformers" >&2
fi
echo "$(cd "$venv" && pwd)/bin/python"
