#!/usr/bin/env bash
# Build unmodified kube-apiserver, kube-scheduler, kube-controller-manager and etcd from Go
# modules for the e2e tests. kube-controller-manager is started only by the tests that ask for it
# (the DRA ones: its resourceclaim controller makes the ResourceClaims of ResourceClaimTemplates).
#
# The versions are pinned by go.mod/go.sum beside this script (a module with no Go source of its
# own: its `tool` lines name the four upstream main packages, and its `replace` lines map the
# Kubernetes staging modules, which k8s.io/kubernetes requires at the placeholder v0.0.0, to
# their published v0.<minor>.<patch> tags).
#
# Usage:
#   build.sh              build (or reuse) the binaries; the LAST stdout line is the bin dir
#   build.sh pin VERSION  regenerate go.mod/go.sum for Kubernetes VERSION (e.g. 1.36.3)
#
# Output: ${SCHEDEXT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/schedext}/k8s-testbin/
#         v<k8s>-etcd<etcd>/bin/{kube-apiserver,kube-scheduler,kube-controller-manager,etcd}
#         A cache dir that lacks one of them (one built before kube-controller-manager was
#         added) is rebuilt whole; Go's build cache makes the ones it had quick to relink.
# Time: cold (empty Go build cache, modules already downloaded) 7 min 2 s for all four on 2
# cores shared with other work (v1.36.3); with a Go build cache that already has the other
# three, 72 s. An empty Go module cache adds the module downloads to either.
# Nothing is written inside the repository. Everything but the final bin dir goes to stderr.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT=${SCHEDEXT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/schedext}/k8s-testbin
STAMP_NAME=.complete

export GOTOOLCHAIN=local   # never download another toolchain (not reachable anyway)
export CGO_ENABLED=0       # static binaries like the release builds; no C compiler needed
export GOWORK=off          # ignore any go.work above the repo
# -mod=readonly: go.mod/go.sum are the pin; a build never rewrites them.
export GOFLAGS="-mod=readonly -buildvcs=false"

log() { echo "build.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

# Non-login shells (CI) may lack Go's standard install location on PATH.
if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
  PATH=/usr/local/go/bin:$PATH
fi
command -v go >/dev/null || die "go not found on PATH (needs the Go version of go.mod's go line)"

# Version of a module as required in our go.mod (parsed, so the cached path needs no network).
required_version() {
  awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$HERE/go.mod"
}

# pin VERSION: write go.mod from k8s.io/kubernetes' own go.mod (its go/godebug lines and its
# staging module list), then let `go mod tidy` resolve everything else and write go.sum.
pin() {
  local version=${1#v}
  [[ $version =~ ^1\.[0-9]+\.[0-9]+$ ]] || die "pin wants a version like 1.36.3, got '$1'"
  local staging="v0.${version#1.}" work kmod
  work=$(mktemp -d)
  kmod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@v$version" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["GoMod"])')
  (
    cd "$work"
    cat >go.mod <<'EOF'
// Pins the Kubernetes control plane used by the e2e tests. No Go source lives here: the `tool`
// lines name the unmodified upstream main packages that build.sh compiles. Regenerate with
// `build.sh pin <version>`; the replace list comes from k8s.io/kubernetes' own go.mod.
module schedext.local/k8s-testbin
EOF
    go mod edit -go="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$kmod")"
    local godebug
    godebug=$(sed -n 's/^godebug default=\(go[0-9.]*\)$/\1/p' "$kmod")
    [[ -z $godebug ]] || go mod edit -godebug="default=$godebug"
    # One grouped replace block (go mod edit -replace would write one statement per line).
    {
      echo
      echo "replace ("
      sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*#\1#p' "$kmod" |
        sort -u | while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
      echo ")"
    } >>go.mod
    go mod edit -require="k8s.io/kubernetes@v$version" \
      -tool=k8s.io/kubernetes/cmd/kube-apiserver \
      -tool=k8s.io/kubernetes/cmd/kube-scheduler \
      -tool=k8s.io/kubernetes/cmd/kube-controller-manager \
      -tool=go.etcd.io/etcd/server/v3
    GOFLAGS=-mod=mod go mod tidy
  )
  cp "$work/go.mod" "$work/go.sum" "$HERE/"
  rm -rf "$work"
  log "pinned k8s.io/kubernetes v$version, etcd $(required_version go.etcd.io/etcd/server/v3)"
}

k8s_ldflags() {
  local version=$1 minor p flags="-s -w"
  minor=$(echo "${version#v}" | cut -d. -f2)
  # Stamp /version like a release build; unstamped builds report v0.0.0-master.
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    flags+=" -X $p.gitTreeState=clean"
  done
  echo "$flags"
}

BINARIES=(kube-apiserver kube-scheduler kube-controller-manager etcd)

is_complete() {
  local d=$1 b
  [[ -f $d/$STAMP_NAME ]] || return 1
  for b in "${BINARIES[@]}"; do [[ -x $d/bin/$b ]] || return 1; done
}

build() {
  local k8s etcd dest tmp start elapsed
  k8s=$(required_version k8s.io/kubernetes)
  etcd=$(required_version go.etcd.io/etcd/server/v3)
  [[ -n $k8s && -n $etcd ]] || die "go.mod does not pin k8s.io/kubernetes and etcd server"
  dest="$CACHE_ROOT/$k8s-etcd${etcd#v}"

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
  log "building kube-apiserver/kube-scheduler/kube-controller-manager $k8s and etcd $etcd"
  log "(cold: about 7 min on 2 cores; about 1 min when only kube-controller-manager is new)"
  log "$(go version), GOMODCACHE=$(go env GOMODCACHE), GOCACHE=$(go env GOCACHE)"
  # Build into a temp dir on the same filesystem and rename it into place at the end, so an
  # interrupted build never leaves a directory that looks complete.
  tmp=$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  chmod 755 "$tmp"
  mkdir "$tmp/bin"

  (
    cd "$HERE"
    # One invocation so the go command schedules all compile actions together; -X symbols that a
    # binary does not link (etcd) are ignored by the linker.
    go build -trimpath -ldflags "$(k8s_ldflags "$k8s")" -o "$tmp/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-scheduler \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      go.etcd.io/etcd/server/v3
  )
  # go names the binary of .../server/v3 after its last non-version element.
  mv "$tmp/bin/server" "$tmp/bin/etcd"

  "$tmp/bin/kube-apiserver" --version >&2
  "$tmp/bin/kube-scheduler" --version >&2
  "$tmp/bin/kube-controller-manager" --version >&2
  "$tmp/bin/etcd" --version 2>&1 | head -1 >&2

  date -u +%Y-%m-%dT%H:%M:%SZ >"$tmp/$STAMP_NAME" # written last: marks the build complete
  rm -rf "$dest"                                   # an incomplete leftover, if any
  mv "$tmp" "$dest"
  trap - EXIT

  elapsed=$(($(date +%s) - start))
  log "built in ${elapsed}s"
  du -h "$dest"/bin/* | sed 's/^/build.sh: size /' >&2
  du -sh "$(go env GOMODCACHE)" "$(go env GOCACHE)" 2>/dev/null | sed 's/^/build.sh: cache /' >&2 || true
  echo "$dest/bin"
}

case ${1:-build} in
  build) build ;;
  pin) pin "${2:?usage: build.sh pin VERSION}" ;;
  *) die "usage: build.sh [build | pin VERSION]" ;;
esac
