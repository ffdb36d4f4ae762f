#!/usr/bin/env bash
# The native drivers under ThreadSanitizer, once per ISA this machine supports: scripts/asan.sh with SANITIZER=thread.
#   bash scripts/tsan.sh [build-dir]
SANITIZER=thread exec bash "$(dirname "$0")/asan.sh" "${1:-build-tsan}"
