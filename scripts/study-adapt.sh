#!/usr/bin/env bash
# The study the gate calls for (docs/results/README.md, "The study the gate calls for"; lab/study/gate.py,
# `study_choice`): static (the chosen start's best config on dev), climb, levels and learnability, 10 seeds, 3 stages
# of the gate's length, from the start the gate's result fixes, compute matched, every run's last stage scored on the
# benchmark too. In a database of its own, on a fixed commit, in the background, resumable: run it again after any
# stop and it goes on where it stopped; the plan and the experiment are made once.
#
#   bash scripts/study-adapt.sh [COMMIT]   # WORKERS=K workers of one torch thread (default 2: one a core here)
#                                          # GATE=folder of the gate (default $WORK/gate)
#   bash scripts/study-adapt.sh save       # its state into docs/results/adapt-under-way/ (SNAPSHOT=folder: another);
#                                          # while it runs, every SAVE_EVERY seconds (default 3600) and once at its end
#
# While the gate is still running, the script waits for it in the background (a try every 15 minutes) and makes the
# study as soon as the gate is done, so it can be started at once. The plan is read from a copy of the gate's
# database (`envlab gate study-plan`), never from the gate's own.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$HOME/envlab-long}/adapt
gate=${GATE:-${WORK:-$HOME/envlab-long}/gate}
snap=${SNAPSHOT:-$repo/docs/results/adapt-under-way}
db="$work/adapt.db"
source "$repo/scripts/fixed-commit.sh"
source "$repo/scripts/snapshot.sh"
long_run_open "$repo" "$work" "$db" "$snap" study "$work/made" "${1:-}"
workers=${WORKERS:-2}
long_run_enter "$repo" "$work" "${1:-}"
cli=("$python" -m lab.cli)
if [ ! -f "$work/made" ]; then
    if ! "${cli[@]}" gate study-plan --db "$gate/gate.db" --configs "$gate/configs" --starts "$gate/starts" \
            --out "$work/study" --study-db "$db" --workers "$workers" > "$work/plan.txt" 2> "$work/plan.err"; then
        cat "$work/plan.err" >&2
        running=no
        for pid in $(cat "$gate/pids" 2>/dev/null); do kill -0 "$pid" 2>/dev/null && running=yes; done
        if [ "$running" = no ]; then
            echo "the gate in $gate is neither done nor running: bash scripts/gate.sh" >&2
            exit 2
        fi
        [ -z "${ADAPT_WAITING:-}" ] || exit 3  # the waiter below tries again later
        nohup setsid bash -c "until [ -f '$work/made' ]; do sleep 900; ADAPT_WAITING=1 WORKERS=$workers \
            GATE='$gate' bash '$repo/scripts/study-adapt.sh' '$commit'; [ \$? = 3 ] || break; done" \
            >> "$work/wait.log" 2>&1 < /dev/null &
        echo "the gate in $gate is still running: the study is made when it is done (log: $work/wait.log)"
        exit 0
    fi
    cat "$work/plan.txt"
    new=$(grep "^envlab experiment new" "$work/plan.txt" | sed "s|^envlab|${cli[*]}|")
    eval "$new"
    touch "$work/made"
fi
nohup setsid nice -n 5 bash -c "
    for try in 1 2 3 4 5; do
        ${cli[*]@Q} experiment run adapt --workers $workers --threads 1 --benchmark --db '$db' && break
        echo \"the study stopped (try \$try of 5); resuming in 60 s\"; sleep 60
    done
    ${cli[*]@Q} experiment report adapt --db '$db' --out '$work/study/report'
" >> "$work/adapt.log" 2>&1 < /dev/null &
study=$!
echo "$study" > "$work/pids"
# its state into the repository's folder every SAVE_EVERY seconds (default an hour), so a lost machine costs little
nohup setsid bash -c "source '$repo/scripts/snapshot.sh'; PYTHON='$python' snapshot_every ${SAVE_EVERY:-3600} \
    $study '$work' '$db' '$snap'" >> "$work/snapshots.log" 2>&1 < /dev/null &
echo "the study at commit $commit; log: $work/adapt.log; report: $work/study/report; saved into $snap every" \
     "${SAVE_EVERY:-3600} s"
