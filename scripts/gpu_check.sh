#!/usr/bin/env bash
# What the CPU cannot show, on a machine with GPUs: one line per check (PASS / FAIL / SKIP), a summary, exit 1 if any
# check failed. Each check runs under its own `timeout`; its output goes to "${OUT:-/tmp}/gpu_check/<check>.log".
#
#   scripts/gpu_check.sh                      # on a GPU machine (checks: 7 minutes at most, GPU_CHECK_BUDGET)
#   GPU_CHECK_DEVICE=cpu scripts/gpu_check.sh # the plumbing on a CPU: gloo instead of NCCL, 2 ranks
#
# Checks, in order (one home, $WORKBENCH_HOME a fresh temporary directory, so later checks reuse earlier runs):
#   cuda-tests       the test suite's CUDA cases (pytest -k cuda; needs pytest)
#   shrink-direct    AttentionLite's column shrink vs the masked model on the device, in float32 and with TF32
#   shrink-run       `workbench run attentionlite --pruning column` on the device: the run's own shrunk-vs-masked check
#   torchrun-far-2   `run far` under a 2-process NCCL torchrun (SKIP 2-GPU with one GPU), every run complete
#   torchrun-far-1   the same under a 1-process NCCL torchrun
#   stream-2/1       `analyze attention --out X.zarr` streamed under a 2- (or 1-) process torchrun, equal to 1 process
#   stream-far-dep   a streamed `analyze dependency` of the FAR student (backward through its LSTMs) under torchrun
#   explain-vit/far  `workbench explain` (every explainer that applies, with the perturbation test) of the teacher and
#                    FAR on the device and on the CPU: per explainer, rank correlation >= 0.99 and AUCs within 0.02
#   features         `workbench features` (a crosscoder over the teacher and FAR) on the device and on the CPU: FVE
#                    within 0.03
#   figures          `workbench figures IDS --profile smoke --device cuda --jobs 1`: by default one figure per method
#                    whose data runs on the device (the whole smoke gallery is longer than this script's budget:
#                    GPU_CHECK_FIGURES=--all GPU_CHECK_FIGURES_TIMEOUT=1500 draws it)
# Environment: GPU_CHECK_DEVICE (cuda), GPU_CHECK_FIGURES (ids, or --all), GPU_CHECK_FIGURES_TIMEOUT (seconds, 300),
# GPU_CHECK_BUDGET (seconds for all checks, 420: a check gets at most what is left, fails unrun when under 20 s are),
# GPU_CHECK_SLOW (every limit and the budget times this, for a slow CPU; 1), PYTHON (python3). A `.whl/` folder in the
# repository root is installed first into /tmp/site (no index, no dependencies).
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
DEVICE=${GPU_CHECK_DEVICE:-cuda}
PY=${PYTHON:-python3}
LOG="${OUT:-/tmp}/gpu_check"
mkdir -p "$LOG"
export WORKBENCH_HOME
WORKBENCH_HOME=$(mktemp -d /tmp/gpu_check_home.XXXXXX)
export WORKBENCH_PROGRESS=0 PYTHONWARNINGS=ignore
START=$(date +%s)
BUDGET=$(( ${GPU_CHECK_BUDGET:-420} * ${GPU_CHECK_SLOW:-1} ))

if [ -d .whl ] && compgen -G ".whl/*.whl" > /dev/null; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      > "$LOG/install.log" 2>&1; then
    echo "installed $(ls .whl/*.whl | wc -l) wheels from .whl/ into /tmp/site"
  else
    echo "WARN: installing .whl/ failed (see $LOG/install.log)"
  fi
  export PYTHONPATH=/tmp/site:$REPO
else
  export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
fi

WB=("$PY" -m workbench.cli)
TORCHRUN=("$PY" -m torch.distributed.run --standalone)
PASSED=() FAILED=() SKIPPED=()

