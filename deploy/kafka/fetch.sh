#!/usr/bin/env bash
# Gather the Kafka broker's runtime jars (pom.xml) into a cache dir, once.
# Prints the jar dir on stdout. Later runs are offline: they only check a stamp.
# Cache: $TSI_KAFKA_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/tsi-kafka.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${TSI_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tsi-kafka}
lib=$cache/lib
plugin=org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies

die() { echo "fetch.sh: $*" >&2; exit 1; }

# Java 17+ is needed to run the broker whether or not the jars are cached.
java=${JAVA_HOME:+$JAVA_HOME/bin/}java
command -v "$java" >/dev/null ||
  die "java not found: install Java 17+ (Debian: apt-get install openjdk-17-jdk-headless)"
major=$("$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
[[ ${major:-0} -ge 17 ]] || die "Java ${major:-?} found, Kafka 4 needs Java 17+ (openjdk-17-jdk-headless)"

# The stamp holds the pom's hash, so editing pom.xml triggers a re-fetch.
want=$(sha256sum "$here/pom.xml" | cut -d' ' -f1)
stamp_ok() { [[ -f $lib/.complete && $(cat "$lib/.complete") == "$want" ]]; }
if stamp_ok; then echo "$lib"; exit 0; fi

command -v mvn >/dev/null ||
  die "mvn not found: install Maven 3.8+ (Debian: apt-get install maven) to download the Kafka jars"

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock -w 900 9 || die "timed out waiting for another fetch ($cache/.lock)"
if stamp_ok; then echo "$lib"; exit 0; fi   # another process just fetched

tmp=$(mktemp -d "$cache/lib.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
args=(-B -q -f "$here/pom.xml" "$plugin" -DincludeScope=runtime -DoutputDirectory="$tmp")
# Try offline first (everything already in ~/.m2), then online (Maven Central).
if ! mvn -o "${args[@]}" >/dev/null 2>&1; then
  echo "fetch.sh: downloading Kafka jars from Maven Central into ~/.m2 ..." >&2
  # mvn 3.8 -q still prints stray colour codes, so show its output only on failure.
  mvn "${args[@]}" >"$cache/mvn.log" 2>&1 ||
    { cat "$cache/mvn.log" >&2; die "mvn failed to fetch the jars listed in $here/pom.xml"; }
fi
ls "$tmp"/kafka_2.13-*.jar >/dev/null 2>&1 || die "no kafka_2.13 jar in $tmp after mvn"

chmod 755 "$tmp"
echo "$want" >"$tmp/.complete"
rm -rf "$lib"
mv "$tmp" "$lib"
echo "$lib"
