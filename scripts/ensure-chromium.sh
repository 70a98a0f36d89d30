#!/usr/bin/env bash
# Make Debian's headless-capable Chromium available at /usr/bin/chromium for the dashboard's
# browser tests (Playwright drives it; Playwright's own browser download needs the internet,
# which these machines do not have). Idempotent; prints what it did.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  echo "chromium: $(/usr/bin/chromium --version 2>/dev/null || echo present)"
  exit 0
fi
echo "chromium: not installed, installing from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
echo "chromium: $(/usr/bin/chromium --version 2>/dev/null || echo installed)"
