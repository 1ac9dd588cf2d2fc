#!/usr/bin/env bash
# Adds to the GPU bundle (.gpu-bundle/, made by ../shared/gpu/make-bundle.sh)
# the Debian 12 packages Plexus has needed since that script's package list
# was written: SQLite 3.40 for the controller's journal (src/plexus/journal),
# civetweb 1.15 and prometheus-cpp 1.0.1 for the operator's web page
# (src/plexus/web).
# The shared script is read-only here, so this one unpacks its sysroot
# archive, adds the packages' files with the same layout (pkg-config files
# pointing at /tmp/plexus-sysroot, where the GPU machine's run.sh unpacks
# it), and packs it again. Idempotent: does nothing when they are in.
#
#   bash ../shared/gpu/make-bundle.sh && bash scripts/gpu-bundle-extra.sh
#   (or: make gpu-bundle)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
B="$root/.gpu-bundle"
PREFIX=/tmp/plexus-sysroot
A=x86_64-linux-gnu
# The journal's store: libsqlite3-dev (headers, .pc, the .so link) and the
# library it points at; bookworm's 3.40.1 matches the >= 3.40 the journal's
# CMakeLists.txt requires. The web page's: civetweb's library and CMake
# package (which names the civetweb program too, hence that package), and
# prometheus-cpp's, whose CMake package also finds CURL for its push
# library: curl's headers and library come so that it configures, though
# Plexus links prometheus-cpp's core alone. Chart.js, which the page
# embeds.
PKGS=(libsqlite3-dev libsqlite3-0
      libcivetweb-dev libcivetweb1 civetweb
      prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
      libprometheus-cpp-push1.0 libcurl4-openssl-dev libcurl4
      libjs-chart.js)
say() { echo "[gpu-bundle-extra] $*"; }
[ -f "$B/plexus-sysroot.tar.xz" ] || { say "no $B/plexus-sysroot.tar.xz: run make-bundle.sh first"; exit 1; }

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
tar -xJf "$B/plexus-sysroot.tar.xz" -C "$W"
R="$W/plexus-sysroot"
missing=$(for p in "${PKGS[@]}"; do grep -q "^$p " "$R/PACKAGES" || echo "$p"; done)
if [ -z "$missing" ]; then
  say "up to date: ${PKGS[*]} already in the sysroot"
  exit 0
fi
mkdir -p "$W/debs"
# shellcheck disable=SC2086  # one word per missing package
(cd "$W/debs" && apt-get -q -qq download $missing)
for d in "$W"/debs/*.deb; do dpkg-deb -x "$d" "$R"; done
for d in "$W"/debs/*.deb; do  # --show reads one archive
  dpkg-deb --show --showformat='${Package} ${Version}\n' "$d" >> "$R/PACKAGES"
done
sort -o "$R/PACKAGES" "$R/PACKAGES"
rm -rf "$R/usr/share/doc" "$R/usr/share/man" "$R/usr/share/lintian"
find "$R" \( -name 'libsqlite3*.a' -o -name 'libcurl*.a' -o -name 'libcivetweb*.a' \) -delete
# Their pkg-config files name /usr: point them at the prefix, as the shared
# script does for its own.
for pc in sqlite3 civetweb civetweb-cpp libcurl prometheus-cpp-core \
          prometheus-cpp-pull prometheus-cpp-push; do
  f="$R/usr/lib/$A/pkgconfig/$pc.pc"
  if [ -f "$f" ]; then
    sed -i -e "s#=/usr\\b#=$PREFIX/usr#g" -e "s#-I/usr/#-I$PREFIX/usr/#g" \
      -e "s#-L/usr/#-L$PREFIX/usr/#g" "$f"
  fi
done
say "added: $(echo $missing)"
(cd "$W" && tar -cf - plexus-sysroot | xz -T0 -6 > "$B/plexus-sysroot.tar.xz.new")
mv "$B/plexus-sysroot.tar.xz.new" "$B/plexus-sysroot.tar.xz"
say "repacked $B/plexus-sysroot.tar.xz ($(du -h "$B/plexus-sysroot.tar.xz" | cut -f1))"
