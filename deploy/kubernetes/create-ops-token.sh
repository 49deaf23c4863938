#!/usr/bin/env bash
# Create an ops token on Kubernetes: the first one (nobody can sign in to the console before
# it exists), and any later one. It runs `jobfence ops token create` inside a running ops pod
# (`kubectl exec`), which already has the database Secret and the image's jobfence, and
# prints the token once, on your terminal only: unlike a Job, nothing keeps it in pod logs.
#
#   deploy/kubernetes/create-ops-token.sh NAME [viewer|operator] [EXPIRES_IN]
#   deploy/kubernetes/create-ops-token.sh alice operator 30d
#
# JOBFENCE_NAMESPACE (default jobfence) and KUBECTL (default kubectl) can be overridden.
# Revoke with: kubectl -n jobfence exec deploy/jobfence-ops -c ops -- jobfence ops token revoke NAME
set -euo pipefail

usage="usage: $0 NAME [viewer|operator] [EXPIRES_IN, e.g. 30d or never]"
name=${1:?$usage}
role=${2:-operator}
expires=${3:-90d}
case "$role" in
  viewer | operator) ;;
  *) echo "$0: the role is viewer or operator, not '$role'" >&2; exit 2 ;;
esac
namespace=${JOBFENCE_NAMESPACE:-jobfence}
actor=${USER:-$(id -un)}

exec "${KUBECTL:-kubectl}" -n "$namespace" exec deploy/jobfence-ops -c ops -- \
  jobfence ops token create --name "$name" --role "$role" --expires-in "$expires" \
  --actor "kubectl:$actor"
