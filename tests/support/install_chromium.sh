#!/bin/sh
# Debian's chromium, in which tests/unit/test_docs.py opens every page of the
# documentation site. Nothing to do where it is installed already.
set -eu
command -v chromium >/dev/null 2>&1 && exit 0
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
