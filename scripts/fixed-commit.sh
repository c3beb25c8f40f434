# Sourced by the background scripts (headroom-screen.sh, study-second-pass.sh, study-rerun-evidence.sh,
# warmstart-2to5.sh): their code is a clone of this repository at one commit, so work on main never changes a
# computation half way through.
#
#   fixed_commit REPO WORK COMMIT    # WORK/src checked out at COMMIT (cloned once, fetched anew), WORK/COMMIT says it

fixed_commit() {
    local repo=$1 work=$2 commit=$3
    mkdir -p "$work"
    echo "$commit" > "$work/COMMIT"
    if [ ! -d "$work/src/.git" ]; then
        git clone -q "$repo" "$work/src"
    fi
    git -C "$work/src" fetch -q "$repo" '+refs/heads/*:refs/remotes/lab/*'
    git -C "$work/src" checkout -q "$commit"
}
