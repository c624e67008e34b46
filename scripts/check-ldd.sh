#!/usr/bin/env bash
# check-ldd.sh BINARY — fail when the kvgate binary needs a shared library beyond libzmq, libzmq's
# own dependencies and glibc (libc, the loader, the vDSO, and the libpthread/libdl/librt/libm
# stubs older glibc releases still split out). So the runtime image needs libzmq5 and nothing
# else: a new cgo dependency shows here before it breaks the image.
set -euo pipefail
bin="${1:?usage: check-ldd.sh BINARY}"
[ -x "$bin" ] || { echo "check-ldd: $bin is not an executable" >&2; exit 1; }
command -v ldd >/dev/null || { echo "check-ldd: ldd is missing (Debian: libc-bin)" >&2; exit 1; }

# names FILE...: the sonames ldd lists (first field), one a line; "not found" fails.
names() {
  local out
  out="$(ldd "$@")"
  if grep -q 'not found' <<<"$out"; then
    echo "check-ldd: unresolved libraries:" >&2
    grep 'not found' <<<"$out" >&2
    exit 1
  fi
  awk '{ n = $1; sub(".*/", "", n); print n }' <<<"$out" | sort -u
}

mine="$(names "$bin")"
zmq="$(ldd "$bin" | awk '$1 ~ /^libzmq\.so/ { print $3 }')"
[ -n "$zmq" ] || { echo "check-ldd: $bin does not link libzmq (built without cgo?)" >&2; ldd "$bin" >&2; exit 1; }
allowed="$( { names "$zmq"; basename "$zmq"; echo libzmq.so.5
  printf '%s\n' libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 linux-vdso.so.1 ld-linux-x86-64.so.2 ld-linux-aarch64.so.1; } | sort -u)"
extra="$(comm -23 <(echo "$mine") <(echo "$allowed"))"
echo "check-ldd: $bin ($(du -k "$bin" | cut -f1) KiB) needs:" >&2
ldd "$bin" | sed -E "s/ \(0x[0-9a-f]+\)//; s/^[[:space:]]*/  /" >&2
if [ -n "$extra" ]; then
  echo "check-ldd: FAIL: beyond libzmq's dependencies and libc: $(echo "$extra" | tr '\n' ' ')" >&2
  exit 1
fi
echo "check-ldd: ok: nothing beyond libzmq ($zmq), its dependencies and libc" >&2
