#!/usr/bin/env bash
# The shipped study's `defaults` / `evidence` arm run again (docs/results/study-6seed/README.md, "A defect in this
# study"): seeds 0 to 5 in a database of their own, on a fixed commit, in the background, resumable: run it again
# after any stop and `envlab experiment run` goes on where it stopped. Seed 0 checks that this commit reproduces the
# shipped run 32 stage by stage; seeds 1 to 5 replace runs 35, 38, 41, 44 and 47 (`envlab experiment adopt`).
#
#   bash scripts/study-rerun-evidence.sh [COMMIT]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$HOME/envlab-long}/rerun
commit=${1:-$(cat "$work/COMMIT" 2>/dev/null || git -C "$repo" rev-parse --short HEAD)}
python=$repo/.venv/bin/python
source "$repo/scripts/fixed-commit.sh"
fixed_commit "$repo" "$work" "$commit"
cd "$work"
export PYTHONPATH="$work/src" ENVLAB_RUNS="$work/runs" OMP_NUM_THREADS=1
db="$work/rerun.db"
if [ ! -f "$db" ]; then
    "$python" -m lab.cli experiment new --name defaults --scenario default --arms evidence --seeds 6 --stages 3 \
        --db "$db"
fi
nohup setsid nice -n 5 "$python" -m lab.cli experiment run defaults --workers 1 --threads 1 --db "$db" \
    >> "$work/rerun.log" 2>&1 &
echo "defaults / evidence, seeds 0-5, running at commit $commit; log: $work/rerun.log"
