#!/bin/sh
# One-shot, run by the "secrets" service before anything else: the deployment's secrets
# (`spanflow secrets init`) in the "secrets" volume, made once, and one bundle per role
# in that role's own volume (`spanflow secrets export`). Each service mounts only its
# own bundle, read-only; the full secrets (with the CA key) stay in this volume.
set -eu
full=/secrets/full
hosts="hub-nats-1 hub-nats-2 hub-nats-3 coordinator-1 coordinator-2 coordinator-3"
if [ ! -f "$full/credentials.json" ]; then
  set --
  for h in $hosts; do set -- "$@" --host "$h"; done
  spanflow secrets init --secrets-dir "$full" "$@"
  # The MQTT device of the example: its password is in $full/credentials.json
  # (`spanflow secrets device` prints it once; re-key a device the same way).
  spanflow secrets device press-7 --publish 'plant.edge-a.press-7.>' --site edge-a --secrets-dir "$full" >/dev/null
fi
bundle() {  # bundle VOLUME-DIR export-options...: made once, owned by the image's user
  dir=$1; shift
  if [ ! -f "$dir/credentials.json" ]; then
    spanflow secrets export --secrets-dir "$full" --out "$dir" "$@" >/dev/null
  fi
  chown -R 10001:10001 "$dir"
  chmod 700 "$dir"
}
set --
for h in $hosts; do set -- "$@" --host "$h"; done
# Nodes first: each gets a NATS user of its own, which the hub's and its site's
# bundles (made after) admit.
bundle /bundles/cloud-1 --role agent --node cloud-1 --site cloud
for site in edge-a edge-b; do
  bundle "/bundles/$site-1" --role agent --node "$site-1" --site "$site"
done
bundle /bundles/hub --role coordinator "$@"
for site in edge-a edge-b; do
  bundle "/bundles/$site-nats" --role site --site "$site" --host "$site-nats"
done
echo "secrets ready"
