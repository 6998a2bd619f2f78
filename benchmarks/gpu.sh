#!/usr/bin/env bash
# The speed benchmark on one CUDA GPU (JAX's GPU backend), in one call of at most ~8 minutes:
# the structured cells' width rows first (width_gpu.json), then the paper's grids (RNN and GRU, H = 20: T sweep at B = 16, B sweep at T = 1000), then
# larger hidden sizes (RNN, H = 64, 256, 1024 at T = 1000, B = 1, 16, 256: the dense scan does
# ~H times BP's arithmetic, so somewhere there the parallel scan stops paying), the most
# expensive last. Methods: BP (always, the baseline), Auto(), Blelloch(), Chunked(); one that
# does not fit the device's memory is recorded as skipped. Runs with the machine's python3 (a
# CUDA build of JAX, numpy, optax; no virtual environment): the project goes on PYTHONPATH.
# Writes width_gpu.json, char_lm_gpu/ (the language model's training step: BP, Auto and the
# Newton forward), speed_gpu.json (rewritten as rows finish; "complete": true at the end),
# sharded_gpu.json (bppsa.Sharded on the device, if time is left), total_gpu.json (one
# sequence's total gradient time, if time is left), newton_gpu.jsonl (the Newton
# forward, if time is left), vgg11_gpu/benchmark.json (the pruned VGG-11's backward over its
# layers, if time is left) and speed_gpu.log into $OUT (the device tool's output folder), else
# results/.
#
#   bash benchmarks/gpu.sh            # on the GPU machine; stops at once without a GPU backend
#   bash benchmarks/gpu.sh --dry-run  # the same grids with tiny sizes, anywhere, in seconds
#
# Exit status: 0 complete; 124 or 137 the time limit ended it (the JSON keeps what was
# measured); otherwise the benchmark's. A benchmark killed by a signal (a crash inside XLA) is
# restarted with --resume while time is left: it keeps the rows measured and skips the one the
# crash happened in (recorded as "unfinished").
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${OUT:-results}"
mkdir -p "$out_dir"
json="$out_dir/speed_gpu.json"
log="$out_dir/speed_gpu.log"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
limit_s=460 # the whole run, restarts included (one device call may run about 8 minutes)
restart_s=60 # the least time left worth a restart (JAX's import and the GPU's start-up)
deadline=$((SECONDS + limit_s))
args=(
    --require-backend gpu
    --methods auto blelloch chunked
    --cells rnn gru --hidden 20
    --lengths 10 30 100 300 1000 3000 10000 30000 --t-batch 16
    --batches 1 2 4 8 16 32 64 128 256 --b-length 1000
    --hiddens 64 256 1024 --h-cells rnn --h-batches 1 16 256 --h-length 1000
    --repeats 5 --row-seconds 10
    --out "$json"
)
rm -f "$json"
: >"$log"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$log" || true
fi
# Width first (benchmarks/width.py, the newest claim), within width_s: ParaRNN's diagonal GRU
# and CIFG LSTM, whose Jacobians stay diagonal / 2x2-block, at H = 256, 1024, 4096, T = 1k,
# 4k, 16k, B = 8, 1: the forward (lax.scan vs the Newton forward) and the backward (BP vs
# Auto and Blelloch). Points not started in time are left out ("complete": false).
width_s=150
width_args=(--require-backend gpu --cells diagonal-gru cifg-lstm --hiddens 256 1024 4096
    --lengths 1000 4096 16384 --batches 8 1 --inputs 256 --methods auto blelloch --newton
    --repeats 3 --seconds $((width_s - 40)))
[[ " $* " == *" --dry-run "* ]] && width_args=(--cells diagonal-gru cifg-lstm --hiddens 8
    --lengths 16 --batches 2 --inputs 4 --methods auto blelloch --newton --repeats 1)
width_status=0
timeout --kill-after=10 "$width_s" python3 -m benchmarks.width "${width_args[@]}" \
    --out "$out_dir/width_gpu.json" 2>&1 | tee -a "$log" || width_status=$?
if ((width_status == 2)); then # no GPU backend: the speed benchmark below says so and stops
    echo "gpu.sh: benchmarks.width measured nothing (not a GPU backend)" | tee -a "$log"
fi
# The language model's whole training step (experiments/char_lm.py, the --gpu configuration's
# cell, layers and T = 2048 at H = 1024, B = 8): BP, BPPSA (Auto) and BPPSA with the Newton
# forward in lockstep for a few iterations, on the SYNTHETIC corpus in the Shakespeare layout
# (no download on the GPU machine; a step's time does not depend on the text). Step times are
# in char_lm_gpu/summary.json and <method>/metrics.jsonl; within lm_s, skipped without a GPU.
lm_s=120
fixture="$out_dir/char_lm_fixture"
lm_args=(--gpu --width 1024 --layers 2 --batch 8 --iterations 8 --warmup 2 --eval-every 1000
    --eval-batches 1 --sample-length 8 --final-sample-length 8)
