#!/usr/bin/env bash
# The install step of the GitHub Action (action.yml); inputs arrive as environment variables (see run.sh).
#
#   PRECAUDIT_INSTALL  what to pip install: one requirement (precaudit==0.1.0, a git URL, a path); default: the
#                      action's own folder, so the audit runs the version the workflow pinned with `uses: ...@ref`
#   PRECAUDIT_TORCH    true: first the CPU build of torch (PyPI's default build on Linux is the CUDA one, gigabytes
#                      a CI run does not need) and onnxscript, for PyTorch models and traced mode on them
set -euo pipefail

target="${PRECAUDIT_INSTALL:-}"
if [ -z "$target" ]; then
  target="${GITHUB_ACTION_PATH:?GITHUB_ACTION_PATH is not set: give the install input}"
fi
python -I -m pip install --quiet --upgrade pip
if [ "${PRECAUDIT_TORCH:-false}" = "true" ]; then
  python -I -m pip install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  python -I -m pip install --quiet "onnxscript>=0.5"
fi
python -I -m pip install --quiet -- "$target"
