#!/usr/bin/env bash
# Installs the rig of the real-editor test (tests/integration/test_vscode_real.py):
# Chromium from Debian, and code-server (VS Code 1.100 served to a browser) and
# playwright-core from npm (package-lock.json here), into e2e/node_modules.
# Idempotent: a second run with the same inputs does nothing.
#
# Needs: Debian/Ubuntu (apt-get, as root or with sudo -n) for chromium and the
# build dependencies of code-server's native modules (g++, make, python3,
# libkrb5-dev); node 20 (code-server 4.100 refuses others); the npm registry.
# Not needed: GitHub, nodejs.org, Playwright's browser CDN (see below).
set -euo pipefail
cd "$(dirname "$0")"

stamp="node_modules/.installed-$(cat package-lock.json setup.sh | sha256sum | cut -c1-12)"
if [ -f "$stamp" ] && { [ -x /usr/lib/chromium/chromium ] || [ -x /usr/bin/chromium ]; }; then exit 0; fi

# -- system packages -----------------------------------------------------------
packages=(chromium g++ make python3 libkrb5-dev ripgrep)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then sudo=(); elif sudo -n true 2>/dev/null; then sudo=(sudo -n); else
    echo "setup.sh: missing Debian packages ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
    exit 1
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" != 20 ]; then
  echo "setup.sh: code-server 4.100.3 needs node 20 (this is node $major)" >&2
  exit 1
fi

# -- code-server's install-time downloads ----------------------------------------
# @vscode/ripgrep's postinstall fetches rg from GitHub's API; give it Debian's
# ripgrep (13.0.0, the version it wants) through the cache it reads first.
case "$(uname -m)" in x86_64) rg_target=x86_64-unknown-linux-musl ;; aarch64) rg_target=aarch64-unknown-linux-musl ;; *) rg_target= ;; esac
if [ -n "$rg_target" ]; then
  rg_cache="${TMPDIR:-/tmp}/vscode-ripgrep-cache-1.15.11"  # the @vscode/ripgrep of code-server 4.100.3
  rg_asset="$rg_cache/ripgrep-v13.0.0-10-$rg_target.tar.gz"
  if [ ! -s "$rg_asset" ]; then
    staging=$(mktemp -d)
    cp "$(command -v rg)" "$staging/rg"
    mkdir -p "$rg_cache"
    tar czf "$rg_asset" -C "$staging" rg
    rm -rf "$staging"
  fi
fi
# node-gyp fetches node's headers from nodejs.org unless told where they are.
if [ -f /usr/include/node/node_version.h ]; then export npm_config_nodedir=/usr; fi
# code-server's postinstall insists on unsafe-perm as root; node-pty's runs `npx node-gyp`.
export npm_config_unsafe_perm=true npm_config_yes=true

rm -rf node_modules
npm ci --no-audit --no-fund --loglevel=error
# Chromium comes from Debian: playwright-core downloads no browser.
node -e 'require("playwright-core")'
[ -d node_modules/code-server/lib/vscode/node_modules ] && [ -x node_modules/.bin/code-server ]
touch "$stamp"
echo "installed code-server $(node -p 'require("code-server/package.json").version') and playwright-core into editors/vscode/e2e/node_modules"
