#!/usr/bin/env bash
# Builds bin/kibotos (static, with the source revision stamped) and the
# bin/kibo alias. KIBOTOS_RELEASE=0.2.0 (or 0.3.0-beta.1) stamps a release;
# without it the build is "unreleased" and on no release line.
# KIBOTOS_BIN_DIR=DIR builds into DIR instead of bin/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
rev=$(git rev-parse HEAD 2>/dev/null || echo unknown)
flags="-X github.com/kibotos/kibotos/buildinfo.Revision=$rev"
if [ -n "${KIBOTOS_RELEASE:-}" ]; then
	if ! [[ $KIBOTOS_RELEASE =~ ^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-(alpha|beta)\.(0|[1-9][0-9]*))?$ ]]; then
		echo "KIBOTOS_RELEASE=$KIBOTOS_RELEASE is not MAJOR.MINOR.PATCH[-alpha.N|-beta.N], such as 0.2.0" >&2
		exit 2
	fi
	flags="$flags -X github.com/kibotos/kibotos/buildinfo.Release=${KIBOTOS_RELEASE#v}"
fi
out=${KIBOTOS_BIN_DIR:-bin}
mkdir -p "$out"
CGO_ENABLED=0 go build -trimpath -ldflags "$flags" -o "$out/kibotos" .
ln -sf kibotos "$out/kibo"
echo "built $out/kibotos $("$out/kibotos" version)"
