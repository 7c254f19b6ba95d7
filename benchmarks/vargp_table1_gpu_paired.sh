#!/bin/bash
# VAR-GP against + Block Diag. on Permuted MNIST at the paper's settings (full data, M 100 per
# class and task, lr 3.7e-3, beta 1.64, batch 512) with MAX_EPOCHS per task, several seeds at
# once on one GPU, then each seed's two learners compared on the same test images
# (benchmarks/vargp_paired.py, predicting on the GPU that trained them). Run from the repository
# root; reads MNIST from $PPL_CL_DATA (default $PWD/.devdata, a copy of the data folder).
# Each (seed, row) is its own `ppl-cl run` process; CUDA MPS lets their small kernels share the
# GPU. Rows still running after WATCHDOG_S seconds get SIGTERM (they keep the checkpoint of their
# last finished task; --checkpoint-every 100000 writes no snapshot within a task) and their seed
# gets no paired report; EXTRA "--resume" continues them from there on the same machine (as the
# 2026-11-27 runs of results/vargp_permuted_mnist_gpu_len5_5seeds.md were finished:
# "290 5 '2 3' cuda --resume", then "150 5 4 cuda --resume", after "430 5 '2 3 4' cuda").
# Everything small (JSON, logs, figures, the paired reports) is packed into $OUT/runs.tgz; the
# learners (tens of MB each) stay behind.
# usage: vargp_table1_gpu_paired.sh WATCHDOG_S MAX_EPOCHS "SEED SEED ..." [DEVICE [EXTRA ARGS]]
# (DEVICE cpu with EXTRA "--quick" is the dry run this script was checked with before a GPU call.)
source "$(dirname "$0")/vargp_gpu_rows_lib.sh"
wd=$1; epochs=$2; seeds=$3; dev=${4:-cuda}; shift 4 2>/dev/null; extra=("$@")
OUT=${OUT:-/tmp/out}; R=${R:-/tmp/r}; mkdir -p "$OUT" "$R"
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 PPL_CL_DATA=${PPL_CL_DATA:-$PWD/.devdata}
if [ "$dev" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.used --format=csv
  mps_on
fi
pids=()
for s in $seeds; do
  for a in var_gp block_diag; do
    row_args $a
    "${PPL_CL[@]}" run vargp-permuted-mnist --seed $s --device $dev --no-progress --checkpoint-every 100000 \
      --set max_epochs=$epochs "${ROW[@]}" "${extra[@]}" --out $R/s${s}_$a > $R/s${s}_$a.out 2>&1 &
    pids+=($!)
  done
done
t0=$SECONDS
watch_rows $wd training: "${pids[@]}"
ppids=()
for s in $seeds; do
  tail -1 $R/s${s}_var_gp.out; tail -1 $R/s${s}_block_diag.out
  if [ -f $R/s${s}_var_gp/metrics.json ] && [ -f $R/s${s}_block_diag/metrics.json ]; then
    python3 benchmarks/vargp_paired.py $R/s${s}_var_gp $R/s${s}_block_diag --device $dev \
      --out $R/paired_s$s > $R/paired_s$s.out 2>&1 &
    ppids+=($!)
  else
    echo "seed $s: a row did not finish, no paired report"
  fi
done
for p in "${ppids[@]}"; do wait $p; done
echo "training + paired: $((SECONDS - t0)) s"
for s in $seeds; do [ -f $R/paired_s$s.md ] && sed -n 7p $R/paired_s$s.md || tail -3 $R/paired_s$s.out 2>/dev/null; done
(cd $R/.. && tar czf $OUT/runs.tgz $(basename $R)/*/*.json $(basename $R)/*/progress.log \
  $(basename $R)/*/*.png $(basename $R)/*.out $(basename $R)/paired_s*.json $(basename $R)/paired_s*.md 2>/dev/null)
ls -la $OUT
[ "$dev" = cuda ] && { nvidia-smi --query-gpu=memory.used --format=csv; echo quit | nvidia-cuda-mps-control; }
exit 0
