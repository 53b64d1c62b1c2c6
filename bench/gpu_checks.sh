#!/usr/bin/env bash
# Tests whose point only shows on a GPU, run there (CI runs them on CPU too):
# - an async checkpoint started at step N still holds step N after step N+1 donates the state
#   (CPU ignores donation; a GPU reuses the donated buffers at once): from the device snapshot
#   of a one-process async save;
# - one-process async saves prune old checkpoints on the background thread, not the loop's.
# Usage, on a GPU machine with pytest installed: bash bench/gpu_checks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}"
python3 -m pytest -q -p no:cacheprovider \
  "tests/integration/test_checkpoint_async.py::test_async_save_holds_step_n_although_step_n_plus_1_donates_its_buffers" \
  "tests/integration/test_checkpoint_async.py::test_one_process_async_saves_prune_off_the_loop_thread"
