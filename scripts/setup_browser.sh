#!/usr/bin/env bash
# Prepare headless Chromium for BrowserGym (MiniWoB++, WebArena-Lite). Idempotent.
#
#   scripts/setup_browser.sh            # installs Debian chromium if missing (needs root), builds the shim
#   eval "$(scripts/setup_browser.sh)"  # ... and exports PLAYWRIGHT_BROWSERS_PATH and MINIWOB_URL
#
# Environment: PYTHON (default: .venv/bin/python of this repo, else python3), COEVO_CACHE (shim goes to
# $COEVO_CACHE/ms-playwright, default ~/.cache/coevo/ms-playwright), COEVO_CHROMIUM (use this binary).
# The shim logic lives in coevo/envs/browser.py; only the apt-get part is here.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi

cd "$repo"
# the Python side first (playwright, BrowserGym, miniwob): without it the shim cannot be built, so installing
# Chromium with apt-get would only postpone the error (coevo.envs.browser names the command that fixes it)
if ! "$PYTHON" -c "import coevo" >/dev/null 2>&1; then
  echo "error: $PYTHON cannot import coevo; run scripts/install.sh first (or set PYTHON to the venv's python)" >&2
  exit 1
fi
if ! msg=$("$PYTHON" -c "
import os
os.environ['PLAYWRIGHT_BROWSERS_PATH'] = 'unused'  # Chromium is checked below, after the packages
from coevo.envs.browser import BrowserSetupError, check_browser_ready
try:
    check_browser_ready('miniwob')
except BrowserSetupError as exc:
    raise SystemExit(str(exc))
" 2>&1); then
  echo "error: $msg" >&2
  exit 1
fi
have_chromium() {  # same search as coevo.envs.browser.find_chromium ($COEVO_CHROMIUM, then PATH)
  "$PYTHON" -c "from coevo.envs.browser import find_chromium; find_chromium()" >/dev/null 2>&1
}

if ! have_chromium; then
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "error: Chromium is missing; run this script as root (it runs apt-get install chromium)" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: Chromium is missing and apt-get is unavailable; install Chromium and set COEVO_CHROMIUM" >&2
    exit 1
  fi
  echo "installing chromium with apt-get ..." >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation >&2
fi

exec "$PYTHON" -m coevo.envs.browser
