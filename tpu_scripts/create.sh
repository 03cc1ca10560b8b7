#!/usr/bin/env bash
# usage: tpu_scripts/create.sh [--dry-run]
# Creates the TPU VM (or multi-host slice) TPU_NAME of ACCELERATOR_TYPE in ZONE (billed from now on;
# tpu_scripts/teardown.sh deletes it).
source "$(dirname "$0")/common.sh"
run gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
  --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION"
