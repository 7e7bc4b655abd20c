#!/bin/sh
# Make sure Debian's Chromium is at /usr/bin/chromium for the browser test (tests/test_browser.py).
# The test drives it through Python playwright; we never run `playwright install` (it downloads
# browsers and fails offline).
#   present          -> say so, exit 0
#   missing, root    -> apt-get install chromium (Debian/Ubuntu), exit with apt's status
#   missing, no root -> print what to run, exit 0: the browser test then skips, or fails when CI is set
set -u
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

if [ -x "$CHROMIUM" ]; then
    echo "ensure_chromium: found $CHROMIUM"
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    echo "ensure_chromium: NOTICE: $CHROMIUM is missing and we are not root, so the browser test"
    echo "  (tests/test_browser.py) will be skipped (or fail when CI is set). To enable it, run:"
    echo "    sudo apt-get update && sudo apt-get install -y chromium"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: NOTICE: $CHROMIUM is missing and this system has no apt-get; install"
    echo "  Chromium with your package manager (or set CHROMIUM=/path/to/chromium) to run the browser test."
    exit 0
fi
echo "ensure_chromium: installing Debian's chromium with apt-get (about 100 MB)..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq chromium >/dev/null
status=$?
if [ "$status" -ne 0 ] || [ ! -x "$CHROMIUM" ]; then
    echo "ensure_chromium: apt-get could not install chromium (exit $status); the browser test will skip (or fail when CI is set)." >&2
    exit 1
fi
echo "ensure_chromium: installed $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
