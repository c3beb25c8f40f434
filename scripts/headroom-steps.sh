#!/usr/bin/env bash
# Does the environment matter more with more GRPO steps per stage? The headroom screen's worst and best configs
# trained again for one stage from stage 0 on FACTOR times the boards (so FACTOR times the steps: 128 x FACTOR),
# 2 seeds each, in the screen's database, on the screen's commit and settings (so stage 0's evaluation is the
# screen's, shared), then the experiment's report: best minus worst, paired by seed, beside the screen's at 128 steps.
# Resumable: run it again after any stop.
#
#   bash scripts/headroom-steps.sh          # FACTOR=4 by default; SCREEN=folder of the finished screen
#
# The report lands in $SCREEN/steps-report (report.md); it is shipped beside the screen's in docs/results/headroom/.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
screen=${SCREEN:-${WORK:-$HOME/envlab-long}/headroom}
factor=${FACTOR:-4}
workers=${WORKERS:-2}
python=$repo/.venv/bin/python
gains=$screen/report/gains.csv
if [ ! -f "$gains" ]; then  # the screen's script writes its report once every run is done
    echo "the headroom screen in $screen is not done (no report/gains.csv): bash scripts/headroom-screen.sh" >&2
    exit 2
fi
cd "$screen"
export PYTHONPATH="$screen/src" ENVLAB_RUNS="$screen/runs" OMP_NUM_THREADS=1
db="$screen/headroom.db"
configs="$screen/configs"
name=headroom-steps
if [ ! -f "$screen/made-$name" ]; then
    # the configs' rows, best first (the report's order): the first and the last
    best=$(awk -F, 'NR > 1 && $2 == "config" {print $1}' "$gains" | head -1)
    worst=$(awk -F, 'NR > 1 && $2 == "config" {print $1}' "$gains" | tail -1)
    "$python" -m lab.cli experiment new --name "$name" --arms "$worst=static:$configs/$worst.json,$best=static:$configs/$best.json" \
        --seeds 2 --instances $((512 * factor)) --stages 1 --scenario default --config "$configs/initial.json" \
        --agent-counts 2,3,4,5 --validation-agents 3,4,5 --dev-per-size 3 --policy "${POLICY:-tiny}" --db "$db"
    touch "$screen/made-$name"
fi
nohup setsid nice -n 5 bash -c "
    '$python' -m lab.cli experiment run $name --workers $workers --threads 1 --db '$db' &&
    '$python' -m lab.cli experiment report $name --db '$db' --out '$screen/steps-report'
" >> "$screen/$name.log" 2>&1 &
echo "$name: the screen's worst and best configs at $((128 * factor)) GRPO steps, 2 seeds; log: $screen/$name.log"
