#!/usr/bin/env bash
# Validates the Kubernetes manifests under deploy/k8s against Kubernetes' own schemas with
# kubernetes-validate (PyPI), strictly: an unknown field is an error, not a warning. The
# schemas ship inside the package, so once it is installed the check needs no network.
# Usage: ci/k8s-validate.sh   (ci/test.sh runs it; a second run reuses the venv)
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/lib.sh

VENV="${CI_K8S_VENV:-.venv-k8s}"
# The Kubernetes version the manifests are checked against (the package bundles its schemas).
K8S_VERSION="${CI_K8S_VERSION:-1.33.0}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "kubernetes-validate==1.37.0"
ci_log "Kubernetes manifests: deploy/k8s/*.yaml against Kubernetes $K8S_VERSION (strict)"
"$VENV/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" deploy/k8s/*.yaml
echo "deploy/k8s: $(ls deploy/k8s/*.yaml | wc -l) manifest files valid"

# Every pod runs the image deploy/Containerfile builds, tagged with the workspace's version
# (docs/src/operations.md, "The image"): a release that bumps the version bumps the manifests.
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
bad=$(grep -Hn 'image:' deploy/k8s/*.yaml | grep -v "image: crescent:$version\$" || true)
if [ -n "$bad" ]; then
  echo "deploy/k8s: every image must be crescent:$version (Cargo.toml's version); these differ:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "deploy/k8s: every pod runs crescent:$version"
