#!/usr/bin/env bash
# Gemma 3 270M's stages measured on this CPU (docs/training.md, "The activations, and Gemma 270M on this CPU,
# measured" and "The policy as its own engineer"): one after another, each in a folder of its own under
# $WORK/gemma (default ~/envlab-long/gemma), each under `/usr/bin/time -v` for its peak resident memory:
#   defaults/  the LoRA stage at the chat defaults: envlab run --policy gemma3-270m --lora 8 --stages 1 ...
#   self/      the self-engineering run of docs/training.md (two stages, the policy proposing from its checkpoint)
#   bench512/  benchmarks/bench_memory.py at completion length 512 (estimate against measured peak)
# On a fixed commit, in the background; run it again after any stop: a measurement that ended (its `rc` file)
# is kept, one that was cut short starts again from nothing.
#
#   bash scripts/gemma-memory.sh [COMMIT]      # logs: $WORK/gemma/chain.log, each folder's out.log and time.log
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$HOME/envlab-long}/gemma
source "$repo/scripts/fixed-commit.sh"
source "$repo/scripts/snapshot.sh"
long_run_python "$repo"
long_run_enter "$repo" "$work" "${1:-}"
# a job's child started cold by its worker, not forked from a zygote: `time -v` counts only the processes its
# command waits for, and a zygote's children are waited for by the zygote
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 ENVLAB_ZYGOTE=0
nohup setsid nice -n 5 bash -c "
    measure() {  # NAME COMMAND...: in NAME/, unless it ended before
        local name=\$1; shift
        [ -f \"\$name/rc\" ] && { echo \"== \$name: ended before, rc=\$(cat \"\$name/rc\")\"; return; }
        rm -rf \"\$name\"; mkdir -p \"\$name\"
        echo \"== \$name \$(date -u +%FT%TZ)\"
        (cd \"\$name\" && /usr/bin/time -v \"\$@\" > out.log 2> time.log; echo \$? > rc)
        echo \"rc=\$(cat \"\$name/rc\") \$(date -u +%FT%TZ)\"
    }
    cli=('$python' -m lab.cli)
    measure defaults \"\${cli[@]}\" run --db envlab.db --policy gemma3-270m --lora 8 --stages 1 --engineer llm \
        --backend hf:policy --auto-apply --instances 4 --validation-boards 8 --dev-per-size 3 --grpo max_steps=2
    measure self \"\${cli[@]}\" run --db envlab.db --name gemma-self --policy gemma3-270m --lora 8 --engineer llm \
        --backend hf:policy --context failures-only --auto-apply --stages 2 --instances 2 --validation-boards 1 \
        --dev-per-size 3 --completion-length 8 --seed 1 --grpo max_steps=1 --grpo num_generations=2 \
        --grpo per_device_train_batch_size=2
    measure bench512 '$python' '$work/src/benchmarks/bench_memory.py' --lengths 512 --size 3 --agents 2 --stand-in \
        --threads 2 --stop-gb 14
" >> "$work/chain.log" 2>&1 < /dev/null &
echo "$!" > "$work/pids"
echo "Gemma measurements at commit $commit; log: $work/chain.log"
