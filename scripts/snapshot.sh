# Sourced by the background scripts whose work outlasts a machine (study-second-pass.sh): a long computation's
# state saved into the repository, so a study goes on on a new machine from where the last snapshot left it.
#
#   snapshot_save WORK DB SNAP       # SNAP/: DB gzipped (a consistent copy while workers write, without the
#                                    # episodes no run reads again), what of WORK/runs the unfinished runs go on
#                                    # from (their last finished stage, the boards), WORK/COMMIT, and WORK's path;
#                                    # KEEP="a b": folders of WORK kept whole besides (gate.sh: its starts);
#                                    # EXCLUDE: a pattern of what in them is left out (gate.sh: *.state)
#   snapshot_restore SNAP WORK DB    # the reverse, into a WORK that holds no study yet; refuses another WORK path,
#                                    # as the database names its checkpoints by their full paths
#   snapshot_every SECONDS PID WORK DB SNAP   # snapshot_save every SECONDS while process PID runs, and once after
#   long_run_python REPO             # $python, REPO's .venv's; refuses (exit 2) in one line where there is none
#   long_run_open REPO WORK DB SNAP WHAT MARK [save|COMMIT]   # a background script's start: refuses without REPO's
#                                    # .venv (sets $python); `save` saves and exits (WHAT names it: "no WHAT in WORK
#                                    # to save"); restores SNAP when MARK (a file) is missing, then touches MARK
#   long_run_enter REPO WORK [COMMIT]   # into WORK on its fixed commit (COMMIT, else WORK/COMMIT's, else HEAD;
#                                    # sets $commit), with PYTHONPATH, ENVLAB_RUNS and one torch thread exported
#
# A stage that was running when the snapshot was taken is lost, not broken: its job's heartbeats stop, the next
# `envlab experiment run` reaps it as stale and queues it again, and it trains again from the checkpoint before it.

snapshot_save() {
    local work=$1 db=$2 snap=$3 python=${PYTHON:-python3} lock
    mkdir -p "$snap"
    # one save at a time: the hourly one and a `save` by hand write the same temporary files (two at once left a
    # database file with another's bytes after its end)
    exec {lock}>"$work/.save.lock"
    flock "$lock"
    # SQLite's online backup: one consistent copy, whatever the workers write meanwhile; then the episodes no one
    # reads again left out (a finished run's, but for the stage-0 evaluations later runs copy), as shipping does.
    # It prints what of WORK/runs the study goes on from: the board files, the workers' logs, and each unfinished
    # run's last finished stage (its policy); a finished run's checkpoints and TRL's folders are left out.
    # shellcheck disable=SC2086  # KEEP: folders of WORK kept whole (a study's starting policies), space-separated
    "$python" - "$db" "$snap/.db.tmp" "$work" ${KEEP:-} > "$snap/.keep.tmp" <<'PY'
import sqlite3, sys
from pathlib import Path
copy, work = sqlite3.connect(sys.argv[2]), Path(sys.argv[3])
sqlite3.connect(sys.argv[1]).backup(copy)
copy.execute("""DELETE FROM episodes WHERE run_id IN (SELECT id FROM runs WHERE status = 'done')
                AND NOT (stage_index = 0 AND EXISTS (SELECT 1 FROM evaluations e WHERE e.run_id = episodes.run_id
                         AND e.stage_index = 0 AND e.split = episodes.split AND e.source_run_id IS NULL))""")
copy.commit()
last = copy.execute("""SELECT s.checkpoint FROM stages s JOIN runs r ON r.id = s.run_id
                       WHERE r.status != 'done' AND s.status = 'done' AND s."index" = (
                           SELECT max(t."index") FROM stages t WHERE t.run_id = s.run_id AND t.status = 'done')""")
keep = {p.relative_to(work) for p in (work / "runs").iterdir() if p.is_file() or p.name == "experiments"}
keep |= {Path(p) for p in sys.argv[4:] if (work / p).exists()}  # folders of WORK the caller keeps (KEEP)
for (checkpoint,) in last:  # a trained stage's policy is named under the runs folder; stage 0's is the shipped one
    if checkpoint and not Path(checkpoint).is_absolute() and (work / "runs" / checkpoint).parent.is_dir():
        keep.add((work / "runs" / checkpoint).parent.relative_to(work))
print("\n".join(sorted(map(str, keep))))
copy.execute("VACUUM")
copy.close()
PY
    gzip -9 -n -c "$snap/.db.tmp" > "$snap/.db.gz.tmp" && rm "$snap/.db.tmp"
    tar -C "$work" --exclude='trl' ${EXCLUDE:+--exclude="$EXCLUDE"} --sort=name --mtime='2000-01-01' --owner=0 --group=0 -cf - -T "$snap/.keep.tmp" \
        | gzip -9 -n > "$snap/.runs.tar.gz.tmp"
    rm "$snap/.keep.tmp"
    mv "$snap/.db.gz.tmp" "$snap/$(basename "$db").gz"
    mv "$snap/.runs.tar.gz.tmp" "$snap/runs.tar.gz"
    cp "$work/COMMIT" "$snap/COMMIT"
    echo "$work" > "$snap/WORK"
    echo "snapshot of $work in $snap: $(du -sh "$snap" | cut -f1) ($(date -u '+%Y-%m-%d %H:%M UTC'))"
    exec {lock}>&-
}

snapshot_restore() {
    local snap=$1 work=$2 db=$3
    if [ "$(cat "$snap/WORK")" != "$work" ]; then
        echo "the snapshot in $snap was taken in $(cat "$snap/WORK"), and its database names checkpoints there;" \
             "restore it with WORK set so that the study's folder is that path" >&2
        return 2
    fi
    if [ -e "$db" ]; then
        echo "$db exists: a study is here already; the snapshot in $snap is not restored over it" >&2
        return 2
    fi
    mkdir -p "$work"
    gunzip -c "$snap/$(basename "$db").gz" > "$db.tmp"
    tar -C "$work" -xzf "$snap/runs.tar.gz"
    mv "$db.tmp" "$db"
    echo "restored $work from the snapshot in $snap (commit $(cat "$snap/COMMIT"))"
}

snapshot_every() {
    local every=$1 pid=$2 work=$3 db=$4 snap=$5
    while sleep "$every"; kill -0 "$pid" 2>/dev/null; do
        snapshot_save "$work" "$db" "$snap"
    done
    snapshot_save "$work" "$db" "$snap"  # once more, after it ended
}

long_run_python() {
    python=$1/.venv/bin/python
    if [ ! -x "$python" ]; then
        echo "no environment in $1/.venv: bash .ci/setup first" >&2
        exit 2
    fi
}

long_run_open() {
    local repo=$1 work=$2 db=$3 snap=$4 what=$5 mark=$6 arg=${7:-}
    long_run_python "$repo"
    if [ "$arg" = save ]; then
        [ -f "$db" ] || { echo "no $what in $work to save" >&2; exit 2; }
        PYTHON=$python snapshot_save "$work" "$db" "$snap"
        exit
    fi
    if [ ! -f "$mark" ] && [ -f "$snap/COMMIT" ]; then
        snapshot_restore "$snap" "$work" "$db"
        cp "$snap/COMMIT" "$work/COMMIT"
        touch "$mark"
    fi
}

long_run_enter() {
    local repo=$1 work=$2
    commit=${3:-$(cat "$work/COMMIT" 2>/dev/null || git -C "$repo" rev-parse --short HEAD)}
    fixed_commit "$repo" "$work" "$commit"
    cd "$work"
    export PYTHONPATH="$work/src" ENVLAB_RUNS="$work/runs" OMP_NUM_THREADS=1
}
