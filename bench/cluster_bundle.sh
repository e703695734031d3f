#!/usr/bin/env bash
# Build a self-contained bundle of the members' benchmark (bench/bench_cluster.py) for a
# machine with no network and no Java: a jlink Java runtime, the broker's jars, wheels of
# the project and of everything it imports (for one Python version, manylinux x86_64), the
# benchmark's scripts, and run.sh, which installs into a venv offline and runs it.
#
# Usage: bench/cluster_bundle.sh [OUT_DIR=build/cluster-bundle]
# Env: PYTHON (the Python the project's wheel is built with, default python3.12; its
# version is the bundle's), JAVA_HOME (the JDK whose jlink and jdeps are used).
# Makes OUT_DIR and OUT_DIR.tar.gz. On the target: tar xzf cluster-bundle.tar.gz &&
# cluster-bundle/run.sh [bench_cluster.py options, e.g. --sizes 1,2,4,8]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(mkdir -p "${1:-$root/build/cluster-bundle}" && cd "${1:-$root/build/cluster-bundle}" && pwd)
py=${PYTHON:-python3.12}
bin=${JAVA_HOME:+$JAVA_HOME/bin/}
die() { echo "cluster_bundle.sh: $*" >&2; exit 1; }
command -v "$py" >/dev/null || die "$py not found: set PYTHON to the target's Python version"
version=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
rm -rf "${out:?}"/*

# 1. the broker's jars, as deploy/kafka/fetch.sh keeps them (its stamp included)
lib=$("$root/deploy/kafka/fetch.sh")
mkdir -p "$out/kafka/lib"
cp "$lib"/*.jar "$lib/.complete" "$out/kafka/lib/"

# 2. a Java runtime of the modules the jars use (jdeps, jar by jar: the whole set does not
# resolve as modules), with those the broker loads by name at run time
found=$(for jar in "$lib"/*.jar; do
  "${bin}jdeps" --ignore-missing-deps --print-module-deps --multi-release 17 "$jar" 2>/dev/null || true
done | tr ',' '\n')
modules=$(printf '%s\n' $found java.naming java.xml jdk.management jdk.crypto.ec jdk.zipfs |
  sort -u | paste -sd, -)
"${bin}jlink" --add-modules "$modules" --strip-debug --no-man-pages --no-header-files \
  --compress=2 --output "$out/jre" 2>/dev/null
echo "$modules" >"$out/jre/MODULES"

# 3. wheels: the project's (built here), its dependencies and the benchmark's (psutil)
mkdir -p "$out/wheels"
"$py" -m pip wheel -q --no-deps -w "$out/wheels" "$root"
# (pip takes each --platform tag as it is: the manylinux tags up to glibc 2.31, Bytewax's)
platforms=()
for tag in manylinux1 manylinux2010 manylinux2014 manylinux_2_17 manylinux_2_24 \
  manylinux_2_27 manylinux_2_28 manylinux_2_31 linux; do
  platforms+=(--platform "${tag}_x86_64")
done
"$py" -m pip download -q -d "$out/wheels" --only-binary=:all: --python-version "$version" \
  "${platforms[@]}" "$(ls "$out"/wheels/tsi-*.whl)" psutil

# 4. the benchmark's scripts and the broker's start-up (no flows/ here: the wheel's)
mkdir -p "$out/src/bench" "$out/src/deploy"
cp "$root"/bench/bench_cluster.py "$root"/bench/bench_flow.py "$root"/bench/flow_*.py \
  "$root"/bench/open_loop.py \
  "$out/src/bench/"
cp -r "$root/deploy/kafka" "$out/src/deploy/"
# the commit built from, for the figures (the bundle has no git); -dirty: changes not committed
dirty=$(git -C "$root" status --porcelain flows tsi_core bench deploy pyproject.toml setup.py)
echo "$(git -C "$root" rev-parse --short HEAD)${dirty:+-dirty}" >"$out/src/COMMIT"

cat >"$out/run.sh" <<RUN
#!/usr/bin/env bash
# Install the bundle into a venv (offline) and run bench/bench_cluster.py with the bundle's
# Java runtime and broker jars; arguments go to bench_cluster.py.
set -euo pipefail
here=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
py=\${PYTHON:-python$version}
if [[ ! -x \$here/venv/bin/python ]]; then
  "\$py" -m venv "\$here/venv"
  "\$here/venv/bin/pip" install -q --no-index --find-links "\$here/wheels" "\$here"/wheels/tsi-*.whl psutil
fi
cd "\$here/src"
exec "\$here/venv/bin/python" bench/bench_cluster.py --java-home "\$here/jre" \\
  --kafka-jars "\$here/kafka" --out "\$here/cluster_results.json" "\$@"
RUN
chmod +x "$out/run.sh"
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
du -sh "$out" "$out.tar.gz"
