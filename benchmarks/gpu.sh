#!/usr/bin/env bash
# The GPU report: every benchmark with a speed or accuracy claim, on one CUDA GPU (JAX's GPU
# backend), in ONE device call that fits 8.5 minutes with the machine's start (limit_s below,
# JAX's start included in each step; the start took 1-1.5 minutes). Every gradient is timed by
# the timing package (experiments/timing): each quantity its own program. In order, each step
# within its budget and the run's deadline (a step not started in time is left out; the files
# keep what finished), the most wanted first, so that a call cut short still brings them:
#   1. the fused forward alone (benchmarks/fused.py --parts forward: lax.scan against
#      forward="fused" and the default forward, us per step; RNN, GRU, LSTM at H = 20, B = 16,
#      T = 10k, 30k, 1k; the diagonal GRU at H = 1024, 4096, T = 4096, B = 8):
#      fused_forward_gpu.jsonl. It stops the run at once without a GPU backend (exit 2)
#  1a. the fused loops on Triton against Mosaic GPU (tensor cores), and the LSTM against cuDNN
#      (benchmarks/fused.py --parts backends): forward alone and whole value_and_grad with both
#      loops fused, each backend's plan (why it refused); the LSTM at H = 128, 256, 512,
#      B = 64, T = 10k first: fused_backends_gpu.jsonl
#  1b. what the kernel lab predicts (benchmarks/fused.py --parts lab): each library cell's fused
#      forward and FusedSequential() backward loop, H = 20, 64, 128 (in that order), T = 1000,
#      B = 16, at the profile's warps and at 4, step-ahead loads on and off: the measured step
#      beside the lab's estimate (benchmarks/results/kernel_lab/kernels.jsonl), for
#      fit_profile --kernel-lab: fused_lab_gpu.jsonl
#   2. whole value_and_grad: BP, bppsa's defaults, fused + Blelloch(), with each run's plan;
#      RNN, GRU, H = 20, B = 16, T = 10k, 30k: fused_grad_gpu.jsonl
#   3. cuDNN's LSTM (jax.experimental.rnn.lstm) against bppsa's LSTM with its defaults,
#      H = 20, 128, T = 10k, 1k, B = 16: fused_cudnn_gpu.jsonl
#   4. the fused kernel's compile grid (RNN, GRU, LSTM, diagonal GRU at H = 16..4096; its
#      "compile-summary" row: the largest size each cell compiled at, and the points the
#      profile's envelope admits that did not compile and run right, fit_profile --compile):
#      fused_compile_gpu.jsonl
#   5. the language model's training step (experiments/char_lm.py --gpu, H = 1024, 2 layers,
#      T = 2048, B = 8: BP, Auto (its forward the fused kernel: the summary records each
#      run's plan), Auto with the Newton forward, on the synthetic corpus): char_lm_gpu/
#   6. the paper's grids (benchmarks/speed.py, RNN and GRU, H = 20: T sweep at B = 16, B sweep
#      at T = 1000; BP, Auto(), Blelloch()): speed_gpu.json
#   7. the gradients' error against float64 with the library's products at "highest" and at
#      JAX's default (TF32 there), BP at JAX's default (benchmarks/accuracy.py): accuracy_gpu.json
#   8. what the precision costs: one sequence's gradient, BP against bppsa at "highest" and at
#      "default" (benchmarks/total.py): total_gpu.json
#   9. the structured cells (benchmarks/width.py: ParaRNN's diagonal GRU and CIFG LSTM at
#      H = 256, 1024, 4096): width_gpu.json; what the default structure check costs a found
#      diagonal (IndRNN written in plain jnp, H = 1024): structure_check_gpu.json
#  10. the Newton forward and the whole step with the forward's policy (benchmarks/newton.py),
#      and quasi-Newton's forward on a dense autodiff GRU: newton_gpu.jsonl
#  11. as time allows: larger hidden sizes (speed_h_gpu.json), bppsa.Sharded on this device
#      (sharded_gpu.json), the pruned VGG-11's backward over its layers (vgg11_gpu/).
# Runs with the machine's python3 (a CUDA build of JAX, numpy, optax; no virtual environment):
# the project goes on PYTHONPATH. Everything goes to $OUT (the device tool's output folder),
# else results/: the folder gpu-results/, packed at the end (also after a time-out) into ONE
# archive, gpu-results.tar.gz, beside the log gpu.log.
#
#   bash benchmarks/gpu.sh            # on the GPU machine; stops at once without a GPU backend
#   bash benchmarks/gpu.sh --dry-run  # the same steps with tiny sizes, anywhere, no deadline
#                                     # (GPU_SH_DRY_LIMIT_S=N: the run's limit, N seconds)
#
# Exit status: 0 complete; 2 not a GPU backend (nothing else runs); 124 or 137 the time limit
# ended the paper's grids (the JSON keeps what was measured); otherwise the speed benchmark's.
# A step of the fused rows or the speed benchmark killed by a signal (a crash inside XLA or
# Triton) runs again while its time lasts: it keeps the rows measured and skips the one the
# crash happened in.
set -euo pipefail
cd "$(dirname "$0")/.."
out_root="${OUT:-results}"
results="$out_root/gpu-results"
log="$out_root/gpu.log"
json="$results/speed_gpu.json"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
dry=0
[[ " $* " == *" --dry-run "* ]] && dry=1
limit_s=400 # the whole run: with the machine's start (up to 1.5 minutes) within 8.5 minutes
restart_s=60 # the least time left worth a restart of the speed benchmark
speed_s=100  # the paper's grids (measured on an H200 twice already: gpu-h200*/)
# A dry run tests the script's path, not its clock: no budget applies (every step runs, however
# loaded the machine) unless GPU_SH_DRY_LIMIT_S sets the whole run's limit in seconds.
if ((dry)); then
    limit_s=${GPU_SH_DRY_LIMIT_S:-0}
