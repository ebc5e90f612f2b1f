#!/usr/bin/env bash
# On one GPU: 2 SFT steps and 2 GRPO updates of Ratchet's own trainers on a randomly initialised
# model of SmolLM2-135M's shape in bf16, printing step times, tokens/s and peak GPU memory; the last
# line is one JSON object (ratchet/training/smoke.py says what runs). Extra arguments go to it,
# e.g. `--device cpu --tiny` for the same code on a CPU.
#
# Where no registry can be reached (a lent GPU machine with PyTorch, transformers and peft but not
# TRL), carry the pure-Python wheels the SFT trainer needs and point PYTHONPATH at them first:
#   pip download --no-deps -d .whl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "${PYTHON:-python3}" -m ratchet.training.smoke "$@"
