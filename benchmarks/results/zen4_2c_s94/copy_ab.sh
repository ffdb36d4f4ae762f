#!/usr/bin/env bash
# Fifty-fourth session: KVCache.copy() sharing its records (new) against copying them (old: cache.py as of
# 509d210, `git show 509d210:src/kvarn/cache.py`), alternating processes. SITE: a `pip install --target` build of
# the working tree; the old build is that site with the old cache.py in place.
set -euo pipefail
SITE=${SITE:-/tmp/site_b}
rm -rf /tmp/site_old && mkdir -p /tmp/site_old && cp -r "$SITE/kvarn" /tmp/site_old/
git -C "$(dirname "$0")" show 509d210:src/kvarn/cache.py > /tmp/site_old/kvarn/cache.py
for round in 1 2; do
  for build in old new; do
    site=$([ $build = old ] && echo /tmp/site_old || echo "$SITE")
    echo "== round $round, $build"
    PYTHONPATH=$site python3 "$(dirname "$0")/copy_speed.py"
  done
done
