#!/usr/bin/env bash
# Make sure a headless Chromium is there for the dashboard's browser tests.
#
#   scripts/browser.sh up       # idempotent: install Debian's chromium (root) if missing
#   scripts/browser.sh status   # exit 0 when a chromium binary runs; print its path
#
# The tests drive it through Playwright's Python package with executable_path, so nothing
# is downloaded besides Debian's package (Playwright's own browser builds are never
# fetched). SANDVISOR_CHROMIUM points at another binary.
set -euo pipefail

say() { printf 'browser: %s\n' "$*" >&2; }

find_chromium() {
  local c
  for c in "${SANDVISOR_CHROMIUM:-}" chromium chromium-browser google-chrome; do
    [[ -n "$c" ]] || continue
    if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return 0; fi
  done
  return 1
}

works() {
  local bin; bin=$(find_chromium) || return 1
  "$bin" --headless --no-sandbox --version >/dev/null 2>&1
}

manual_steps() {
  cat >&2 <<'TXT'
browser: no Chromium found, and this script can only install one as root on Debian.
Do one of the following, then run `make browser` (or `scripts/browser.sh up`) again:
  * as root on Debian 12:  apt-get update && apt-get install -y chromium
  * or point SANDVISOR_CHROMIUM at a Chromium or Chrome binary you already have
TXT
}

up() {
  if works; then return 0; fi
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    manual_steps
    return 1
  fi
  say "installing chromium from Debian's packages (refreshing package lists first)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium fonts-dejavu-core >/dev/null
  works || { say "chromium was installed but does not start headless"; return 1; }
  say "chromium ready: $(find_chromium)"
}

case "${1:-up}" in
  up) up ;;
  status) works && find_chromium ;;
  *) echo "usage: $0 up|status" >&2; exit 2 ;;
esac
