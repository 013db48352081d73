#!/bin/sh
# Installs the Debian packages the build needs, when any is missing.
# Called by `make`; safe to run by hand. Needs root or sudo for apt-get.
set -e
PACKAGES="flex bison libcriterion-dev libutf8proc-dev libjansson-dev pkg-config g++"
missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing$missing" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq >&2 || true
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >&2
