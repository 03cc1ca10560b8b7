#!/usr/bin/env bash
# Deletes the TPU VM.  Usage: tpu_scripts/teardown.sh [--dry-run]
source "$(dirname "$0")/common.sh"
run gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" --quiet
