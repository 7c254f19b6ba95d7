#!/bin/bash
# Not a timing: an end-to-end check that a `ppl-cl run` stopped by SIGTERM inside a task
# resumes (`--resume`, snapshots after every epoch: `--checkpoint-every 0`) to exactly the
# result of an uninterrupted run, on any device. vargp-split-digits (sklearn's digits, always
# there), VAR-GP and Block Diag., seed 1, 30 epochs per task. The stopped run is killed
# KILL_AFTER_S seconds after VAR-GP's task 2 has ended, i.e. inside task 3.
#
# usage: bash benchmarks/vargp_sigterm_resume.sh DEVICE OUTDIR [KILL_AFTER_S=0.5]
# prints the progress log of the stopped run, the resume lines, and whether the accuracy and
# predictive-entropy matrices of the resumed run equal those of the uninterrupted one.
set -u
dev=$1; out=$2; after=${3:-0.5}
mkdir -p "$out"
run_cli=(python3 -c 'import sys; from ppl_cl.cli import main; sys.exit(main(sys.argv[1:]))')
args=(run vargp-split-digits --seed 1 --device "$dev" --no-progress
      --set 'ablations=[block_diag]' --set max_epochs=30)
"${run_cli[@]}" "${args[@]}" --out "$out/whole" > "$out/whole.out" 2>&1
echo "uninterrupted run: exit status $?"
# started directly in the background (not through a shell function), so that $! is the
# Python process itself and SIGTERM reaches it
"${run_cli[@]}" "${args[@]}" --out "$out/cut" --checkpoint-every 0 > "$out/cut1.out" 2>&1 &
pid=$!
until grep -q "var_gp: task 2/" "$out/cut/progress.log" 2>/dev/null; do sleep 0.2; done
sleep "$after"
kill -TERM $pid; wait $pid; echo "stopped run: exit status $? (143 = SIGTERM)"
sleep 1
if kill -0 $pid 2>/dev/null; then echo "ERROR: the stopped run is still running"; exit 1; fi
echo "checkpoints left: $(ls "$out/cut/checkpoints" | tr '\n' ' ')"
"${run_cli[@]}" "${args[@]}" --out "$out/cut" --checkpoint-every 0 --resume > "$out/cut2.out" 2>&1
echo "resumed run: exit status $?"
echo "--- progress.log of the stopped and resumed run"
cat "$out/cut/progress.log"
python3 - "$out" <<'PY'
import json, sys
import numpy as np
o = sys.argv[1]
a = json.load(open(f"{o}/whole/metrics.json"))
b = json.load(open(f"{o}/cut/metrics.json"))
ok = True
for v in a["variants"]:
    for m in ("accuracy_matrix", "entropy_matrix"):
        x = np.array(a["variants"][v][m], float)
        y = np.array(b["variants"][v][m], float)
        same = np.array_equal(x, y, equal_nan=True)
        ok &= same
        print(f"{v} {m}: equal to the uninterrupted run's: {same}")
for k in sorted(a["summary"]):
    if "time" not in k:
        print(f"summary.{k}: uninterrupted {a['summary'][k]!r}, resumed {b['summary'][k]!r}")
sys.exit(0 if ok else 1)
PY