fi
unbounded=$((limit_s <= 0))
((unbounded)) && limit_s=86400 && speed_s=86400
deadline=$((SECONDS + limit_s))
scratch="$(mktemp -d)"
rm -rf "$results" "$out_root/gpu-results.tar.gz"
mkdir -p "$results"
: >"$log"

pack() { # one archive of the results and the log (not the model checkpoints), whatever ended
    # the run; its exit status kept
    local status=$?
    cp "$log" "$results/gpu.log" || true
    tar -czf "$out_root/gpu-results.tar.gz" --exclude="*.npz" -C "$out_root" gpu-results ||
        echo "gpu.sh: no archive"
    rm -rf "$results" "$scratch" || true
    exit "$status"
}
trap pack EXIT

say() { echo "gpu.sh: $*" | tee -a "$log"; }

# grant NAME BUDGET_S MIN_S: sets granted to min(BUDGET_S, the time left) (the time left in a
# run without a deadline), or to 0, saying that NAME is not run, where fewer than MIN_S are left.
grant() {
    local left=$((deadline - SECONDS))
    granted=0
    if ((left < $3)); then
        say "${left} s left: $1 not run"
        return 0
    fi
    granted=$2
    if ((unbounded || granted > left)); then granted=$left; fi
    return 0
}

# step NAME BUDGET_S MIN_S COMMAND...: runs COMMAND within what grant gives it; its failure is
# logged, and the other results stand.
step() {
    local name=$1
    grant "$1" "$2" "$3"
    shift 3
    ((granted > 0)) || return 0
    local status=0
    timeout --kill-after=10 "$granted" "$@" 2>&1 | tee -a "$log" || status=$?
    ((status == 0)) || say "${name} exit ${status} (the other results stand)"
}

# fused NAME BUDGET_S MIN_S PART: the part PART of benchmarks/fused.py as a step (its file
# fused_PART_gpu.jsonl); a run killed by a signal (a crash inside XLA or Triton) runs again
# while the step's time lasts: it skips the cases done and records the one it died in. Returns
# the last run's exit status (2: not a GPU backend).
fused() {
    local name=$1 part=$4 left ends attempt status=0
    grant "$1" "$2" "$3"
    ((granted > 0)) || return 0
    ends=$((SECONDS + granted))
    local args=(--parts "$part" --out "$results/fused_${part}_gpu.jsonl")
    if ((dry)); then args+=(--dry-run); else args+=(--require-backend gpu); fi
    for attempt in 1 2 3; do
        left=$((ends - SECONDS))
        ((attempt > 1 && left < 15)) && break
        status=0 # --seconds: no case starts in the last 10 s, so that the part's table prints
        timeout --kill-after=10 "$left" python3 -m benchmarks.fused "${args[@]}" \
            --seconds $((left > 20 ? left - 10 : left)) 2>&1 | tee -a "$log" || status=$?
        ((status > 128 && status != 137)) || break
        say "${name} died (exit ${status}); running it again (it skips the cases done)"
    done
    ((status == 0 || status == 2)) || say "${name} exit ${status} (the other results stand)"
    return "$status"
}

