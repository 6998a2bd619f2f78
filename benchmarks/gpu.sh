#!/usr/bin/env bash
# The speed benchmark on a CUDA GPU with JAX's GPU backend (python3 with a CUDA build of JAX,
# optax and matplotlib installed; no virtual environment needed). Writes speed_gpu.json with
# the device name into $OUT (the device tool's output folder) or results/. Planned to finish
# within 8 minutes; the time limit below keeps what was measured (rows are written as they
# finish) if it does not.
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${OUT:-results}"
mkdir -p "$out_dir"
python3 -c "import jax; assert jax.default_backend() == 'gpu', jax.devices(); print(jax.devices())"
PYTHONPATH=. PYTHONUNBUFFERED=1 timeout 460 python3 -m benchmarks.speed \
    --methods blelloch chunked --repeats 5 --out "$out_dir/speed_gpu.json" || true
test -s "$out_dir/speed_gpu.json"
