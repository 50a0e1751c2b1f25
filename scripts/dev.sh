#!/usr/bin/env bash
# Quick start: install what is needed, build, and run a one-voter dev
# cluster with a node on this host in the foreground (Ctrl-C stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec bin/kibotos dev "$@"
