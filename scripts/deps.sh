#!/usr/bin/env bash
# Installs the Debian packages moecel builds and tests with (skips what is already there).
set -euo pipefail
pkgs=(build-essential cmake pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev libutf8proc-dev libpcre2-dev
      libgtest-dev libgmock-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "${missing[@]}"
fi
