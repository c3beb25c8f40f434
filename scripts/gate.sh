#!/usr/bin/env bash
# The gate (lab/study/gate.py; docs/results/README.md, "The gate"): does the best environment move as the policy
# learns? The same 8 configs, one stage of 256 GRPO steps each, 2 seeds, from three starts: `weak` (step 10,000 of the
# 2-to-5-agent warm start), `tiny` (the shipped policy) and `static` (tiny after two stages on the headroom screen's
# best config). In a database of its own, on a fixed commit, in the background, resumable: run it again after any
# stop and it goes on where it stopped (labels, the warm start and every experiment resume; each thing is made once).
#
#   bash scripts/gate.sh [COMMIT]     # two chains of one torch thread each (one a core here):
#                                     #   A: the static start's two stages, then gate-tiny, then gate-static
#                                     #   B: the warm start's labels and its first 10,000 steps, then gate-weak
#   bash scripts/gate.sh save         # its state into docs/results/gate-under-way/ (SNAPSHOT=folder: another);
#                                     # while it runs, every SAVE_EVERY seconds (default 3600) and once when it ends
#
# On a machine with no gate yet, the script restores that snapshot and goes on from it. The report is written by
# `envlab gate report` once the three experiments are done (docs/results/README.md gives the command). The commands
# below are those of the fixed commit the gate runs on (7a53543: `python -m lab.study.gate`, later `envlab gate`).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$HOME/envlab-long}/gate
snap=${SNAPSHOT:-$repo/docs/results/gate-under-way}
db="$work/gate.db"
source "$repo/scripts/fixed-commit.sh"
source "$repo/scripts/snapshot.sh"
# a snapshot keeps what is made once (the starts, the configs, the marks of what is made), not the warm start's
# optimizer state (17 MB)
export KEEP="starts configs made-prep made-tiny made-static made-weak" EXCLUDE="*.state"
long_run_open "$repo" "$work" "$db" "$snap" gate "$db" "${1:-}"
long_run_enter "$repo" "$work" "${1:-}"
cli=("$python" -m lab.cli)
configs="$work/configs"
[ -f "$configs/initial.json" ] || "$python" -m lab.study.gate make-configs --out "$configs"
setting=(--scenario default --config "$configs/initial.json" --agent-counts 2,3,4,5 --validation-agents 3,4,5
         --db "$db")
gate=(--stages 1 --seeds 2 --instances 1024 --dev-per-size 300 "${setting[@]}")
arms=$(cd "$configs" && for f in mix*.json; do printf '%s=static:%s,' "${f%.json}" "$configs/$f"; done)
arms=${arms%,}
if [ ! -f made-prep ]; then  # the static start: the second-pass study's static arm, seed 0 (2 stages of 128 steps)
    "${cli[@]}" experiment new --name gate-start-static --arms "static=static:$configs/mixA-holes0.1-waits0.75.json" \
        --seeds 1 --stages 2 --dev-per-size 3 --policy tiny "${setting[@]}"
    touch made-prep
fi
if [ ! -f made-tiny ]; then
    "${cli[@]}" experiment new --name gate-tiny --arms "$arms" --policy tiny "${gate[@]}"
    touch made-tiny
fi
# an experiment that stops on a fault (a database locked past its timeout on a loaded machine) is resumed, 5 tries
run() {
    local try
    for try in 1 2 3 4 5; do
        "${cli[@]}" experiment run "$1" --workers 1 --threads 1 --db "$db" && return 0
        echo "experiment $1 stopped (try $try of 5); resuming in 60 s"
        sleep 60
    done
    return 1
}
chain_a="
    set -e
    $(declare -f run); cli=(${cli[*]@Q}); db=${db@Q}
    run gate-start-static
    if [ ! -f made-static ]; then
        rm -rf starts/static.tmp && mkdir -p starts
        cp -r \"\$('$python' -m lab.study.gate checkpoint gate-start-static --db '$db')\" starts/static.tmp
        rm -rf starts/static && mv starts/static.tmp starts/static
        \"\${cli[@]}\" experiment new --name gate-static --arms '$arms' --policy '$work/starts/static' ${gate[*]@Q}
        touch made-static
    fi
    run gate-tiny
    run gate-static
"
chain_b="
    set -e
    $(declare -f run); cli=(${cli[*]@Q}); db=${db@Q}
    if [ ! -f made-weak ]; then
        '$python' -m training.labels --out labels --boards 120000 --workers 1
        '$python' -m training.warmstart --labels labels --out starts/weak --steps 40000 --eval-every 2000 \
            --check-per-cell 3 --threads 1 --stop-at 10000
        \"\${cli[@]}\" experiment new --name gate-weak --arms '$arms' --policy '$work/starts/weak' ${gate[*]@Q}
        touch made-weak
    fi
    run gate-weak
    run gate-tiny
"
nohup setsid nice -n 5 bash -c "$chain_a" >> "$work/chain-a.log" 2>&1 &
a=$!
nohup setsid nice -n 5 bash -c "$chain_b" >> "$work/chain-b.log" 2>&1 &
b=$!
echo "$a $b" > "$work/pids"
# its state into the repository's folder every SAVE_EVERY seconds (default an hour), so a lost machine costs little
nohup setsid bash -c "source '$repo/scripts/snapshot.sh'; export KEEP='starts configs made-prep made-tiny made-static made-weak' EXCLUDE='*.state';
    while kill -0 $a 2>/dev/null || kill -0 $b 2>/dev/null; do
        sleep ${SAVE_EVERY:-3600}; PYTHON='$python' snapshot_save '$work' '$db' '$snap'
    done" >> "$work/snapshots.log" 2>&1 &
echo "gate at commit $commit; logs: $work/chain-a.log, $work/chain-b.log; saved into $snap every ${SAVE_EVERY:-3600} s"