if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$log" || true
fi

# 1-4. The fused forward's rows (issue 43), the forward alone first: its refusal without a GPU
# backend (exit 2) ends the run; then the backends' rows (the LSTM against cuDNN first), then
# the kernel lab's pairs, H = 20 first.
status=0
fused fused_forward 75 30 forward || status=$?
if ((status == 2)); then
    say "not a GPU backend: nothing else runs"
    exit 2
fi
fused fused_backends 50 20 backends || true
fused fused_lab 60 20 lab || true
fused fused_grad 55 25 grad || true
fused fused_cudnn 35 20 cudnn || true
fused fused_compile 30 20 compile || true

# 5. The language model's whole training step, on the SYNTHETIC corpus in the Shakespeare
# layout (no download on the GPU machine; a step's time does not depend on the text).
fixture="$scratch/char_lm_fixture"
lm_args=(--gpu --width 1024 --layers 2 --batch 8 --iterations 8 --warmup 2 --eval-every 1000
    --eval-batches 1 --sample-length 8 --final-sample-length 8)
((dry)) && lm_args=(--gpu --dry-run --iterations 2)
python3 -c "from experiments._char_lm_fixture import write_fixture as w; w('$fixture', speeches=400)"
step char_lm 70 40 python3 -m experiments.char_lm "${lm_args[@]}" --data "$fixture" \
    --methods bp bppsa bppsa-newton --out "$results" --name char_lm_gpu --overwrite --no-progress

# 6. The paper's grids, within the run's deadline.
speed_args=(
    --require-backend gpu
    --methods auto blelloch
    --cells rnn gru --hidden 20
    --lengths 10 30 100 300 1000 3000 10000 30000 --t-batch 16
    --batches 1 2 4 8 16 32 64 128 256 --b-length 1000
    --hiddens
    --repeats 5 --row-seconds 3
    --out "$json"
)
resume=()
status=0
speed_ran=0
speed_deadline=$((SECONDS + speed_s))
((speed_deadline > deadline)) && speed_deadline=$deadline
for attempt in 1 2 3; do
    left=$((speed_deadline - SECONDS))
    if ((attempt == 1 && left < 30)); then
        say "${left} s left: speed not run"
        break
    fi
    if ((attempt > 1 && left < restart_s)); then
        say "${left} s left, too little to restart"
        break
    fi
    status=0
    speed_ran=1
    timeout --kill-after=10 "$left" python3 -m benchmarks.speed "${speed_args[@]}" \
        ${resume[@]+"${resume[@]}"} "$@" 2>&1 | tee -a "$log" || status=$?
    if ((status <= 128 || status == 137)); then # done, refused, failed or timed out
        break
    fi
    say "benchmarks.speed died (exit ${status}); restarting with --resume"
    resume=(--resume)
done
if ! ((status == 0 || status == 124 || status == 137)); then
    say "benchmarks.speed exit ${status}: nothing else runs"
    exit "$status"
fi

# 7. The gradients' error against float64: BP and Blelloch() as a user runs them (JAX's default
# matmul precision, TF32 on recent NVIDIA GPUs), Blelloch's own products at "highest" (the
# library's default) and at "default".
accuracy_args=(--cells rnn gru --regimes contractive --lengths 1000 10000 30000 --methods blelloch)
((dry)) && accuracy_args=(--quick --cells rnn --regimes contractive --lengths 5 --methods blelloch)
step accuracy 55 25 python3 -m benchmarks.accuracy "${accuracy_args[@]}" \
    --cell-precision default --precisions highest default --out "$results/accuracy_gpu.json"

# 8. What the precision costs, and one sequence's total (B = 1, outside jax.vmap): jax.grad
# against bppsa.grad's default, bppsa's products at "highest" and at "default".
total_args=(--cells rnn gru --lengths 1000 10000 --repeats 5)
((dry)) && total_args=(--cells rnn --lengths 5 --repeats 1)
step total 35 20 python3 -m benchmarks.total "${total_args[@]}" --precisions default \
    --out "$results/total_gpu.json"

# 9. The structured cells, whose Jacobians stay diagonal / 2x2-block: the forward (lax.scan vs
# the Newton forward) and the gradient (BP vs Auto and Blelloch), T = 1k, 4k, 16k, B = 8, 1.
width_s=80
width_args=(--require-backend gpu --cells diagonal-gru cifg-lstm --hiddens 256 1024 4096
    --lengths 1000 4096 16384 --batches 8 1 --inputs 256 --methods auto blelloch --newton
    --repeats 3 --seconds $((width_s - 30)))
