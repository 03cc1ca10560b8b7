#!/usr/bin/env bash
# usage: tpu_scripts/run.sh [--dry-run] --gin_file=F --gin.MODEL_DIR="'gs://BUCKET/DIR'" [--gin.NAME=VALUE ...]
#          [--prune_heads=FRACTION] [--debug]
# Runs `t5lite train` with these flags (each as --NAME=VALUE) on every worker of TPU_NAME;
# jax.distributed finds the peers on TPU VMs. Its output goes to train.log in REMOTE_DIR.
OPTIONS='--gin_file=*|--gin.*=*|--prune_heads=*|--debug'
source "$(dirname "$0")/common.sh"
if [[ ${#ARGS[@]} -eq 0 ]]; then
  refuse "no t5lite train flags; usage: $0 [--dry-run] --gin_file=F --gin.MODEL_DIR=\"'gs://BUCKET/DIR'\" (see --help)"
fi
quoted=$(printf '%q ' "${ARGS[@]}")
on_all_workers "cd $REMOTE_DIR && T5LITE_DISTRIBUTED=1 .venv/bin/t5lite train $quoted 2>&1 | tee -a train.log"
