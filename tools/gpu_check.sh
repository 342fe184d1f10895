#!/usr/bin/env bash
# The book on a CUDA machine, in one call of at most about 9 minutes (issue 40), in this order:
#   1. the training-step benchmark alone on the GPU (DecoderLM vs nanoGPT at both shapes, LlamaLM
#      vs Hugging Face's Llama: step time, MFU, peak memory)               -> OUTDIR/bench.txt
#   2. the CUDA-parametrised tests                                         -> OUTDIR/cuda_tests.log
#   3. chapter 13's long model, the chosen candidate only, its three seeds at once on the GPU,
#      each for its recorded step count, scored beside the shipped record  -> OUTDIR/long_s*.json
#   4. nbval over every chapter with the GPU visible (beside 3: the chapters compute on the CPU)
#                                                                          -> OUTDIR/nbval.log
#
#   bash tools/gpu_check.sh [OUTDIR]
#
# It never resets or reconfigures the device (no nvidia-smi -r, no clocks, no MIG changes).
# For a machine that has python3 with a CUDA build of PyTorch (and NumPy, SciPy, scikit-learn,
# matplotlib, tqdm) but not the notebook tools and no network: put wheels of nbval and its
# Jupyter dependencies for that Python in .whl/ first (README, "On a GPU"); they are installed
# into /tmp/site. Everything is written under OUTDIR (default _build/gpu); summary.txt last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-_build/gpu}
mkdir -p "$OUTDIR"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing .whl/ failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, torch, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUTDIR/machine.txt"
ONE="OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1"
NBVAL="--nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg --nbval-cell-timeout 300"
t0=$SECONDS
# 1. alone on the GPU, so its timings see no other work
BENCH=${BENCH:-benchmarks/gpu_train_step.py}
if [ -f "$BENCH" ]; then
  timeout 150 python3 "$BENCH" 2>&1 | tee "$OUTDIR/bench.txt"
  echo "benchmark exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$OUTDIR/machine.txt"
fi
# 3. the long model's three seeds share the GPU (as the shipped runs did); each scores on 4 CPU threads
pids=()
for s in 0 1 2; do
  OMP_NUM_THREADS=4 timeout ${LONG_TIMEOUT:-330} python3 tools/gpu_long.py --seed $s --out "$OUTDIR" \
    >"$OUTDIR/long_s$s.log" 2>&1 &
  pids+=($!)
done
# 2. then 4, on the remaining CPU cores, while the GPU trains
env $ONE timeout 120 python3 -m pytest -q -p no:cacheprovider -n 2 --continue-on-collection-errors tests -k cuda \
  >"$OUTDIR/cuda_tests.log" 2>&1
echo "cuda tests exit $? after $((SECONDS - t0)) s" | tee -a "$OUTDIR/machine.txt"
env $ONE timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 --dist loadfile $NBVAL notebooks \
  >"$OUTDIR/nbval.log" 2>&1
echo "nbval exit $? after $((SECONDS - t0)) s" | tee -a "$OUTDIR/machine.txt"
for i in 0 1 2; do wait ${pids[$i]}; echo "long seed $i exit $?" | tee -a "$OUTDIR/machine.txt"; done
{ cat "$OUTDIR/machine.txt"; echo "== bench"; tail -12 "$OUTDIR/bench.txt" 2>/dev/null
  echo "== cuda tests"; tail -3 "$OUTDIR/cuda_tests.log"
  echo "== nbval"; grep -E "passed|failed" "$OUTDIR/nbval.log" | tail -3
  echo "== long model (retrained vs shipped)"
  python3 - "$OUTDIR" <<'PY'
import json, sys, pathlib
for p in sorted(pathlib.Path(sys.argv[1]).glob("long_s*.json")):
    r = json.loads(p.read_text())
    a, b = r["retrained"], r["shipped"]
    print(f"seed {r['seed']}: steps {r['steps']} in {r['train_seconds']} s; "
          + "; ".join(f"{k} {a[k]:.4f} vs {b[k]:.4f} ({a[k] - b[k]:+.4f})" for k in ("validation", "test", "dynamic_test"))
          + f"; shipped seed spread: validation {r['shipped_seed_spread']['validation']:.4f}, test {r['shipped_seed_spread']['test']:.4f}")
PY
  echo "total $((SECONDS - t0)) s"
} | tee "$OUTDIR/summary.txt"
