#!/usr/bin/env bash
# The study of engineers the headroom screen sizes (docs/experiments.md, "The study the screen sizes";
# lab/study/headroom.py, `study-plan`): arms random, static (the screen's best config), schedule (agent mixes on it),
# evidence, bandit and learnability; 4 stages; the seeds for 80% power at 2 points; compute matched.
# In a database of its own, on a fixed commit, in the background, resumable: run it again after any stop and
# `envlab experiment run` goes on where it stopped; the plan and the experiment are made once.
#
#   bash scripts/study-second-pass.sh [COMMIT]   # WORKERS=K workers of one torch thread (default 2: one a core here)
#                                                # SCREEN=folder of the finished screen (default $WORK/headroom)
#                                                # STUDY="--arms random,static,bandit --stages 2": another design
#                                                # (study-plan's options; read once, when the study is made)
#   bash scripts/study-second-pass.sh save       # the study so far into docs/results/second-pass-under-way/
#                                                # (SNAPSHOT=folder: another); while it runs, every SAVE_EVERY
#                                                # seconds (default 3600) and once when it ends
#
# A machine's folders can go with the machine, so the study's state is saved in the repository (`save`: its
# database, the checkpoints its unfinished runs go on from, its commit; scripts/snapshot.sh). On a machine with no
# study yet, the script restores that snapshot and goes on from it; the screen is needed only to make the study.
# The report lands in $WORK/second-pass/study/report; it is shipped as docs/results/second-pass/ (the study ran to its
# end on 2026-12-02: docs/results/README.md).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$HOME/envlab-long}/second-pass
screen=${SCREEN:-${WORK:-$HOME/envlab-long}/headroom}
snap=${SNAPSHOT:-$repo/docs/results/second-pass-under-way}
db="$work/second-pass.db"
source "$repo/scripts/fixed-commit.sh"
source "$repo/scripts/snapshot.sh"
long_run_open "$repo" "$work" "$db" "$snap" study "$work/made" "${1:-}"
workers=${WORKERS:-2}
read -ra design <<< "${STUDY:-}"
if [ ! -f "$work/made" ] && [ ! -f "$screen/report/report.md" ]; then  # the screen's report: written once it is done
    echo "the headroom screen in $screen is not done (no report/report.md): bash scripts/headroom-screen.sh" >&2
    exit 2
fi
long_run_enter "$repo" "$work" "${1:-}"
if [ ! -f "$work/made" ]; then
    "$python" -m lab.cli headroom study-plan headroom --db "$screen/headroom.db" --configs "$screen/configs" \
        --out "$work/study" --workers "$workers" "${design[@]}" > "$work/plan.txt"
    cat "$work/plan.txt"
    new=$(grep "^envlab experiment new" "$work/plan.txt" | sed "s|^envlab|$python -m lab.cli|; s|--db [^ ]*|--db $db|")
    eval "$new"
    touch "$work/made"
fi
nohup setsid nice -n 5 bash -c "
    '$python' -m lab.cli experiment run second-pass --workers $workers --threads 1 --db '$db' &&
    '$python' -m lab.cli experiment report second-pass --db '$db' --out '$work/study/report'
" >> "$work/second-pass.log" 2>&1 &
study=$!
# its state into the repository's folder every SAVE_EVERY seconds (default an hour), so a lost machine costs little
nohup setsid bash -c "source '$repo/scripts/snapshot.sh'; PYTHON='$python' snapshot_every ${SAVE_EVERY:-3600} \
    $study '$work' '$db' '$snap'" >> "$work/snapshots.log" 2>&1 &
echo "second-pass study at commit $commit; log: $work/second-pass.log; report: $work/study/report;" \
     "saved into $snap every ${SAVE_EVERY:-3600} s"
