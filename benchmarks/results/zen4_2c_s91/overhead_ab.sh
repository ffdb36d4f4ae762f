#!/bin/bash
# overhead.py over two builds (pip install --target dirs), alternating, three rounds: overhead_ab.sh OLD NEW
set -e
for round in 1 2 3; do
  for site in "$1" "$2"; do
    echo "## round $round, $site"
    PYTHONPATH="$site" python "$(dirname "$0")/overhead.py"
  done
done
