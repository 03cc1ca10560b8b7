#!/usr/bin/env bash
# Creates a TPU VM (or a multi-host slice).  Usage: tpu_scripts/create.sh [--dry-run]
source "$(dirname "$0")/common.sh"
run gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" \
  --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION"
