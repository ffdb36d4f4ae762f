#!/usr/bin/env bash
# Whole suite under other seed draws (KVARN_TEST_SEED_SALT), one salt after another.
cd "$(dirname "$0")/../../.."  # the checkout; PYTHONPATH: a --target install of it, as below
for salt in "$@"; do
  KVARN_TEST_SEED_SALT=$salt PYTHONPATH=/tmp/site_a timeout 1200 /tmp/kvarn-ci-venv/bin/python -m pytest -q -n 2 \
    -p no:cacheprovider tests/ > ${LOGDIR:-.}/salt_$salt.log 2>&1
  echo "salt $salt: $(tail -1 ${LOGDIR:-.}/salt_$salt.log)"
done
