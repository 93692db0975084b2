#!/usr/bin/env bash
# Builds the local images of lock-testkit's container mode (DISTLOCK_TESTKIT=containers
# DISTLOCK_TESTKIT_IMAGES=local): images FROM scratch holding the Debian-installed server
# binaries and every shared library they link (found with ldd), for machines that cannot pull
# the official images. Nothing is downloaded: the binaries come from this machine (installed
# with apt-get when missing).
#
#   distlock-local/redis:debian     /usr/bin/redis-server (+ /usr/bin/redis-sentinel)
#   distlock-local/etcd:debian      /usr/bin/etcd
#   distlock-local/postgres:debian  /usr/lib/postgresql/local/bin/{postgres,initdb}
#                                   (/usr/lib/postgresql/local -> the installed version)
#
# Every image also holds /usr/bin/setpriv (the test kit runs servers as a non-root user
# with it), /bin/sh (initdb runs postgres through popen), a minimal /etc/passwd and /tmp.
# Uses the engine DOCKER_HOST names (or /var/run/docker.sock).
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# copy ROOTFS PATH...: each path (dereferenced) at the same place in ROOTFS, with the
# shared libraries it links.
copy() {
  local rootfs=$1
  shift
  local path lib
  for path in "$@"; do
    cp -L --parents "$path" "$rootfs"
    if ldd "$path" >/dev/null 2>&1; then
      for lib in $(ldd "$path" | grep -o '/[^ ]*'); do
        [ -e "$rootfs$lib" ] || cp -L --parents "$lib" "$rootfs"
      done
    fi
  done
}

# base ROOTFS: what every image holds besides its server.
base() {
  local rootfs=$1
  mkdir -p "$rootfs/tmp" "$rootfs/etc" "$rootfs/bin"
  chmod 1777 "$rootfs/tmp"
  copy "$rootfs" /usr/bin/setpriv "$(readlink -f /bin/sh)"
  [ -e "$rootfs/bin/sh" ] || ln -s "$(readlink -f /bin/sh)" "$rootfs/bin/sh"
  cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
postgres:x:999:999:PostgreSQL:/tmp:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/sh
EOF
  cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
postgres:x:999:
nogroup:x:65534:
EOF
}

# import ROOTFS TAG
import() {
  echo "==> $2"
  tar -C "$1" -c . | docker import - "$2" >/dev/null
}

redis=$work/redis
base "$redis"
copy "$redis" /usr/bin/redis-server
# redis-server runs as a sentinel when started under this name.
ln -s redis-server "$redis/usr/bin/redis-sentinel"
import "$redis" distlock-local/redis:debian

etcd=$work/etcd
base "$etcd"
copy "$etcd" "$(command -v etcd)"
import "$etcd" distlock-local/etcd:debian

postgres=$work/postgres
base "$postgres"
version=$(ls /usr/lib/postgresql | sort -n | tail -1)
libdir=/usr/lib/postgresql/$version
# The whole tree (the binaries and the modules they load: plpgsql, dictionaries, ...) but
# the JIT (LLVM alone is over 100 MB; the test servers do not use it), and what they link.
cp -R --parents "$libdir" /usr/share/postgresql/"$version" "$postgres"
rm -rf "$postgres$libdir"/lib/llvmjit* "$postgres$libdir"/lib/bitcode
for file in "$postgres$libdir"/bin/* "$postgres$libdir"/lib/*.so; do
  copy "$postgres" "${file#"$postgres"}"
done
# initdb and postgres read time zone data from here (Debian builds with system tzdata).
[ -d /usr/share/zoneinfo ] && cp -R --parents /usr/share/zoneinfo "$postgres"
ln -s "$version" "$postgres/usr/lib/postgresql/local"
import "$postgres" distlock-local/postgres:debian

echo "==> local images built: distlock-local/{redis,etcd,postgres}:debian"
