#!/usr/bin/env bash
# Runs `t5lite train` on every worker of the slice; jax.distributed finds the peers on TPU VMs.
# Usage: tpu_scripts/run.sh [--dry-run] --gin_file=configs/tpu/t5_1_1_base_c4_pretrain.gin \
#          --gin.MODEL_DIR="'gs://BUCKET/run'" [more gin flags]
source "$(dirname "$0")/common.sh"
if [[ ${#ARGS[@]} -eq 0 ]]; then
  echo "usage: $0 [--dry-run] --gin_file=F --gin.MODEL_DIR=\"'gs://bucket/dir'\" [--gin.NAME=VALUE ...]" >&2
  exit 2
fi
quoted=$(printf '%q ' "${ARGS[@]}")
on_all_workers "cd $REMOTE_DIR && T5LITE_DISTRIBUTED=1 .venv/bin/t5lite train $quoted 2>&1 | tee -a train.log"
