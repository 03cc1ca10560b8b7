#!/usr/bin/env bash
# usage: tpu_scripts/teardown.sh [--dry-run] [--yes]
# Deletes the TPU VM TPU_NAME in ZONE, after asking on the terminal.
#   --yes        delete without asking (needed where stdin is not a terminal)
OPTIONS='--yes'
source "$(dirname "$0")/common.sh"

# Asks before a deletion nothing can undo; without a terminal to ask on, --yes must say it.
confirm_delete() {
  [[ "${ARGS[0]:-}" == --yes || "$DRY_RUN" == "1" ]] && return
  [[ -t 0 ]] || refuse "deleting TPU VM $TPU_NAME needs confirmation and stdin is not a terminal; rerun with --yes"
  local answer
  read -r -p "Delete TPU VM $TPU_NAME in $ZONE (project $PROJECT)? [y/N] " answer || true   # end of input: no
  if [[ "$answer" != [yY]?([eE][sS]) ]]; then
    echo "$(basename "$0"): $TPU_NAME kept" >&2
    exit 1
  fi
}

confirm_delete
run gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" --project="$PROJECT" --quiet