check() {  # check NAME SECONDS COMMAND... : run it under timeout, log it, print one line
  local name=$1 limit=$2 t0 rc dt
  shift 2
  t0=$(date +%s)
  left=$(( START + BUDGET - t0 ))
  if [ "$left" -lt 20 ]; then
    echo "FAIL $name: not run, no time left of the ${BUDGET} s budget (GPU_CHECK_BUDGET)"
    FAILED+=("$name")
    return
  fi
  limit=$(( limit * ${GPU_CHECK_SLOW:-1} ))
  limit=$(( limit < left ? limit : left ))
  timeout --kill-after=15 "$limit" "$@" > "$LOG/$name.log" 2>&1
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then
    echo "PASS $name (${dt} s)"
    PASSED+=("$name")
  else
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "FAIL $name: timed out after ${limit} s (log: $LOG/$name.log)"
    else
      echo "FAIL $name: exit $rc after ${dt} s (log: $LOG/$name.log)"
    fi
    grep -v '^\s*$' "$LOG/$name.log" | grep -iE 'error|failed|fail |assert|refus|differ|not complete' | tail -n 4 \
      | cut -c1-300 | sed 's/^/    /'
    FAILED+=("$name")
  fi
}

skip() {  # skip NAME LINE
  echo "SKIP $2"
  SKIPPED+=("$1")
}

info=$("$PY" - "$DEVICE" <<'EOF' 2> "$LOG/setup.log"
import sys

import torch

dev = sys.argv[1]
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
names = ", ".join(torch.cuda.get_device_name(i) for i in range(n)) or "none"
print(n if dev == "cuda" else 2)
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {n} GPU(s): {names}; checks on --device {dev}")
EOF
)
GPUS=$(echo "$info" | head -n 1)
echo "$info" | tail -n +2
if ! [[ "$GPUS" =~ ^[0-9]+$ ]]; then
  echo "FAIL setup: torch does not import: $(tail -n 3 "$LOG/setup.log")"
  exit 1
fi
if [ "$DEVICE" = cuda ] && [ "$GPUS" -lt 1 ]; then
  echo "FAIL setup: no CUDA GPU visible (GPU_CHECK_DEVICE=cpu checks the plumbing on a CPU)"
  exit 1
fi
RANKS=$(( GPUS >= 2 ? 2 : 1 ))
ON=(--device "$DEVICE")

# (e) the suite's CUDA cases, in the test files that name cuda (a case skips itself without a GPU; the monkeypatched
# torchrun set-up runs anywhere)
mapfile -t CUDA_FILES < <(grep -l -i cuda tests/test_*.py)
if "$PY" -c "import pytest" 2> /dev/null; then
  check cuda-tests 150 "$PY" -m pytest -q -p no:cacheprovider -m "not integration and not notebooks" -k cuda -rs \
    "${CUDA_FILES[@]}"
else
  skip cuda-tests "cuda-tests: pytest is not installed (put its wheels, with pluggy's and iniconfig's, in .whl/)"
fi

# (d) AttentionLite's column shrink: directly, then as the run does it after training (its tolerance, its device)
check shrink-direct 60 "$PY" scripts/gpu_check_shrink.py "${ON[@]}"
check shrink-run 120 "${WB[@]}" run attentionlite --pruning column --profile smoke "${ON[@]}"

# (b) FAR's chain (teacher -> distilled -> pruned) under torchrun: every rank on its own GPU, every run complete
if [ "$RANKS" -ge 2 ]; then
  check torchrun-far-2 150 bash -c "$(printf '%q ' "${TORCHRUN[@]}") --nproc_per_node 2 -m workbench.cli run far \
    --profile smoke --device $DEVICE --epochs 1 --images 128 && $PY scripts/gpu_check_verify.py runs teacher-vit-smoke \
    far-vit-smoke+e1.n128 far_pruned-vit-smoke+e1.n128"
else
  skip torchrun-far-2 "2-GPU: only 1 GPU (torchrun-far-2; FAR's chain runs on 1 NCCL rank below)"
fi
check torchrun-far-1 150 bash -c "$(printf '%q ' "${TORCHRUN[@]}") --nproc_per_node 1 -m workbench.cli run far \
  --profile smoke --device $DEVICE && $PY scripts/gpu_check_verify.py runs teacher-vit-smoke far-vit-smoke \
  far_pruned-vit-smoke"

# (c) streamed extraction under torchrun (NCCL on GPUs) against the same extraction in one plain process
S=$WORKBENCH_HOME/stores
STREAM=(--images 'demo:val[:96]' --batch-size 8 --chunk 16 --workers 2 "${ON[@]}")
check stream-1proc 90 "${WB[@]}" analyze attention --model teacher-vit-smoke "${STREAM[@]}" --out "$S/one.zarr"
check "stream-$RANKS" 90 bash -c "$(printf '%q ' "${TORCHRUN[@]}") --nproc_per_node $RANKS -m workbench.cli analyze \
  attention --model teacher-vit-smoke $(printf '%q ' "${STREAM[@]}") --out $S/ranks.zarr \
  && $PY scripts/gpu_check_verify.py stores $S/one.zarr $S/ranks.zarr"
