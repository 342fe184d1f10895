#!/usr/bin/env bash
# The book on a CUDA machine, in one go: the CUDA-parametrised tests, nbval over every
# chapter with the GPU visible, then the training-step benchmark alone on the GPU.
#
#   bash tools/gpu_check.sh [OUTDIR]
#
# For a machine that has python3 with a CUDA build of PyTorch (and NumPy, SciPy,
# scikit-learn, matplotlib, tqdm) but not the notebook tools and no network: put wheels
# of nbval and its Jupyter dependencies for that Python in .whl/ first (README, "On a
# GPU"); they are installed into /tmp/site. Logs go to OUTDIR (default _build/gpu).
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
# 1 and 2 side by side (CPU-bound, 16 cores), each on its own workers.
env $ONE timeout 290 python3 -m pytest -q -p no:cacheprovider -n 6 --continue-on-collection-errors tests -k cuda \
  >"$OUTDIR/cuda_tests.log" 2>&1 &
tests_pid=$!
env $ONE timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 --dist loadfile $NBVAL notebooks \
  >"$OUTDIR/nbval.log" 2>&1
echo "nbval exit $?" | tee -a "$OUTDIR/machine.txt"
wait $tests_pid
echo "cuda tests exit $?" | tee -a "$OUTDIR/machine.txt"
tail -3 "$OUTDIR/cuda_tests.log"; grep -E "passed|failed" "$OUTDIR/nbval.log" | tail -3
# 3 alone on the GPU.
BENCH=${BENCH:-benchmarks/gpu_train_step.py}
if [ -f "$BENCH" ]; then
  timeout 180 python3 "$BENCH" 2>&1 | tee "$OUTDIR/bench.txt"
  echo "benchmark exit $?" | tee -a "$OUTDIR/machine.txt"
fi
