"""``spanflow secrets``: the CA, certificates, credentials and gossip keys that lock
every door (docs/security.md). Nothing here prints a password or key, except a new
device's password, once, to the operator who asked for it."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from spanflow.cli.common import app, console, data_dir_or_default, fail
from spanflow.errors import SecurityError
from spanflow.security import pki
from spanflow.security.ingest_tokens import group_token
from spanflow.security.keyring import Keyring, decode_key, new_key
from spanflow.security.secrets import BUNDLE_ROLES, ROLES, Secrets, ingest_token, site_devices

secrets_app = typer.Typer(
    no_args_is_help=True,
    help="Certificates, credentials and gossip keys that lock spanflow's doors.",
)
app.add_typer(secrets_app, name="secrets")

SecretsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--secrets-dir",
        envvar="SPANFLOW_SECRETS",
        help="The secrets directory (default: <data dir>/secrets).",
    ),
]
DataDir = Annotated[
    Path | None, typer.Option("--data-dir", help="Default ./spanflow-data (or SPANFLOW_HOME).")
]


def secrets_at(secrets_dir: Path | None, data_dir: Path | None) -> Secrets:
    return Secrets(secrets_dir or data_dir_or_default(data_dir) / "secrets")


def key_id(key: bytes) -> str:
    """A short public name for a gossip key (its SHA-256 prefix), safe to print."""
    return hashlib.sha256(key).hexdigest()[:12]


@secrets_app.command("init")
def init(
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host",
            help="A name or address clients dial the servers at (repeat); "
            "localhost and 127.0.0.1 are always included.",
        ),
    ] = None,
    renew: Annotated[
        bool, typer.Option(help="Reissue server and client certificates (same CA, same keys).")
    ] = False,
    secrets_dir: SecretsDirOption = None,
    data_dir: DataDir = None,
) -> None:
    """Create the CA, certificates, role passwords, REST token and gossip keyring
    (what is missing; files owner-only). Servers and clients started with this data
    directory then require them."""
    secrets = secrets_at(secrets_dir, data_dir)
    written = secrets.init(tuple(host or ()), renew=renew)
    if not written:
        console.print(f"{secrets.root}: complete, nothing to write (--renew reissues certificates)")
        return
    for path in written:
        console.print(f"wrote {path}")
    console.print(
        f"copy {secrets.root} to every host (owner-only); `spanflow secrets show` lists it"
    )


@secrets_app.command("show")
def show(secrets_dir: SecretsDirOption = None, data_dir: DataDir = None) -> None:
    """Certificates (subject, expiry, names, fingerprint), roles, devices and gossip key
    ids — never a password or a key."""
    secrets = secrets_at(secrets_dir, data_dir)
    table = Table("file", "subject", "expires", "names", "sha256")
    for path in (secrets.ca_cert, secrets.server_cert, *(secrets.client_cert(r) for r in ROLES)):
        if path.exists():
            info = pki.describe(path)
            expires = info.not_after.strftime("%Y-%m-%d")
            if info.expired():
                expires = f"[red]{expires} EXPIRED[/red]"
            table.add_row(
                str(path.relative_to(secrets.root)),
                info.subject,
                expires,
                ", ".join(info.hosts),
                info.fingerprint[:23],
            )
    console.print(table)
    creds = secrets.credentials()
    token = "set" if creds.rest_token else "none (a host's bundle)"
    console.print(f"NATS users: {', '.join(sorted(creds.passwords))}; REST token: {token}")
    for node in sorted(creds.node_tokens):
        console.print(f"node token for {node}: set")
    if creds.node:
        console.print(f"this bundle is node {creds.node}'s: NATS user agent.{creds.node}")
    for node, site in sorted(creds.nodes.items()):
        where = f"site {site}" if site else "every site"
        admitted = "" if creds.node_password_for(node) else ", admitted by another site's server"
        console.print(f"node {node} ({where}): NATS user agent.{node}{admitted}")
    for name, device in sorted(creds.devices.items()):
        where = f" (site {device.site})" if device.site else " (every site)"
        console.print(f"device {name}{where}: may publish {', '.join(device.publish)}")
    if not secrets.keyring_file.exists():
        return  # a bundle for a host that does not gossip
    ring = secrets.keyring()
    ids = [key_id(k) for k in ring.keys]
    console.print(f"gossip keys: {ids[0]} (primary)" + "".join(f", {i}" for i in ids[1:]))


@secrets_app.command("device")
def device(
    name: Annotated[str, typer.Argument(help="Device name: its NATS/MQTT user.")],
    publish: Annotated[
        list[str] | None,
        typer.Option(
            "--publish", help="A subject it may publish on (repeat), e.g. sensors.press-7.>"
        ),
    ] = None,
    subscribe: Annotated[
        list[str] | None,
        typer.Option(
            "--subscribe",
            help="A subject it may subscribe to (repeat): commands for it, e.g. commands.press-7.>",
        ),
    ] = None,
    site: Annotated[
        str | None,
        typer.Option(
            help="The site whose server admits it: only that site's bundle carries its login "
            "(default: every site's)."
        ),
    ] = None,
    revoke: Annotated[
        bool, typer.Option("--revoke", help="Remove the device: it can no longer log in.")
    ] = False,
    secrets_dir: SecretsDirOption = None,
    data_dir: DataDir = None,
) -> None:
    """Add (or re-key) a device allowed to publish on its subjects and nothing else;
    prints its password once. ``--revoke`` removes it. Running servers pick either up
    on reload (SIGHUP): a revoked device's connections are closed then."""
    secrets = secrets_at(secrets_dir, data_dir)
    try:
        if revoke:
            secrets.revoke_device(name)
            console.print(
                f"device {name}: revoked; reload the hub's servers (SIGHUP) and push the "
                "revocation list to the sites: spanflow secrets revocations --push URL"
            )
            return
        if not publish:
            raise SecurityError("give --publish SUBJECT (repeat) or --revoke")
        password = secrets.add_device(name, tuple(publish), tuple(subscribe or ()), site)
    except SecurityError as exc:
        raise fail(exc) from None
    console.print(f"device {name}: password {password}", markup=False, highlight=False)
    console.print("(shown once: give it to the device; it is not logged anywhere)")