((dry)) && width_args=(--cells diagonal-gru cifg-lstm --hiddens 8 --lengths 16 --batches 2
    --inputs 4 --methods auto blelloch --newton --repeats 1)
step width "$width_s" 40 python3 -m benchmarks.width "${width_args[@]}" \
    --out "$results/width_gpu.json"

# 9b. The default structure check (one step's J^T on two vectors against the step's VJP): the
# backward of a diagonal found in a plain-jnp IndRNN with and without it, T = 4096, B = 8.
check_args=(--require-backend gpu --cells indrnn-user --hiddens 1024 --lengths 4096 --batches 8
    --inputs 256 --methods auto blelloch --structure-check --repeats 3)
((dry)) && check_args=(--cells indrnn-user --hiddens 8 --lengths 16 --batches 2 --inputs 4
    --methods blelloch --structure-check --repeats 1)
step structure_check 30 15 python3 -m benchmarks.width "${check_args[@]}" \
    --out "$results/structure_check_gpu.json"

# 10. The Newton forward (H = 20, float32): iterations and fallbacks at T = 1k and 10k, the
# forward against lax.scan and whole gradients (BP; Blelloch after the sequential and after the
# Newton forward; bppsa's defaults, whose forward policy's choice, reason and Newton iterations
# each row records) for the RNN and the GRU at T = 1k, 10k, 30k, B = 16 and 1.
newton_args=(--require-backend gpu --cases rnn-init rnn-trained gru-irmas --dtypes float32
    --lengths 1000 10000 --timing --timing-lengths 1000 10000 30000
    --timing-cases rnn-init gru-irmas --timing-batches 16 1 --rounds 5)
((dry)) && newton_args=(--cases rnn-init --dry-run --timing --timing-cases rnn-init gru-irmas
    --timing-batches 2 1)
step newton 60 30 python3 -m benchmarks.newton "${newton_args[@]}" \
    --out "$results/newton_gpu.jsonl"

# 10b. Quasi-Newton's forward on a dense autodiff GRU (the diagonals from its element-aligned
# paths, O(H) per step beyond the cell) against lax.scan, T = 4096, B = 8, H = 256 and 1024.
dense_args=(--require-backend gpu --cases --dense-quasi 256 4096 8 --dense-quasi 1024 4096 8
    --rounds 3)
((dry)) && dense_args=(--cases --dry-run --dense-quasi 8 16 2)
step dense_quasi 30 15 python3 -m benchmarks.newton "${dense_args[@]}" \
    --out "$results/newton_gpu.jsonl"

# 11. As time allows. Larger hidden sizes (RNN, H = 64, 256, 1024 at T = 1000, B = 1, 16, 256:
# the dense scan does ~H times BP's arithmetic; where does it stop paying?), the most expensive
# last; bppsa.Sharded on this device (P = 1: its path runs on a GPU); the pruned VGG-11.
h_args=(--require-backend gpu --methods auto blelloch chunked --cells rnn --lengths --batches
    --hiddens 64 256 1024 --h-cells rnn --h-batches 1 16 256 --h-length 1000
    --repeats 3 --row-seconds 3)
step h_sweep 90 40 python3 -m benchmarks.speed "${h_args[@]}" "$@" \
    --out "$results/speed_h_gpu.json"
sharded_args=(--devices 1 --lengths 1000 10000 --repeats 3)
((dry)) && sharded_args=(--devices 1 --lengths 5 --repeats 1)
step sharded 40 30 python3 -m benchmarks.sharded "${sharded_args[@]}" \
    --out "$results/sharded_gpu.json"
vgg_args=(--paper --batches 1 16 --sparsities 0.97 0.99 --repeats 3
    --methods bp sequential-jacobians blelloch-2)
((dry)) && vgg_args=(--input-size 8 --width-divisor 16 --batches 1 --sparsities 0.9 --repeats 1
    --methods bp sequential-jacobians)
step vgg11 90 60 python3 -m experiments.pruned_vgg11 benchmark "${vgg_args[@]}" \
    --out "$results" --name vgg11_gpu --overwrite --no-progress

if ((speed_ran)) && [[ ! -s "$json" ]]; then
    say "no results in ${json} (exit ${status})"
    exit $((status == 0 ? 1 : status))
fi
say "exit ${status}, results in $out_root/gpu-results.tar.gz"
exit "$status"
