#!/usr/bin/env bash
# The system binaries the test suite runs (it starts them itself; it never uses a server already listening).
# Installs what is missing with apt-get when that is possible (root on Debian/Ubuntu); otherwise stops at once
# and prints the one command that would install them.
#   required: redis-server (the Redis store's tests start a private one)
#   optional: promtool (package prometheus; checks the alert rules), chromium (renders the HTML report),
#             buildah, podman and debootstrap (build and start the container image, on a base made from
#             Debian's packages); their tests are reported as skipped, with the reason, when they are absent.
set -euo pipefail

declare -A PACKAGE=([redis-server]=redis-server [promtool]=prometheus [chromium]=chromium [buildah]=buildah
  [podman]=podman [debootstrap]=debootstrap)
REQUIRED=(redis-server)
OPTIONAL=(promtool chromium buildah podman debootstrap)

missing() { for b in "$@"; do command -v "$b" >/dev/null 2>&1 || echo "$b"; done; }
packages() { for b in "$@"; do echo "${PACKAGE[$b]}"; done | tr '\n' ' '; }

mapfile -t need < <(missing "${REQUIRED[@]}")
mapfile -t want < <(missing "${OPTIONAL[@]}")
[ ${#need[@]} -eq 0 ] && [ ${#want[@]} -eq 0 ] && exit 0

can_apt=0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then can_apt=1; fi

if [ ${#need[@]} -gt 0 ]; then
  if [ $can_apt = 0 ]; then
    echo "make test needs: ${need[*]}. Install it with:" >&2
    echo "  sudo apt-get install -y $(packages "${need[@]}")" >&2
    exit 1
  fi
  echo "installing $(packages "${need[@]}")"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $(packages "${need[@]}") >/dev/null
fi

# Optional packages are tried once per checkout (the stamp), so a machine without them is not slowed down by
# a failing apt-get on every run.
STAMP="${SYSDEPS_STAMP:-.venv/.system-deps-optional-tried}"
if [ ${#want[@]} -gt 0 ] && [ ! -e "$STAMP" ]; then
  mkdir -p "$(dirname "$STAMP")" && touch "$STAMP"
  if [ $can_apt = 1 ]; then
    echo "installing $(packages "${want[@]}") (optional; best effort)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
      --no-install-recommends $(packages "${want[@]}")) >/dev/null 2>&1 \
      || echo "could not install $(packages "${want[@]}"); their tests will be reported as skipped"
  else
    echo "optional, not installed: ${want[*]} (sudo apt-get install -y $(packages "${want[@]}")); their tests will be reported as skipped"
  fi
fi
