#!/bin/bash
# Simulated against measured step time on this machine's one GPU: `autopar profile` (op times on
# the GPU and the runtime calibration of one NCCL rank), then `autopar train --device cuda` and
# `autopar simulate` of the accuracy benchmark's four models at its sizes and of three larger ones,
# single-device, with a measured and a simulated Chrome trace of rnnlm's step.  The accuracy
# benchmark itself needs 2 ranks (2 GPUs); on one GPU this is its counterpart.
#
#   OUT=gpu-check bash benchmarks/gpu/one-gpu.sh       # from a source checkout, autopar installed
#
# PY: the python with autopar installed (default python3).  DEV=cpu: the same steps on one CPU
# rank (a dry run of this script).  DEADLINE: seconds after which no further step starts
# (default 400).  WHEELS: a folder of wheels (autopar's and its missing dependencies) to install
# into /tmp/site first, on a machine that cannot reach a package index.  Results: OUT/logs.tgz
# (every step's stdout and stderr, summary.txt, steps.txt), OUT/profile.json and the traces.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-check}
PY=${PY:-python3}
DEV=${DEV:-cuda}
DEADLINE=${DEADLINE:-400}
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=$PWD/examples/models${PYTHONPATH:+:$PYTHONPATH}
if [ -n "${WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $WHEELS/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
if [ "$DEV" = cuda ]; then
  nvidia-smi -L > $L/env.txt 2>&1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >> $L/env.txt 2>&1
fi
$PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__,
                                 torch.cuda.is_available() and torch.cuda.get_device_name(0))" >> $L/env.txt 2>&1
cat $L/env.txt
AP=($PY -c 'import sys; from autopar.cli import main; sys.exit(main())')
P=$L/profile.json
if [ "$DEV" = cuda ]; then
  LABEL=$($PY -c "import torch;print(torch.cuda.get_device_name(0).replace(' ','-'))")
  cat > $L/one-gpu.yaml <<YAML
apiVersion: autopar.dev/v1alpha1
kind: Topology
metadata: {name: one-gpu, description: this machine's one GPU}
spec:
  nodes:
    - name: node0
      gpus: {product: $LABEL, count: 1}
YAML
  TOPO=$L/one-gpu.yaml
else
  TOPO=local:1
fi
step() {  # name timeout command...
  local name=$1 t=$2; shift 2
  local left=$((DEADLINE - SECONDS))
  if [ $left -lt 20 ]; then echo "$name skipped: past the deadline" | tee -a $L/steps.txt; return; fi
  [ $t -gt $left ] && t=$left
  local t0=$SECONDS
  timeout $t "$@" > $L/$name.out 2> $L/$name.err
  local rc=$?
  printf '%-28s rc=%-3s %4d s\n' $name $rc $((SECONDS - t0)) | tee -a $L/steps.txt
  [ $rc = 0 ] || tail -15 $L/$name.err
}
summ() {  # name of a train step: predicted / measured / error, also into summary.txt
  $PY - $L/$1.out <<'PYX' 2>&1 | tee -a $L/summary.txt
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(sys.argv[1], "no JSON:", e); sys.exit()
print(f"{d['model']:<14} {d['strategy']:<14} predicted {d.get('predicted_step_s')} measured {d['measured_step_s']:.6f} "
      f"cv {d.get('measured_cv', 0):.3f} error {d.get('prediction_error')} parts {d.get('predicted_parts_s')} "
      f"| {d.get('prediction')}")
PYX
}
RNN="-o batch=16 -o embed=256 -o hidden=256 -o vocab=8192 -o steps=8"
ALEX="-o batch=32 -o image=63 -o classes=100 -o fc=512 -o dropout=0.0"
TRF="-o batch=8 -o seq=64 -o vocab=4096 -o d=128 -o layers=2 -o heads=4"
TAG="-o batch=32"
# the larger sizes of the earlier GPU rounds (docs/simulation.md, "On a GPU")
RNNB="-o batch=64 -o steps=20"
ALEXB="-o batch=128"
TRFB="-o batch=8 -o seq=512 -o layers=6"
TR="--strategy single-device --nproc 1 --device $DEV --topology $TOPO --profile-cache $P --steps 40 --json"
step profile-rnnlm 150 "${AP[@]}" profile -m rnnlm $RNN -t local:1 --profile-cache $P --json
step train-rnnlm 90 "${AP[@]}" train -m rnnlm $RNN $TR --trace $L/rnnlm-measured.trace.json
step sim-rnnlm 60 "${AP[@]}" simulate -m rnnlm $RNN -t $TOPO --profile-cache $P -s single-device --json \
  --trace $L/rnnlm-simulated.trace.json
summ train-rnnlm
measure() {  # name model options...: profile (the calibration is rnnlm's), train single-device, summarize
  local name=$1 model=$2; shift 2
  step profile-$name 90 "${AP[@]}" profile -m $model "$@" -t local:1 --profile-cache $P --no-calibrate --json
  step train-$name 90 "${AP[@]}" train -m $model "$@" $TR
  summ train-$name
}
measure alexnet alexnet $ALEX
measure transformer transformer $TRF
measure tagger tagger:tagger $TAG
measure rnnlm-big rnnlm $RNNB
measure alexnet-big alexnet $ALEXB
measure transformer-big transformer $TRFB
cp $P $L/*.trace.json $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
ls -la $OUT
