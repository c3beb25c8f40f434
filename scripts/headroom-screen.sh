#!/usr/bin/env bash
# The headroom screen (docs/experiments.md, "Headroom screen"; lab/study/headroom.py): one stage from stage 0 on each
# of the 12 configs (2 seeds) and on 6 random draws, scored on the 3- to 5-agent validation set, then the report.
# In a database of its own, on a fixed commit, in the background, resumable: run it again after any stop and each
# `envlab experiment run` goes on where it stopped; the configs and the two experiments are made once.
#
#   bash scripts/headroom-screen.sh [COMMIT]     # POLICY=path/to/policy for another policy than `tiny`
#                                                # WORKERS=K workers of one torch thread (default 2: one a core here)
#
# The report lands in $WORK/headroom/report (report.md, gains.csv); it is shipped as docs/results/headroom/.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$HOME/envlab-long}/headroom
commit=${1:-$(cat "$work/COMMIT" 2>/dev/null || git -C "$repo" rev-parse --short HEAD)}
policy=${POLICY:-tiny}
workers=${WORKERS:-2}
python=$repo/.venv/bin/python
source "$repo/scripts/fixed-commit.sh"
fixed_commit "$repo" "$work" "$commit"
cd "$work"
export PYTHONPATH="$work/src" ENVLAB_RUNS="$work/runs" OMP_NUM_THREADS=1
db="$work/headroom.db"
configs="$work/configs"
if [ ! -f "$configs/initial.json" ]; then
    "$python" -m lab.cli headroom make-configs --out "$configs" > "$work/commands.txt"
fi
shared=(--stages 1 --scenario default --config "$configs/initial.json" --agent-counts 2,3,4,5
        --validation-agents 3,4,5 --dev-per-size 3 --policy "$policy" --db "$db")
if [ ! -f "$work/made-headroom" ]; then
    arms=$(cd "$configs" && for f in mix*.json; do printf '%s=static:%s,' "${f%.json}" "$configs/$f"; done)
    "$python" -m lab.cli experiment new --name headroom --arms "${arms%,}" --seeds 2 "${shared[@]}"
    touch "$work/made-headroom"
fi
if [ ! -f "$work/made-headroom-random" ]; then
    "$python" -m lab.cli experiment new --name headroom-random --arms random --seeds 6 "${shared[@]}"
    touch "$work/made-headroom-random"
fi
# A worker takes any queued job of the database, so the first command's worker also moves the random runs.
nohup setsid nice -n 5 bash -c "
    '$python' -m lab.cli experiment run headroom --workers $workers --threads 1 --db '$db' &&
    '$python' -m lab.cli experiment run headroom-random --workers $workers --threads 1 --db '$db' &&
    '$python' -m lab.cli headroom report headroom --db '$db' --configs '$configs' --out '$work/report'
" >> "$work/headroom.log" 2>&1 &
echo "headroom screen: 24 config runs + 6 random draws at commit $commit; log: $work/headroom.log; report: $work/report"
