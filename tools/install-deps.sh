#!/usr/bin/env bash
# Installs, only when missing, the Debian packages meshrt's build, tests and benches need.
# Idempotent and quiet when nothing is missing. Run as root (or with sudo available).
set -euo pipefail
pkgs=(build-essential cmake catch2 libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
      libopenblas-dev libopenmpi-dev openmpi-bin libdlpack-dev gnuplot-nox)
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
