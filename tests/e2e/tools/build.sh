#!/usr/bin/env bash
# Build helm and kustomize from Go modules for the chart and kustomization tests.
#
# Each tool is pinned by its own go.mod/go.sum in a directory beside this script (a module with
# no Go source of its own: its `tool` line names the upstream main package). One module per
# tool, so each is built with exactly the dependency versions its own release selects: helm
# and kustomize share Kubernetes libraries at different versions, and one module would raise
# both to the higher ones.
#
# Usage:
#   build.sh                      build (or reuse) both; the LAST stdout line is the bin dir
#   build.sh pin helm VERSION     regenerate helm/go.mod and go.sum (e.g. v3.22.0)
#   build.sh pin kustomize VERSION
#
# Output: ${SCHEDEXT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/schedext}/tools/
#         helm-<helm>-kustomize-<kustomize>/bin/{helm,kustomize}
# Nothing is written inside the repository. Everything but the final bin dir goes to stderr.
# A cold build takes about 2 minutes on 2 cores (module downloads included).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT=${SCHEDEXT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/schedext}/tools
STAMP_NAME=.complete

export GOTOOLCHAIN=local   # never download another toolchain (not reachable anyway)
export CGO_ENABLED=0       # static binaries like the release builds; no C compiler needed
export GOWORK=off          # ignore any go.work above the repo
# -mod=readonly: go.mod/go.sum are the pin; a build never rewrites them.
export GOFLAGS="-mod=readonly -buildvcs=false"

log() { echo "tools/build.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Non-login shells (CI) may lack Go's standard install location on PATH.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
  PATH=/usr/local/go/bin:$PATH
fi
command -v go >/dev/null || die "go not found on PATH (needs the Go version of the go.mod files)"

# The upstream module and main package of each tool.
module_of() {
  case $1 in
    helm) echo helm.sh/helm/v3 ;;
    kustomize) echo sigs.k8s.io/kustomize/kustomize/v5 ;;
    *) die "unknown tool '$1' (helm or kustomize)" ;;
  esac
}
package_of() {
  case $1 in
    helm) echo helm.sh/helm/v3/cmd/helm ;;
    kustomize) echo sigs.k8s.io/kustomize/kustomize/v5 ;;
  esac
}

# Version of a module as required in a tool's go.mod (parsed, so the cached path needs no
# network).
required_version() {
  awk -v m="$2" '($1 == m || ($1 == "require" && $2 == m)) { for (i = 1; i <= NF; i++) if ($i ~ /^v[0-9]/) { print $i; exit } }' \
    "$HERE/$1/go.mod"
}

# pin TOOL VERSION: a module that requires only the tool, so that `go mod tidy` selects
# exactly the versions of the tool's own go.mod (its replace lines, if any, do not apply to a
# dependency: `go install tool@version` would refuse such a module, and so do we).
pin() {
  local tool=$1 version=$2 module work
  module=$(module_of "$tool")
  [[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "pin wants a version like v3.22.0, got '$version'"
  work=$(mktemp -d)
  (
    cd "$work"
    local upstream
    upstream=$(go mod download -json "$module@$version" |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["GoMod"])')
    if grep -q '^replace' "$upstream"; then
      die "$module@$version has replace directives: not buildable as a dependency"
    fi
    cat >go.mod <<EOF
// Pins $tool for the chart and kustomization tests. No Go source lives here: the \`tool\` line
// names the unmodified upstream main package that ../build.sh compiles. Regenerate with
// \`../build.sh pin $tool <version>\`.
module schedext.local/tools/$tool
EOF
    go mod edit -go="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$upstream")"
    go mod edit -require="$module@$version" -tool="$(package_of "$tool")"
    GOFLAGS=-mod=mod go mod tidy
  )
  cp "$work/go.mod" "$work/go.sum" "$HERE/$tool/"
  rm -rf "$work"
  log "pinned $module $version"
}

# Stamp what the release builds stamp (helm's Makefile): the version, and the Kubernetes
# version helm assumes without a cluster (`helm template`, `helm lint`'s deprecation check),
# which is that of the client-go it is built with (v0.37 -> 1.37).
helm_ldflags() {
  local version=$1 client_go major minor
  client_go=$(required_version helm k8s.io/client-go)
  major=$(($(echo "${client_go#v}" | cut -d. -f1) + 1))
  minor=$(echo "$client_go" | cut -d. -f2)
  local flags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
  flags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  flags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$major"
  flags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  flags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$major"
  flags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  echo "$flags"
}

is_complete() {
  local d=$1
  [[ -f $d/$STAMP_NAME && -x $d/bin/helm && -x $d/bin/kustomize ]]
}

build() {
  local helm kustomize dest tmp start elapsed
  helm=$(required_version helm "$(module_of helm)")
  kustomize=$(required_version kustomize "$(module_of kustomize)")
  [[ -n $helm && -n $kustomize ]] || die "the go.mod files do not pin helm and kustomize"
  dest="$CACHE_ROOT/helm-$helm-kustomize-$kustomize"

  if is_complete "$dest"; then
    log "cached: $dest/bin"
    echo "$dest/bin"
    return
  fi

  mkdir -p "$CACHE_ROOT"
  # Serialise concurrent builds (parallel test sessions); the loser finds the cache complete.
  exec 9>"$CACHE_ROOT/.lock"
  flock 9
  if is_complete "$dest"; then
    log "cached (built concurrently): $dest/bin"
    echo "$dest/bin"
    return
  fi

  # Holding the lock, any .build.* dir is the leftover of a killed build.
  rm -rf "$CACHE_ROOT"/.build.*

  start=$(date +%s)
  log "building helm $helm and kustomize $kustomize (cold: about 2 min on 2 cores)"
  log "$(go version), GOMODCACHE=$(go env GOMODCACHE), GOCACHE=$(go env GOCACHE)"
  # Build into a temp dir on the same filesystem and rename it into place at the end, so an
  # interrupted build never leaves a directory that looks complete.
  tmp=$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  chmod 755 "$tmp"
  mkdir "$tmp/bin"

  (cd "$HERE/helm" && go build -trimpath -ldflags "$(helm_ldflags "$helm")" -o "$tmp/bin/" \
    "$(package_of helm)")
  (cd "$HERE/kustomize" && go build -trimpath -ldflags "-s -w" -o "$tmp/bin/" \
    "$(package_of kustomize)")

  "$tmp/bin/helm" version --short >&2
  "$tmp/bin/kustomize" version >&2

  date -u +%Y-%m-%dT%H:%M:%SZ >"$tmp/$STAMP_NAME" # written last: marks the build complete
  rm -rf "$dest"                                   # an incomplete leftover, if any
  mv "$tmp" "$dest"
  trap - EXIT

  elapsed=$(($(date +%s) - start))
  log "built in ${elapsed}s"
  du -h "$dest"/bin/* | sed 's/^/tools\/build.sh: size /' >&2
  echo "$dest/bin"
}

case ${1:-build} in
  build) build ;;
  pin) pin "${2:?usage: build.sh pin helm|kustomize VERSION}" "${3:?usage: build.sh pin TOOL VERSION}" ;;
  *) die "usage: build.sh [build | pin helm|kustomize VERSION]" ;;
esac
