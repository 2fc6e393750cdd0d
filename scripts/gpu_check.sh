#!/usr/bin/env bash
# The CUDA checks in one run on a GPU machine (docs/gpu.md): tests/gpu, the CLI on CUDA with a
# split schedule in bf16 and fp16, and llama2-7b's full-size blocks with host-homed state
# against the same blocks whole on the device. Writes a log and the runs' summaries to $OUT
# (default: gpu_check/), eight files. Needs torch with CUDA and ratrain's dependencies
# importable (`pip install -e .[test]`, or PYTHONPATH=src).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export RATRAIN_CACHE=${RATRAIN_CACHE:-/tmp/ratrain_cache}
BLOCKS=${BLOCKS:-4}
# which of the checks below run (7b_host: that run alone; device, offload, offload32, ckpt: not
# by default)
SECTIONS=${SECTIONS:-"tests cli 7b learn profile"}
LOG=$OUT/log.txt
wants() { [[ " $SECTIONS " == *" $1 "* ]]; }
# SMOKE=1: every section's commands on this CPU at a toy size (llama2-7b's shapes shrunk to a
# 64-wide model of 64 tokens, 2 steps, the benches on `tiny` in fp32): their flags, files and
# log lines checked before a GPU session spends its minutes on them
# (tests/unit/test_gpu_check.py). Its numbers mean nothing.
if [[ -n "${SMOKE:-}" ]]; then
  SHAPE="vocab_size: 512, dim: 64, n_layers: $BLOCKS, n_heads: 4, n_kv_heads: 4, ffn_dim: 96,
        max_seq_len: 64}"; SEQ=64; STEPS=2; CLI_STEPS=2
  PROFILE_SHAPE=(--model tiny --seq-len 64 --micro-batch-size 1 --dtype bfloat16 --repeats 1)
  BENCH_SHAPE=(--device cpu --model tiny --seq-len 32 --dtype float32 --steps 2)
  CKPT_SHAPE=(--steps 4 --every 2)
else
  SHAPE="vocab_size: 32000, dim: 4096, n_layers: $BLOCKS, n_heads: 32, n_kv_heads: 32,
        ffn_dim: 11008, max_seq_len: 4096}"; SEQ=4096; STEPS=6; CLI_STEPS=20
  PROFILE_SHAPE=(--model llama2-7b --seq-len 4096 --micro-batch-size 1 --dtype bfloat16 --repeats 2)
  BENCH_SHAPE=()
  CKPT_SHAPE=()
fi

{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'threads', torch.get_num_threads())"
  echo "cores $(nproc)"; free -g | head -2
  for m in click tqdm yaml safetensors tokenizers matplotlib numpy pytest; do
    $PY -c "import $m" 2>/dev/null || echo "missing module: $m"; done; } >> "$LOG" 2>&1

if wants tests; then
  SECONDS=0
  timeout 180 $PY -m pytest -q -p no:cacheprovider tests/gpu -rs > "$OUT/tests_gpu.txt" 2>&1
  echo "tests/gpu rc=$? in ${SECONDS}s: $(tail -1 "$OUT/tests_gpu.txt")" >> "$LOG"
fi

text=/tmp/gpu_check_text.txt
$PY -c "
import random; r = random.Random(0); w = 'the quick brown fox jumps over lazy dog pipeline bubble'.split()
open('$text', 'w').write('\n'.join(' '.join(r.choice(w) for _ in range(12)) for _ in range(60000)))"

run() {  # name, where to, timeout, flags: a run's summary to where/name.json, its stderr's tail to the log
  # (no checkpoints: a 4-block run's is 13 GB, and the machine's disk is 64 GiB; ckpt measures them)
  local name=$1 to=$2 limit=$3; shift 3
  rm -rf "/tmp/$name"  # scratch: a new run refuses a directory that holds one (an earlier call's)
  SECONDS=0
  timeout "$limit" $PY -m ratrain.cli train --data "$text" --no-report --no-progress --no-checkpoints \
    --run-dir "/tmp/$name" --json "$@" > "$to/$name.json" 2> "/tmp/$name.err"
  echo "== $name rc=$? in ${SECONDS}s" >> "$LOG"; tail -8 "/tmp/$name.err" >> "$LOG"
  $PY -c "import json, sys; s = json.load(open(sys.argv[1])); print({k: s.get(k) for k in
    ('final_loss', 'val_loss', 'tokens_per_s', 'peak_memory_bytes', 'schedule', 'weight_grad', 'mfu')})" \
    "$to/$name.json" >> "$LOG" 2>&1
}
wants cli && for dtype in bfloat16 float16; do
  run "cli_zbh1_$dtype" /tmp 90 --steps "$CLI_STEPS" --dtype $dtype --schedule zbh1 --weight-grad grouped \
    --activation recompute --view-window 1 --state-home host
