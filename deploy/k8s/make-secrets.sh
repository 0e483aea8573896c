#!/bin/sh
# The secrets of deploy/k8s/: the deployment's CA, certificates and credentials made
# once by `spanflow secrets init` (kept in $SPANFLOW_K8S_SECRETS, default
# ./secrets-full beside this script: it holds the CA key, keep it off the cluster), and
# one Kubernetes Secret per role, written to the file given (default ./secrets.yaml):
#   ./make-secrets.sh && kubectl apply -f secrets.yaml && rm secrets.yaml
# Each pod mounts only its own role's Secret (docs/deploy.md#kubernetes).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
full=${SPANFLOW_K8S_SECRETS:-$here/secrets-full}
out=${1:-$here/secrets.yaml}
namespace=${SPANFLOW_K8S_NAMESPACE:-spanflow}
hub_hosts="hub-nats-0.hub-nats hub-nats-1.hub-nats hub-nats-2.hub-nats
  coordinator-0.coordinator coordinator-1.coordinator coordinator-2.coordinator spanflow-api"
set --
for h in $hub_hosts; do set -- "$@" --host "$h"; done
if [ ! -f "$full/credentials.json" ]; then
  spanflow secrets init --secrets-dir "$full" "$@" >/dev/null
  # The example's MQTT device (its password: spanflow secrets show / credentials.json).
  spanflow secrets device press-7 --publish 'plant.edge-a.press-7.>' --site edge-a --secrets-dir "$full" >/dev/null
fi
umask 077
parts=$(mktemp -d)
trap 'rm -rf "$parts"' EXIT
secret() {  # secret NAME export-options...: one role's bundle as a Secret
  name=$1; shift
  spanflow secrets export --secrets-dir "$full" --kube-secret "$name" \
    --namespace "$namespace" --out "$parts/$name.yaml" "$@" >/dev/null
}
# Nodes first: each gets a NATS user of its own, which the hub's and its site's
# bundles (made after) admit.
secret spanflow-cloud-1 --role agent --node cloud-1 --site cloud
for site in edge-a edge-b; do
  secret "spanflow-$site-1" --role agent --node "$site-1" --site "$site"
done
secret spanflow-hub --role coordinator "$@"
for site in edge-a edge-b; do
  secret "spanflow-$site-nats" --role site --site "$site" --host "$site-nats"
done
: >"$out"
for f in "$parts"/*.yaml; do
  printf -- '---\n' >>"$out"
  cat "$f" >>"$out"
done
echo "wrote $out (owner-only): kubectl apply -f $out, then delete it"
