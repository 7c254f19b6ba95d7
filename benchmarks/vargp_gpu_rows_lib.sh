# Sourced by vargp_table1_gpu_rows.sh and vargp_table1_gpu_paired.sh: the pieces both use to run
# VAR-GP stream rows as concurrent `ppl-cl run` processes on one GPU.

# `ppl-cl` through the Python that holds the packages (the device's image has no entry point)
PPL_CL=(python3 -c 'import sys; from ppl_cl.cli import main; sys.exit(main(sys.argv[1:]))')

# CUDA MPS, so that the processes' small kernels share the GPU
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
  mkdir -p /tmp/mps /tmp/mpslog; nvidia-cuda-mps-control -d && echo "MPS on"
}

# row_args ROW: sets ROW to the overrides that train that Table 1 row alone
row_args() {
  if [ "$1" = var_gp ]; then ROW=(--set 'ablations=[]'); else ROW=(--set run_var_gp=false --set "ablations=[$1]"); fi
}

# watch_rows WATCHDOG_S LABEL PID...: wait until the processes end or WATCHDOG_S seconds pass,
# print "LABEL <seconds> s", then SIGTERM those still running (a stream run keeps the checkpoint
# of its last finished task for --resume) and give them 3 s to write it
watch_rows() {
  local wd=$1 label=$2 t0=$SECONDS alive p; shift 2
  while [ $((SECONDS - t0)) -lt $wd ]; do
    alive=0; for p in "$@"; do kill -0 $p 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 2
  done
  echo "$label $((SECONDS - t0)) s"
  for p in "$@"; do kill -0 $p 2>/dev/null && { echo "TERM $p"; kill -TERM $p; }; done
  sleep 3
}
