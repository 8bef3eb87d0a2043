#!/usr/bin/env bash
# The CUDA path, checked on a machine with one NVIDIA GPU and a Python with torch + lm-eval:
#
#   scripts/gpu_check.sh [--device cuda|cpu] [--dtypes "bfloat16 float32"] [--reps N]
#                        [--max-overhead PCT] [--out DIR] [--dry-run]
#
# 1. Verdicts: for each dtype, `gatekeeper run` the demo suite (examples/gatekeeper.yaml, suite
#    device `auto`) on the base, harmless and regressed checkpoints, then `gatekeeper compare`:
#    harmless vs base must pass (exit 0), regressed vs base must fail (exit 1). In float32 the GPU
#    runs are also compared with the stored baseline, recorded on a CPU: same verdicts expected.
#    The run manifest must say the device really was the one asked for (no silent CPU fallback).
# 2. Overhead: `gatekeeper run` against the plain `lm_eval run` CLI on the same suite (same tasks,
#    include_path, model args, batch size, seeds, samples logged), alternating, REPS times each;
#    prints the medians and the overhead in %, which must be at most --max-overhead (default 2).
#
# --device cpu proves the script itself on a machine without a GPU (there the overhead goal is
# meaningless: pass --max-overhead 100). --dry-run prints the commands and runs nothing.
# PYTHON picks the interpreter (default python3). Exit 0: all checks passed; 1: a check failed;
# 2: bad usage or no CUDA. About 4-6 minutes on one GPU with the defaults.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
device=cuda dtypes="bfloat16 float32" reps=3 max_overhead=2 out="" dry=0

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "gpu_check: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --device) device=${2:-}; shift 2 || usage ;;
    --dtypes) dtypes=${2:-}; shift 2 || usage ;;
    --reps) reps=${2:-}; shift 2 || usage ;;
    --max-overhead) max_overhead=${2:-}; shift 2 || usage ;;
    --out) out=${2:-}; shift 2 || usage ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage ;;
    *) die "unknown argument '$1'; see scripts/gpu_check.sh --help" ;;
  esac
done
case $device in cuda|cpu) ;; *) die "--device '$device': use cuda or cpu" ;; esac
[[ $reps =~ ^[1-9][0-9]?$ ]] || die "--reps '$reps': a whole number from 1 to 99"
[[ $max_overhead =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--max-overhead '$max_overhead': a percentage, e.g. 2"
[ -n "$dtypes" ] || die "--dtypes is empty; e.g. --dtypes \"bfloat16 float32\""
for dt in $dtypes; do
  case $dt in bfloat16|float16|float32) ;; *) die "--dtypes: '$dt' is not bfloat16, float16 or float32" ;; esac
done