[ "$RANKS" -ge 2 ] || skip stream-2 "2-GPU: only 1 GPU (stream-2; the streamed extraction ran on 1 NCCL rank)"
check stream-far-dep 90 bash -c "$(printf '%q ' "${TORCHRUN[@]}") --nproc_per_node $RANKS -m workbench.cli analyze \
  dependency --model far-vit-smoke --queries cls --layers 0,2 $(printf '%q ' "${STREAM[@]}") --out $S/far-dep.zarr"

# (f) explanations and crosscoders (#29, #30) on the device against the same command on the CPU: every explainer that
# applies to the ViT and to FAR (LSTMs: gradient and LRP methods) with Chefer's perturbation test, then a crosscoder
# over the teacher and FAR (same seed, same tokens), each compared with its CPU twin by gpu_check_verify.py
EXPLAIN_ALL=raw_attention,rollout,generic_attention,chefer_lrp,attnlrp,cp_lrp,gradcam,legrad,ig,saliency
twice() {  # twice NAME VERIFY ARGS... : `workbench ARGS --device D --out $S/NAME-D.nc` on the device, then on the CPU
  local name=$1 verify=$2 d
  shift 2
  for d in "$DEVICE" cpu; do
    "${WB[@]}" "$@" --device "$d" --out "$S/$name-$d.nc" || return 1
  done
  "$PY" scripts/gpu_check_verify.py "$verify" "$S/$name-$DEVICE.nc" "$S/$name-cpu.nc"
}
export -f twice
export DEVICE PY S
EX=(explain --images 'demo:val[:48]' --perturbation --ig-steps 16 --method "$EXPLAIN_ALL")
check explain-vit 120 bash -c "WB=($(printf '%q ' "${WB[@]}")); twice explain-vit explain $(printf '%q ' "${EX[@]}") \
  --model teacher-vit-smoke"
check explain-far 120 bash -c "WB=($(printf '%q ' "${WB[@]}")); twice explain-far explain $(printf '%q ' "${EX[@]}") \
  --model far-vit-smoke"
FEAT=(features --teacher teacher-vit-smoke --student far-vit-smoke --images 'demo:train[:1024]' --held-out
  'demo:val[:128]' --width 64 --k 8 --epochs 2)
check features 120 bash -c "WB=($(printf '%q ' "${WB[@]}")); twice features features $(printf '%q ' "${FEAT[@]}")"

# (a) the figures on the device, reusing the runs above, training the rest (one process: --jobs 1); the gallery's
# index and PNGs are copied flat into the log folder (figures-index.md, fig-<id>.png)
# teacher attention, FAR's retention and token dependency (backward through the LSTMs), Sparsifiner's masks, Non-deep's
# branch weight similarity (fig4's feature similarity took 508 s of the subset's 1161 s on the loaded 2-core CPU),
# AttentionLite's attention-transfer maps, SlimSwin's gate masks
SUBSET="teacher.fig1 far.fig4 far.fig6 sparsifiner.fig3 nondeep.fig5 attentionlite.at_maps slimswin.fig2"
read -r -a FIGS <<< "${GPU_CHECK_FIGURES:-$SUBSET}"
G=$WORKBENCH_HOME/figures
check figures "${GPU_CHECK_FIGURES_TIMEOUT:-300}" "${WB[@]}" figures "${FIGS[@]}" --profile smoke "${ON[@]}" --jobs 1 \
  --out "$G"
if [ -d "$G" ]; then
  [ -f "$G/index.md" ] && cp "$G/index.md" "$LOG/figures-index.md"
  n=0
  while IFS= read -r png; do
    cp "$png" "$LOG/fig-$(basename "$png")"
    n=$((n + 1))
  done < <(find "$G" -name '*.png' | sort)
  echo "    $n PNGs drawn (copied to $LOG/fig-*.png)"
fi

echo "summary: ${#PASSED[@]} passed, ${#FAILED[@]} failed${FAILED:+ (${FAILED[*]})}, ${#SKIPPED[@]} skipped;" \
  "$(( $(date +%s) - START )) s on --device $DEVICE; logs in $LOG; home $WORKBENCH_HOME"
[ "${#FAILED[@]}" -eq 0 ]
