#!/usr/bin/env bash
# usage: tpu_scripts/setup.sh [--dry-run]
# Copies t5lite to every worker of TPU_NAME and installs it with JAX for TPU: with REPO_URL set each
# worker clones it, otherwise this checkout is copied with scp.
source "$(dirname "$0")/common.sh"
if [[ -n "$REPO_URL" ]]; then
  on_all_workers "rm -rf $REMOTE_DIR && git clone $REPO_URL $REMOTE_DIR"
else
  src="$(cd "$(dirname "$0")/.." && pwd)"
  run gcloud compute tpus tpu-vm scp --recurse "$src" "$TPU_NAME:~/$REMOTE_DIR" --zone="$ZONE" \
    --project="$PROJECT" --worker=all
fi
on_all_workers "cd $REMOTE_DIR && python3 -m venv .venv && .venv/bin/pip install -q --upgrade pip && .venv/bin/pip install -q 'jax[tpu]' -e '.[tfds,gcs]'"
