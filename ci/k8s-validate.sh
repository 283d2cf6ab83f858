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