SUITE=examples/gatekeeper.yaml
STORED=examples/.gatekeeper/baselines/demo.json.gz
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 TQDM_DISABLE=1
cd "$ROOT"
[ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
mkdir -p "$out/logs"
# gatekeeper resolves `auto` itself; the lm_eval CLI is given the device that `auto` resolves to.
gk_device=$([ "$device" = cuda ] && echo auto || echo cpu)

if [ "$dry" = 0 ]; then
  "$PY" -c 'import torch, lm_eval' 2>/dev/null || die "$PY cannot import torch and lm_eval; install gatekeeper-eval[eval] (or set PYTHON)"
  if [ "$device" = cuda ]; then
    "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
      || die "CUDA is not available to $PY (torch.cuda.is_available() is False); check the driver, or pass --device cpu"
    "$PY" -c 'import torch; print("gpu:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| CUDA", torch.version.cuda)'
  fi
fi

# The plain lm_eval command equivalent to `gatekeeper run` on the suite, one argument a line.
mapfile -t LM_EVAL_ARGS < <("$PY" - "$SUITE" "$device" <<'EOF'
import sys
from gatekeeper.suite.suite import load_suite

suite = load_suite(sys.argv[1])
shots = {t.num_fewshot for t in suite.tasks}
if len(shots) != 1 or any(t.limit or t.repeats or t.gen_kwargs for t in suite.tasks):
    sys.exit(f"{sys.argv[1]}: per-task settings the lm_eval CLI cannot express; time another suite")
s, m = suite.seeds, suite.model
args = ["--model", "hf", "--model_args", "pretrained=MODEL,dtype=" + str(m["dtype"]),
        "--tasks", ",".join(suite.task_names), "--batch_size", str(m["batch_size"]),
        "--device", sys.argv[2], "--log_samples",
        "--seed", f"{s['random']},{s['numpy']},{s['torch']},{s['fewshot']}",
        "--include_path", str(suite.include_path)]
if None not in shots:
    args += ["--num_fewshot", str(shots.pop())]
print("\n".join(args))
EOF
)
[ "${#LM_EVAL_ARGS[@]}" -gt 0 ] || die "$SUITE: could not derive the lm_eval command (see above)"

failures=0
check() {  # check WHAT EXPECTED_EXIT COMMAND...: run it, compare its exit code; log in $out/logs/
  local what=$1 want=$2; shift 2
  if [ "$dry" = 1 ]; then echo "would run: $*"; return; fi
  local got=0 log
  log="$out/logs/$(echo "$what" | tr -c 'A-Za-z0-9\n' _).log"
  "$@" >"$log" 2>&1 || got=$?
  if [ "$got" = "$want" ]; then
    echo "ok    $what (exit $got)"
  else
    echo "FAIL  $what: exit $got, expected $want; log: $log"
    failures=$((failures + 1))
  fi
}
ran_as() {  # ran_as RUN_DIR: "<device> <dtype>" from the run's manifest, or nothing
  local manifest
  for manifest in "$1"/*/gatekeeper-manifest.json; do
    [ -f "$manifest" ] && "$PY" -c 'import json, sys; m = json.load(open(sys.argv[1])); print(m["device"], m["dtype"])' "$manifest"
  done
}

suite_for() {  # suite_for DTYPE: the demo suite in that dtype. A suite pins its dtype, and compare refuses
  # a run made with another (`--dtype` is an override): examples/gatekeeper.yaml for its own dtype, else a
  # copy under $out with the dtype and an absolute include_path (the same tasks)
  local own
  own=$(sed -n 's/^  dtype: *//p' "$SUITE")
  if [ "$1" = "$own" ]; then echo "$SUITE"; return; fi
  mkdir -p "$out/suites"
  sed -e "s|^include_path: .*|include_path: $ROOT/examples/tasks|" -e "s|^  dtype: .*|  dtype: $1|" "$SUITE" \
    >"$out/suites/$1.yaml"
  echo "$out/suites/$1.yaml"
}

echo "== verdicts on $device ($dtypes), outputs in $out"
for dt in $dtypes; do
  dt_suite=$(suite_for "$dt")
  for ckpt in base harmless regressed; do
    check "run $ckpt $dt" 0 "$PY" -m gatekeeper run --suite "$dt_suite" --model "examples/checkpoints/$ckpt" \
      --dtype "$dt" --device "$gk_device" --out "$out/$dt/$ckpt"
  done
  for ckpt in base harmless regressed; do  # no silent fallback to the CPU or another dtype
    [ "$dry" = 1 ] && continue
    got=$(ran_as "$out/$dt/$ckpt")
    if [[ $got == "$device"*" $dt" ]]; then echo "ok    $ckpt $dt ran as: $got"
    else echo "FAIL  $ckpt $dt ran as '${got:-no manifest found}', expected $device $dt"; failures=$((failures + 1)); fi
  done
  check "harmless vs base, $dt: pass" 0 "$PY" -m gatekeeper compare "$out/$dt/base" "$out/$dt/harmless" --suite "$dt_suite"
  check "regressed vs base, $dt: regression" 1 "$PY" -m gatekeeper compare "$out/$dt/base" "$out/$dt/regressed" --suite "$dt_suite"
  if [ "$dt" = float32 ]; then
    check "harmless vs stored CPU baseline: pass" 0 "$PY" -m gatekeeper compare "$STORED" "$out/$dt/harmless" --suite "$SUITE"
    check "regressed vs stored CPU baseline: regression" 1 "$PY" -m gatekeeper compare "$STORED" "$out/$dt/regressed" --suite "$SUITE"
  fi
done

echo "== overhead: gatekeeper run vs lm_eval CLI, suite dtype, $reps rep(s) each, alternating"
lm_eval_cmd=("$PY" -m lm_eval run "${LM_EVAL_ARGS[@]/pretrained=MODEL/pretrained=examples/checkpoints/base}")
gk_cmd=("$PY" -m gatekeeper run --suite "$SUITE" --model examples/checkpoints/base --device "$gk_device")
if [ "$dry" = 1 ]; then
  echo "would time: ${gk_cmd[*]} --out DIR"
  echo "would time: ${lm_eval_cmd[*]} --output_path DIR"
  exit 0
fi
timed() {  # timed LOG COMMAND...: prints wall seconds; exits 1 if the command fails
  local log=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >"$log" 2>&1 || { echo "FAIL  $* (log: $log)" >&2; return 1; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}
gk_times=() cli_times=()
for rep in $(seq "$reps"); do
  gk_times+=("$(timed "$out/time-gk-$rep.log" "${gk_cmd[@]}" --out "$out/time/gk-$rep")") || exit 1
  cli_times+=("$(timed "$out/time-cli-$rep.log" "${lm_eval_cmd[@]}" --output_path "$out/time/cli-$rep")") || exit 1
  echo "rep $rep: gatekeeper run ${gk_times[-1]} s, lm_eval CLI ${cli_times[-1]} s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
gk=$(median "${gk_times[@]}") cli=$(median "${cli_times[@]}")
overhead=$(awk -v g="$gk" -v c="$cli" 'BEGIN { printf "%.1f", (g / c - 1) * 100 }')
echo "median: gatekeeper run $gk s, lm_eval CLI $cli s, overhead $overhead % (goal <= $max_overhead %)"
if awk -v o="$overhead" -v m="$max_overhead" 'BEGIN { exit !(o > m) }'; then
  echo "FAIL  overhead $overhead % is over $max_overhead %"
  failures=$((failures + 1))
fi

if [ "$failures" -gt 0 ]; then echo "gpu_check: $failures check(s) failed"; exit 1; fi
echo "gpu_check: all checks passed on $device"
