#!/usr/bin/env bash
# Every torch library the binaries load comes from the chosen LibTorch (the venv's), and oneDNN and
# oneTBB from the venv's wheels: never Debian's libtorch 1.13 (python3-torch) or another copy that
# happens to be installed. Usage: linked_libraries.sh TORCH_LIBDIR VENV_LIBDIR BINARY...
set -euo pipefail
torch_lib=$(realpath "$1")
venv_lib=$(realpath "$2")
shift 2
bad=0
for bin in "$@"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      echo "$bin: $name not found" >&2
      bad=1
      continue
    fi
    real=$(realpath "$path")
    case "$name" in
    libc10*.so* | libtorch*.so* | libcaffe2*.so* | libshm.so*) want=$torch_lib ;;
    libdnnl.so* | libtbb.so* | libimf.so* | libintlc.so*) want=$venv_lib ;;
    *) continue ;;
    esac
    case "$real" in
    "$want"/*) ;;
    *)
      echo "$bin: $name from $real, not from $want" >&2
      bad=1
      ;;
    esac
  done < <(ldd "$bin")
done
[ $bad -eq 0 ] && echo "linked libraries: $# binaries, torch from $torch_lib, oneDNN/TBB from $venv_lib"
exit $bad
