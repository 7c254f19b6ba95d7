#!/bin/bash
# The script that ran the 2026-11-27 H100 rows of results/vargp_permuted_mnist_gpu_len5_defaults.md
# (two calls: WATCHDOG_S 505 with "0:var_gp 0:block_diag 0:mle_hypers 0:global 1:mle_hypers
# 1:global", then 340 with "1:var_gp 1:block_diag"), the same commands as they ran (the MPS,
# row and watchdog lines now come from vargp_gpu_rows_lib.sh, shared with
# vargp_table1_gpu_paired.sh). Run from the repository root on a machine with CUDA; it reads
# MNIST from $PWD/.devdata/mnist (a copy of the data folder), writes the runs to
# /tmp/r/s<SEED>_<ROW>, and packs their JSON, logs and figures into $OUT/runs.tgz. Each row
# is its own `ppl-cl run` process; CUDA MPS lets their small kernels share the GPU. Rows still
# running after WATCHDOG_S seconds get SIGTERM (they keep the checkpoint of their last finished
# task; --checkpoint-every 100000 writes no snapshot within a task).
# (In the first call the last step copied each file to $OUT instead of packing them, and the
# device's limit on the number of returned files cut that short; the second call packed the
# first call's /tmp/r before its own runs. The training commands were the same in both.)
# Permuted MNIST at the paper's settings (full data, M 100, lr 3.7e-3, beta 1.64) with 5 epochs
# per task, at today's defaults; rows as separate processes sharing the GPU (CUDA MPS).
# usage: vargp_table1_gpu_rows.sh WATCHDOG_S "SEED:ROW SEED:ROW ..."
source "$(dirname "$0")/vargp_gpu_rows_lib.sh"
wd=$1; jobs_spec=$2
nvidia-smi --query-gpu=name,memory.used --format=csv
mps_on
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 PPL_CL_DATA=$PWD/.devdata
pids=()
for js in $jobs_spec; do
  s=${js%%:*}; a=${js##*:}
  row_args $a
  "${PPL_CL[@]}" run vargp-permuted-mnist --seed $s --device cuda --no-progress --checkpoint-every 100000 --set max_epochs=5 "${ROW[@]}" --out /tmp/r/s${s}_$a > /tmp/r_s${s}_$a.out 2>&1 &
  pids+=($!)
done
watch_rows $wd elapsed "${pids[@]}"
for d in /tmp/r/*; do n=$(basename $d); tail -1 /tmp/r_$n.out; tail -2 $d/progress.log; done
(cd /tmp && tar czf $OUT/runs.tgz r/*/*.json r/*/progress.log r/*/*.png r_*.out)
nvidia-smi --query-gpu=memory.used --format=csv
echo quit | nvidia-cuda-mps-control
