#!/usr/bin/env bash
# Headless Chromium for smlt's browser tests (tests/browser, driven by Playwright for Python).
#   scripts/chromium.sh install   install Debian's chromium and chromium-driver with apt if missing
#                                 (idempotent: 0.1 s when present)
#   scripts/chromium.sh path      print the browser's path (exit 1 when missing)
# Playwright's own browser download (`playwright install`) is never used: the tests launch this
# binary through executable_path.
set -euo pipefail

cmd=${1:-install}

find_bin() {
  for p in "${SMLT_CHROMIUM:-}" /usr/bin/chromium /usr/bin/chromium-browser; do
    [[ -n $p && -x $p ]] && { echo "$p"; return 0; }
  done
  return 1
}

case $cmd in
  install)
    if bin=$(find_bin); then
      echo "chromium present: $bin"
      exit 0
    fi
    if ! command -v apt-get >/dev/null; then
      echo "chromium missing and no apt-get here: the browser tests will be skipped" >&2
      exit 0
    fi
    sudo=""
    [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
    $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium chromium-driver fonts-liberation >/dev/null
    bin=$(find_bin) || { echo "chromium still missing after apt-get install" >&2; exit 1; }
    echo "chromium installed: $bin"
    ;;
  path)
    find_bin
    ;;
  *)
    echo "usage: $0 install | path" >&2; exit 2
    ;;
esac
