#!/usr/bin/env bash
# The warm start of the 2-to-5-agent tiny policy, in the background on a fixed commit, resumable: run it again after
# any stop (a session's end, a reboot) and it goes on where it stopped. Labels first (every core), then training
# (one torch thread, nice'd, so the machine stays usable). Logs and outputs in $WORK (default ~/envlab-long).
#
#   bash scripts/warmstart-2to5.sh [COMMIT]     # default: the commit the runs so far were made with
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$HOME/envlab-long}
commit=${1:-ceaec81}
python=$repo/.venv/bin/python
source "$repo/scripts/fixed-commit.sh"
fixed_commit "$repo" "$work" "$commit"
cd "$work/src"
nohup setsid bash -c "
    nice -n 5 '$python' -m training.labels --out '$work/labels' --boards 120000 &&
    nice -n 5 '$python' -m training.warmstart --labels '$work/labels' --out '$work/ws-big/tiny' --steps 40000 \
        --eval-every 2000 --check-per-cell 3 --threads 1
" >> "$work/warmstart-2to5.log" 2>&1 &
echo "warm start for 2 to 5 agents running at commit $commit; log: $work/warmstart-2to5.log"
