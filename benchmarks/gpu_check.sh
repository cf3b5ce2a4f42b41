#!/bin/bash
# Everything GPU-related in one pass, for a machine with an NVIDIA GPU (about 8 minutes on one):
#
#     bash benchmarks/gpu_check.sh DATA_DIR        # DATA_DIR/MNIST/raw holds the four unpacked files
#
# Each step prints its command, the lines that matter and its exit code. Read them against
# docs/measurements.md ("One NVIDIA H200"): what each step should show is said there.
cd "$(dirname "$0")/.." || exit
D=${1:?usage: bash benchmarks/gpu_check.sh DATA_DIR}; C=$(mktemp -d)
export PYTHONUNBUFFERED=1
step() {
    local name=$1 limit=$2; shift 2; echo; echo "=== $name: $*"
    timeout "$limit" "$@" 2>&1 | grep -v '^Epoch .* Batch\|^ *[0-9] |\|^true |'
    echo "--- $name: exit ${PIPESTATUS[0]}"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_capability())'
T="python3 mnist_train.py --data-dir $D"
step rung-1 240 bash -c "cd '$C' && python3 '$PWD/mnist_minimal.py' --data-dir '$(realpath "$D")'"
step default 120 $T --epochs 5 --save-path "$C/mlp.pt"
step too-big 60 $T --dry-run --hidden 100000000 --save-path "$C/big.pt"  # one line: this GPU has
step amp-auto 120 $T --epochs 2 --amp --model cnn --save-path "$C/cnn_amp.pt"
step amp-fp16 120 $T --epochs 1 --amp fp16 --model cnn --save-path "$C/cnn_fp16.pt"
step compile 180 $T --epochs 2 --compile --save-path "$C/mlp_compile.pt"
step compile-amp 180 $T --epochs 2 --compile --amp --model cnn --save-path "$C/cnn_compile.pt"
for run in a b; do  # the same epoch lines twice
    step "deterministic-$run" 120 $T --epochs 1 --deterministic --model cnn --augment \
        --save-path "$C/det_$run.pt"
done
step resume-whole 120 $T --epochs 2 --deterministic --model cnn --save-path "$C/whole.pt"
step resume-first 120 $T --epochs 1 --deterministic --model cnn --save-path "$C/part.pt"
step resume-rest 120 $T --resume --epochs 2 --save-path "$C/part.pt"  # ends as resume-whole
step ema-clip-dataloader 120 $T --epochs 1 --ema --clip-grad 1.0 --loader dataloader \
    --num-workers 2 --save-path "$C/dl.pt"
step torchrun-nccl 120 torchrun --standalone --nproc_per_node=1 mnist_train.py --data-dir "$D" \
    --epochs 1 --save-path "$C/ddp.pt"  # no warnings; the epoch line of the default run's first
step torchrun-too-many 120 torchrun --standalone --nproc_per_node=$(( $(nvidia-smi -L | wc -l) + 1 )) \
    mnist_train.py --data-dir "$D" --epochs 1 --save-path "$C/ddp2.pt"  # one line, exit 2
step predict-cuda 60 python3 predict.py --checkpoint "$C/cnn_amp.pt" --device cuda --top-k 2 samples/*
step predict-compiled 60 python3 predict.py --checkpoint "$C/cnn_compile.pt" samples/photo_3.jpg
step tests 300 env MNIST_DATA_DIR="$D" python3 -m pytest -q -p no:cacheprovider tests/
step bench-gpu 300 python3 benchmarks/bench_gpu.py --data-dir "$D"
rm -r "$C"