@secrets_app.command("node")
def node_command(
    name: Annotated[str, typer.Argument(help="The node's name.")],
    revoke: Annotated[
        bool,
        typer.Option(
            "--revoke", help="Take its own NATS login and REST token away (required for now)."
        ),
    ] = False,
    secrets_dir: SecretsDirOption = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke a node given a login of its own (``export --role agent``): servers drop
    its NATS user on reload, sites once the revocation list is pushed, coordinators
    refuse its token at once. Its name cannot be given to another node."""
    secrets = secrets_at(secrets_dir, data_dir)
    try:
        if not revoke:
            raise SecurityError("give --revoke (nodes get their login from `secrets export`)")
        secrets.revoke_node(name)
    except SecurityError as exc:
        raise fail(exc) from None
    console.print(
        f"node {name}: revoked; reload the hub's servers (SIGHUP) and push the revocation "
        "list to the sites: spanflow secrets revocations --push URL"
    )


@secrets_app.command("revocations")
def revocations_command(
    push: Annotated[
        str | None,
        typer.Option(
            "--push",
            help="The hub's NATS URL (tls://HOST:4222): store the list there, where every "
            "site server reads it.",
        ),
    ] = None,
    secrets_dir: SecretsDirOption = None,
    data_dir: DataDir = None,
) -> None:
    """Show the signed list of revoked device credentials (its serial and size); with
    ``--push``, store it at the hub: each site server whose bundle still admits a
    revoked device reads it over its leaf link within seconds, checks the coordinators'
    signature and cuts that device off (docs/security.md#revoking-a-device)."""
    import asyncio

    from nats.errors import Error as NatsClientError

    from spanflow.doors.revocation_watch import push_revocations

    secrets = secrets_at(secrets_dir, data_dir)
    try:
        listed = secrets.revocations()
        console.print(f"revocation list {listed.serial}: {len(listed.credentials)} credentials")
        if push:
            asyncio.run(push_revocations(push, secrets))
            console.print(f"pushed to {push}: site servers apply it within seconds")
    except SecurityError as exc:
        raise fail(exc) from None
    except (NatsClientError, OSError, TimeoutError) as exc:
        raise fail(SecurityError(f"the hub at {push} did not take the list: {exc}")) from None


@secrets_app.command("ingest-token")
def ingest_token_command(
    site: Annotated[str, typer.Argument(help="The site whose HTTP ingest takes it.")],
    subjects: Annotated[
        str | None,
        typer.Option(
            help="A device group's token: it publishes on the subjects this pattern covers "
            "only, e.g. plant.line-1.> (default: the site's, any readings subject)."
        ),
    ] = None,
    secrets_dir: SecretsDirOption = None,
    data_dir: DataDir = None,
) -> None:
    """Print the token a site's HTTP ingest takes (the hub's too: give its site name),
    for the HTTP devices of that site: it publishes readings there and does nothing
    else — no REST call, no other site; with ``--subjects``, a device group's token,
    kept to those subjects. Derived from the full secrets' node-token key, so it is the
    same each time it is asked for."""
    creds = secrets_at(secrets_dir, data_dir).credentials()
    if not creds.agent_key:
        raise fail(SecurityError("a host's bundle cannot make ingest tokens: run this "
                                 "where the full secrets are"))  # fmt: skip
    token = ingest_token(creds.agent_key, site)
    if subjects is not None:
        try:
            token = group_token(token, subjects)
        except SecurityError as exc:
            raise fail(exc) from None
    console.print(token, markup=False, highlight=False)


@secrets_app.command("export")
def export(
    role: Annotated[str, typer.Option(help=f"One of {', '.join(BUNDLE_ROLES)}.")],
    out: Annotated[
        Path,
        typer.Option(help="A new directory for the bundle (with --kube-secret: a YAML file)."),
    ],
    node: Annotated[str | None, typer.Option(help="The node (role agent).")] = None,
    site: Annotated[
        str | None,
        typer.Option(help="The site (role site; role agent: the site whose server admits it)."),
    ] = None,
    device_name: Annotated[
        str | None, typer.Option("--device", help="The device (role device).")
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host",
            help="Roles site and coordinator: a name or address clients dial this host's "
            "server at (repeat); the bundle gets a server certificate of its own naming "
            "only these (and localhost).",
        ),
    ] = None,
    kube_secret: Annotated[
        str | None,
        typer.Option(
            help="Write the bundle as a Kubernetes Secret of this name to --out instead "
            "(deploy/k8s/, docs/deploy.md)."
        ),
    ] = None,
    namespace: Annotated[str, typer.Option(help="The Secret's namespace.")] = "spanflow",
    secrets_dir: SecretsDirOption = None,
    data_dir: DataDir = None,
) -> None:
    """Write the secrets one host needs for its role (docs/security.md): an edge host
    gets no coordinator, control, reader, route or REST secret and no CA key. Copy the
    bundle to the host as its secrets directory."""
    secrets = secrets_at(secrets_dir, data_dir)
    hosts = tuple(host or ())

    def bundle(dest: Path) -> list[Path]:
        return secrets.export(dest, role, node=node, site=site, device=device_name, hosts=hosts)

    try:
        if kube_secret is not None:
            _export_kube_secret(bundle, out, kube_secret, namespace)
            return
        written = bundle(out)
    except SecurityError as exc:
        raise fail(exc) from None
    for path in written:
        console.print(f"wrote {path}")
    if role in ("site", "coordinator") and not hosts:
        console.print(
            "[yellow]the bundle shares the deployment's server certificate: give --host "
            "to issue this host one of its own[/yellow]"
        )
    if role == "site":
        _tell_site_devices(secrets, site or "")
    if role == "agent":
        console.print(
            f"node {node} logs in as NATS user agent.{node}: servers admit it once their "
            "secrets list it (this directory now does; export coordinator and site bundles "
            "after this one, or again) and they reload (SIGHUP)"
        )
    console.print(f"copy {out} to the host as its secrets directory (owner-only)")


def _tell_site_devices(secrets: Secrets, site: str) -> None:
    """Which device logins a site bundle carries, and a warning for those of no site."""
    devices = site_devices(secrets.credentials().devices, site)
    console.print(f"device logins in the bundle: {', '.join(sorted(devices)) or 'none'}")
    anywhere = sorted(name for name, d in devices.items() if d.site is None)
    if anywhere:
        console.print(
            f"[yellow]{', '.join(anywhere)} belong to no site, so every site's bundle "
            "carries their logins: add them again with `spanflow secrets device NAME "
            "--publish … --site SITE` (a new password)[/yellow]"
        )


def _export_kube_secret(
    make: Callable[[Path], list[Path]], out: Path, name: str, namespace: str
) -> None:
    """The bundle made in a private temporary directory, written to ``out`` as a Secret."""
    from spanflow.local.kube import secret_manifest, write_private

    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        make(bundle)
        write_private(out, secret_manifest(bundle, name, namespace))
    console.print(f"wrote Secret {namespace}/{name} to {out} (owner-only; apply, then delete it)")


gossip_app = typer.Typer(
    no_args_is_help=True,
    help="Gossip keys: rotate without downtime (new → copy → use → copy → remove).",
)
secrets_app.add_typer(gossip_app, name="gossip-key")


def _ring_edit(secrets: Secrets, ring: Keyring, said: str) -> None:
    secrets.write_keyring(ring)
    console.print(said)
    console.print(f"copy {secrets.keyring_file} to every host; agents reload it within seconds")


def _find(ring: Keyring, wanted: str) -> bytes:
    for key in ring.keys:
        if key_id(key) == wanted:
            return key
    raise typer.BadParameter(f"no key {wanted!r} in the keyring (`spanflow secrets show`)")


@gossip_app.command("new")
def gossip_new(
    key: Annotated[
        str | None, typer.Option(help="A base64 key to install (default: a new random one).")
    ] = None,
    secrets_dir: SecretsDirOption = None,
    data_dir: DataDir = None,
) -> None:
    """Install a key beside the current ones (step 1: every member can then open it)."""
    secrets = secrets_at(secrets_dir, data_dir)
    added = decode_key(key) if key else new_key()
    _ring_edit(secrets, secrets.keyring().install(added), f"installed {key_id(added)}")


KeyIdArgument = Annotated[str, typer.Argument(help="Key id (from `secrets show`).")]


def _edit_key(secrets_dir: Path | None, data_dir: Path | None, key_name: str, step: str) -> None:
    """Make ``key_name`` primary (``use``) or drop it (``remove``)."""
    secrets = secrets_at(secrets_dir, data_dir)
    ring = secrets.keyring()
    key = _find(ring, key_name)
    if step == "use":
        _ring_edit(secrets, ring.use(key), f"{key_name} is now primary")
    else:
        _ring_edit(secrets, ring.remove(key), f"removed {key_name}")


@gossip_app.command("use")
def gossip_use(
    key_name: KeyIdArgument, secrets_dir: SecretsDirOption = None, data_dir: DataDir = None
) -> None:
    """Make an installed key the primary (step 2: members seal with it)."""
    _edit_key(secrets_dir, data_dir, key_name, "use")


@gossip_app.command("remove")
def gossip_remove(
    key_name: KeyIdArgument, secrets_dir: SecretsDirOption = None, data_dir: DataDir = None
) -> None:
    """Remove a retired key (step 3: packets sealed with it no longer open)."""
    _edit_key(secrets_dir, data_dir, key_name, "remove")