done

# llama2-7b's dimensions with $BLOCKS of its 32 blocks, 4096 tokens, bf16 views: fp32 masters,
# gradients and AdamW state in pinned host memory, views made one unit ahead, activations
# recomputed; then the same blocks with everything on the device, activations kept.
cat > /tmp/llama7b_blocks.yaml <<YAML
model: {name: llama2-7b-${BLOCKS}blocks, $SHAPE
train: {seq_len: $SEQ, global_batch: 1, micro_batch_size: 1, dtype: bfloat16, steps: $STEPS,
        warmup_steps: 0, lr: 0.0001, eval_every: 0}
YAML
if wants 7b || wants 7b_host; then
run llama7b_host "$OUT" 150 --config /tmp/llama7b_blocks.yaml --state-home host --activation recompute --view-window 1
cp /tmp/llama7b_host/trace.json "$OUT/llama7b_host.trace.json" 2>/dev/null
fi
if wants 7b; then
run llama7b_device "$OUT" 150 --config /tmp/llama7b_blocks.yaml --state-home device --activation keep
run llama7b_device_fp16 /tmp 150 --config /tmp/llama7b_blocks.yaml --state-home device --activation keep \
  --dtype float16
cat /tmp/llama7b_host/metrics.jsonl /tmp/llama7b_device/metrics.jsonl \
  /tmp/llama7b_device_fp16/metrics.jsonl > "$OUT/metrics_7b.jsonl" 2>/dev/null
fi

# State partly on the device (--device-units): the host-homed run above, 4 sequences a step in
# groups of 4, with no unit and with the first 2 (the embedding and a block, ~5.3 GB more on
# the device) keeping their state on the GPU. Not by default.
if wants device; then
for k in 0 2; do
  run "llama7b_host_du$k" "$OUT" 200 --config /tmp/llama7b_blocks.yaml --state-home host \
    --activation recompute --view-window 1 --global-batch 4 --micro-batch-group 4 --device-units $k
done
fi

# Does a 7B-wide model learn on the GPU? The same blocks on the device, 40 steps with warmup
# (6 steps without one are too few to tell).
if wants learn; then
sed -e "s/steps: $STEPS,/steps: $((STEPS * 20 / 3)),/" -e 's/warmup_steps: 0, lr: 0.0001/warmup_steps: 10, lr: 0.0003/' \
  /tmp/llama7b_blocks.yaml > /tmp/llama7b_learn.yaml
run llama7b_learn /tmp 150 --config /tmp/llama7b_learn.yaml --state-home device --activation keep
$PY -c "import json; print('learn losses', [round(json.loads(l)['loss'], 3) for l in
  open('/tmp/llama7b_learn/metrics.jsonl') if 'loss' in json.loads(l)][::4])" >> "$LOG" 2>&1
fi

# The simulator on this GPU's own profile (llama2-7b's block at this shape) against both runs;
# PROFILE=FILE: an earlier one instead of measuring anew.
if wants profile; then
if [[ -n "${PROFILE:-}" ]]; then cp "$PROFILE" "$OUT/gpu_profile.yaml"; else
SECONDS=0
timeout 210 $PY -m ratrain.cli profile "${PROFILE_SHAPE[@]}" --out "$OUT/gpu_profile.yaml" \
  >> "$LOG" 2>&1
echo "== profile rc=$? in ${SECONDS}s" >> "$LOG"
fi
for flags in "--state-home host --activation recompute --view-window 1" "--state-home device --activation keep"; do
  timeout 60 $PY -m ratrain.cli simulate --config /tmp/llama7b_blocks.yaml \
    --profile "$OUT/gpu_profile.yaml" $flags >> "$OUT/simulate.txt" 2>&1