[[ " $* " == *" --dry-run "* ]] && lm_args=(--gpu --dry-run --iterations 2)
if ((width_status != 2)); then
    python3 -c "from experiments._char_lm_fixture import write_fixture as w; w('$fixture', speeches=400)"
    timeout --kill-after=10 "$lm_s" python3 -m experiments.char_lm "${lm_args[@]}" \
        --data "$fixture" --methods bp bppsa bppsa-newton --out "$out_dir" \
        --name char_lm_gpu --overwrite --no-progress 2>&1 | tee -a "$log" ||
        echo "gpu.sh: experiments.char_lm exit $? (the other results stand)" | tee -a "$log"
fi
resume=()
status=0
for attempt in 1 2 3; do
    left=$((deadline - SECONDS))
    if ((attempt > 1 && left < restart_s)); then
        echo "gpu.sh: ${left} s left, too little to restart" | tee -a "$log"
        break
    fi
    status=0
    timeout --kill-after=10 "$left" python3 -m benchmarks.speed "${args[@]}" \
        ${resume[@]+"${resume[@]}"} "$@" 2>&1 | tee -a "$log" || status=$?
    if ((status <= 128 || status == 137)); then # done, refused, failed or timed out
        break
    fi
    echo "gpu.sh: benchmarks.speed died (exit ${status}); restarting with --resume" | tee -a "$log"
    resume=(--resume)
done
# bppsa.Sharded on this machine's device(s) (one GPU: the local scan alone, P = 1), if time is
# left and the speed benchmark did not refuse to run; its claims for several devices rest on
# step counts (benchmarks/sharded.py), and this row checks that its path runs on a GPU.
sharded_args=(--devices 1 --lengths 1000 10000 --repeats 3)
[[ " $* " == *" --dry-run "* ]] && sharded_args=(--devices 1 --lengths 5 --repeats 1)
left=$((deadline - SECONDS))
if ((status == 0 || status == 124 || status == 137)) && ((left >= 45)); then
    timeout --kill-after=10 "$left" python3 -m benchmarks.sharded "${sharded_args[@]}" \
        --out "$out_dir/sharded_gpu.json" 2>&1 | tee -a "$log" ||
        echo "gpu.sh: benchmarks.sharded exit $? (the speed results stand)" | tee -a "$log"
fi
# One sequence outside jax.vmap (benchmarks/total.py: RNN and GRU, H = 20): bppsa.grad's
# default against jax.grad in total time, T = 1k to 100k, if time is left.
total_args=(--cells rnn gru --lengths 1000 10000 100000 --repeats 5)
[[ " $* " == *" --dry-run "* ]] && total_args=(--cells rnn --lengths 5 --repeats 1)
left=$((deadline - SECONDS))
if ((status == 0 || status == 124 || status == 137)) && ((left >= 40)); then
    timeout --kill-after=10 "$left" python3 -m benchmarks.total "${total_args[@]}" \
        --out "$out_dir/total_gpu.json" 2>&1 | tee -a "$log" ||
        echo "gpu.sh: benchmarks.total exit $? (the speed results stand)" | tee -a "$log"
fi
# The Newton forward (benchmarks/newton.py, H = 20, float32): iterations and fallbacks at
# T = 1k and 10k, and the wall-clock of the forward (against lax.scan) and of whole gradients
# (BP; Blelloch backward after the sequential and the Newton forward) at T = 1k, 10k, 30k, B = 16.
newton_args=(--require-backend gpu --cases rnn-init rnn-trained gru-irmas --dtypes float32
    --lengths 1000 10000 --timing --timing-lengths 1000 10000 30000 --rounds 5)
[[ " $* " == *" --dry-run "* ]] && newton_args=(--cases rnn-init --dry-run --timing)
left=$((deadline - SECONDS))
if ((status == 0 || status == 124 || status == 137)) && ((left >= 60)); then
    timeout --kill-after=10 "$left" python3 -m benchmarks.newton "${newton_args[@]}" \
        --out "$out_dir/newton_gpu.jsonl" 2>&1 | tee -a "$log" ||
        echo "gpu.sh: benchmarks.newton exit $? (the speed results stand)" | tee -a "$log"
fi
# Pruned VGG-11's backward over its layers (experiments/pruned_vgg11.py benchmark, 32x32): dense
# back-propagation vs the sequential sparse chain and two parallel levels, if time is left.
vgg_args=(--paper --batches 1 16 --sparsities 0.97 0.99 --repeats 3
    --methods bp sequential-jacobians blelloch-2)
[[ " $* " == *" --dry-run "* ]] && vgg_args=(--input-size 8 --width-divisor 16 --batches 1
    --sparsities 0.9 --repeats 1 --methods bp sequential-jacobians)
left=$((deadline - SECONDS))
if ((status == 0 || status == 124 || status == 137)) && ((left >= 90)); then
    timeout --kill-after=10 "$left" python3 -m experiments.pruned_vgg11 benchmark \
        "${vgg_args[@]}" --out "$out_dir" --name vgg11_gpu --overwrite --no-progress 2>&1 |
        tee -a "$log" ||
        echo "gpu.sh: pruned_vgg11 benchmark exit $? (the speed results stand)" | tee -a "$log"
fi
if [[ ! -s "$json" ]]; then
    echo "gpu.sh: no results in ${json} (exit ${status})" | tee -a "$log"
    exit $((status == 0 ? 1 : status))
fi
echo "gpu.sh: exit ${status}, results in ${json}" | tee -a "$log"
exit "$status"
