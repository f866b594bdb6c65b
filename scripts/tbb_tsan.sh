#!/usr/bin/env bash
# oneTBB built with ThreadSanitizer, for the tsan preset (scripts/build.sh tsan runs this first).
# TSan sees a hand-off only where both sides are instrumented: with the PyPI libtbb, a flow-graph
# task made on one thread and run on another reads as a race, so the pipeline could not be put
# under TSan. This builds Debian's own source package of oneTBB (bookworm's onetbb 2021.8, fetched with
# `apt-get source` through a private source list and lists folder: the machine's apt
# configuration is not touched; apt checks the files against Debian's signed index) with oneTBB's
# own TBB_SANITIZE=thread, and installs it into $KDFLOW_DEPS/tbb-tsan (~/.cache/kdflow/tbb-tsan).
# The tsan preset compiles against its headers and runs on its libtbb (KdflowDeps.cmake); the
# uninstrumented PyPI oneDNN loads that libtbb too (same soname, the entry points it needs exist
# in 2021.8). A second run returns at once. Usage: bash scripts/tbb_tsan.sh
set -euo pipefail
deps=${KDFLOW_DEPS:-$HOME/.cache/kdflow}
prefix=$deps/tbb-tsan
stamp=$prefix/.kdflow-tbb-tsan-2
if [ -f "$stamp" ]; then
  exit 0
fi
work=$(mktemp -d /tmp/kdflow-tbb-tsan.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/sources" "$work/lists/partial"
cat >"$work/sources/debian-src.sources" <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt_=(apt-get -qq -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/sources"
  -o Dir::State::Lists="$work/lists" -o Debug::NoDropPrivs=1 -o APT::Sandbox::User=root)
echo "tbb-tsan: fetching Debian's onetbb source"
"${apt_[@]}" update
(cd "$work" && "${apt_[@]}" source --download-only onetbb >/dev/null)
tarball=$(ls "$work"/onetbb_*.orig.tar.*)
tar -xf "$tarball" -C "$work"
source_dir=$(ls -d "$work"/oneTBB-*/)
echo "tbb-tsan: building $(basename "$source_dir") with -fsanitize=thread into $prefix"
# The compilers the tsan preset builds kdflow with (the system's cc and c++), so one TSan runtime
# serves both.
cmake -S "$source_dir" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=cc -DCMAKE_CXX_COMPILER=c++ -DTBB_SANITIZE=thread \
  -DTBB_TEST=OFF -DTBB_EXAMPLES=OFF -DTBBMALLOC_BUILD=OFF -DTBB_STRICT=OFF \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j "$(nproc)" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log" >&2; exit 1; }
rm -rf "$prefix"
cmake --install "$work/build" >/dev/null
touch "$stamp"