done
fi
# ratrain against FSDP2 with CPU offload (bench/gpu_offload.py), both under a 20 GB allocator
# cap, 4096 tokens, bf16. offload: llama2-7b's first 8 blocks, global batch 16, 6 steps (~3 min:
# each peer micro-batch size that does not fit costs a process and a model build). offload32:
# all 32 blocks, global batch $OFFLOAD_BATCH (16; 1 too), ratrain on the plan `ratrain plan`
# finds under 20 GB on this repository's H200 profile; ~108 GB of host state per row, ~6-9 min.
offload() {  # name, timeout, flags
  local name=$1 limit=$2; shift 2
  SECONDS=0
  timeout "$limit" $PY bench/gpu_offload.py --out "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name rc=$? in ${SECONDS}s" >> "$LOG"; tail -30 "$OUT/$name.txt" >> "$LOG"
}
wants offload && offload gpu_offload_8blocks 300 --layers 8 --steps 6 --peer-micro-batch-sizes 8,4,2,1 \
  "${BENCH_SHAPE[@]}"
# OFFLOAD_ROWS=ratrain or peer: that row alone (a call each, within a call's 10 minutes).
# OFFLOAD_HOST=111.2GB: ratrain's plan bounded to that host memory (`ratrain plan
# --host-memory-budget`; 100 GB of host-homed state after the margin). OFFLOAD_HOST_GRAD=bfloat16:
# the plan's host-homed gradients in bf16 (--host-grad-dtype; 13.5 GB less host state at 7B)
B=${OFFLOAD_BATCH:-16}
wants offload32 && offload "gpu_offload_32blocks_b$B${OFFLOAD_ROWS:+_$OFFLOAD_ROWS}${OFFLOAD_HOST:+_host}${OFFLOAD_HOST_GRAD:+_$OFFLOAD_HOST_GRAD}" \
  580 --steps 4 --rows "${OFFLOAD_ROWS:-both}" --global-batch "$B" \
  --plan-flags "${OFFLOAD_HOST:+--host-memory-budget $OFFLOAD_HOST}${OFFLOAD_HOST_GRAD:+ --host-grad-dtype $OFFLOAD_HOST_GRAD}" \
  --plan-profile bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml \
  --peer-micro-batch-sizes "$( ((B >= 4)) && echo 4,2,1 || echo 1)" "${BENCH_SHAPE[@]}"
# A checkpoint saved while training goes on, and resumed (bench/checkpoint_save.py): llama2-7b's
# dimensions with as many blocks as two checkpoints of 12 bytes a parameter leave 10% of
# $CKPT_DIR's disk free (the mid-run one stays until the end's is complete), host-homed state as
# the 7B runs above, one micro-batch of 4 sequences of 4096 a step; one save at step $CKPT_EVERY in the background,
# then the run resumed from it with its losses compared. Not by default; ~2-3 min (up to ~7 on a
# disk of ~300 MB/s: two 30 GB saves, each read back for its sha256, and the resume's check).
if wants ckpt; then
CKPT_DIR=${CKPT_DIR:-/tmp}
free=$(df -B1 --output=avail "$CKPT_DIR" | tail -1)
ckpt_blocks=$(( (free * 9 / 10 / 24 - 262148096) / 202383360 ))
# CKPT_MAX_BLOCKS (default 32, all of llama2-7b's): fewer at most; tests/unit/test_gpu_check.py
# takes 1, as on its CPU each toy block costs the save's runs seconds and its disk bounds nothing
max_blocks=${CKPT_MAX_BLOCKS:-32}
ckpt_blocks=$(( ckpt_blocks > max_blocks ? max_blocks : ckpt_blocks ))
echo "== ckpt: $free bytes free in $CKPT_DIR: $ckpt_blocks blocks" >> "$LOG"
if (( ckpt_blocks >= 1 )); then
sed -e "s/n_layers: $BLOCKS,/n_layers: $ckpt_blocks,/" -e "s/${BLOCKS}blocks/${ckpt_blocks}blocks/" \
  /tmp/llama7b_blocks.yaml > /tmp/llama7b_ckpt.yaml
SECONDS=0
E=${CKPT_EVERY:-24}
timeout 560 $PY bench/checkpoint_save.py --config /tmp/llama7b_ckpt.yaml --global-batch 4 \
  --steps $((2 * E)) --every "$E" --rounds 1 --modes async --resume-check --dir "$CKPT_DIR" \
  --train-args "--state-home host --activation recompute --view-window 1" \
  --out "$OUT/checkpoint_save.json" "${CKPT_SHAPE[@]}" > "$OUT/checkpoint_save.txt" 2>&1
echo "== ckpt rc=$? in ${SECONDS}s" >> "$LOG"; tail -5 "$OUT/checkpoint_save.txt" >> "$LOG"
fi
fi
ls -la "$OUT" >> "$LOG"
