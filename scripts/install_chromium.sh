#!/usr/bin/env bash
# Install headless Chromium (Debian/Ubuntu package "chromium") for tests/test_report_browser.py.
# Idempotent: exits 0 at once when /usr/bin/chromium is already there. Needs root or sudo.
# Usage: scripts/install_chromium.sh
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [[ -x "$CHROMIUM" ]]; then
    echo "chromium already installed: $("$CHROMIUM" --version 2>/dev/null | tail -n 1)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium.sh: apt-get not found; install chromium with your package manager" >&2
    exit 1
fi

SUDO=""
if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install_chromium.sh: needs root (or sudo) to apt-get install chromium" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# Debian (the CI image) ships the real browser; recommends are kept (fonts for the screenshot).
# On Ubuntu the apt package is a snap wrapper that does not work in containers.
$SUDO apt-get install -y -qq chromium

if [[ ! -x "$CHROMIUM" ]]; then
    echo "install_chromium.sh: apt-get succeeded but $CHROMIUM is missing" >&2
    exit 1
fi
echo "chromium installed: $("$CHROMIUM" --version 2>/dev/null | tail -n 1)"
