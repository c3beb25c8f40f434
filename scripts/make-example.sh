#!/usr/bin/env bash
# The example run (docs/example.md) made again in the background, on a fixed commit, resumable: its database and
# checkpoints are kept in $WORK/example/work (default ~/envlab-long/example), so run the script again after any stop
# and the making goes on from where it stopped (stages from their last checkpoint, decisions and benchmarks made
# once). The archive lands in $WORK/example/example-run.zip; copy it to assets/example-run.zip to ship it.
#
#   bash scripts/make-example.sh [COMMIT]     # log: $WORK/example/make.log
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$HOME/envlab-long}/example
source "$repo/scripts/fixed-commit.sh"
source "$repo/scripts/snapshot.sh"
long_run_python "$repo"
long_run_enter "$repo" "$work" "${1:-}"
[ -f "$work/example-run.zip" ] && { echo "made already: $work/example-run.zip"; exit 0; }
nohup setsid nice -n 5 "$python" "$work/src/scripts/make_example.py" --make "$work/example-run.zip" \
    --work "$work/work" >> "$work/make.log" 2>&1 < /dev/null &
echo "$!" > "$work/pids"
echo "the example at commit $commit; log: $work/make.log; the archive: $work/example-run.zip"
