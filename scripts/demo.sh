#!/usr/bin/env bash
# The main job: the seed's CPU DDP guard trial end to end.
#   1. two guarded 2-rank gloo runs of the same declared workload (reference, candidate)
#   2. `traceml compare` of the pair (CI verdict + JSON/text artifacts)
#   3. how to open `traceml watch` on the runs
# Run from the repository root. Each invocation uses fresh run names (guarded runs never overwrite).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0          # CPU build on disk here; never an unpinned torch
python -m pip install -q -e .
[ -f traceml.yaml ] || cp examples/traceml.yaml traceml.yaml
suffix=$(date +%Y%m%d-%H%M%S)
export OMP_NUM_THREADS=1
for role in reference candidate; do
  traceml run examples/distributed/ddp_minimal.py --run-name "guard-$role-$suffix" \
    --nproc-per-node 2 --args --steps 20
done
set +e
traceml compare "logs/guard-reference-$suffix/final_summary.json" "logs/guard-candidate-$suffix/final_summary.json" \
  --max-step-time-regression-pct 1000 --output "compare/guard-reference-vs-candidate-$suffix"
rc=$?
set -e
echo
echo "compare exit code: $rc (0 within/faster, 4 slower, 3 inconclusive)"
echo "artifacts: compare/guard-reference-vs-candidate-$suffix.json and .txt"
echo "open the monitor on these runs:  traceml watch logs"
exit $rc
