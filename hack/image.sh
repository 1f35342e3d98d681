#!/usr/bin/env bash
# Builds a container image without Docker or buildah: an OCI image layout (oci-layout,
# index.json, blobs/sha256/...) written from local files and tarred, which containerd imports
# as is (`ctr -n k8s.io images import FILE` names it from index.json). The release recipe.
#
#   hack/image.sh muster  [--binary FILE] [--source URL]   muster's image, as the Dockerfile
#        builds it: the binary (default target/release/muster; build it first with
#        `cargo build --release --locked --bin muster`) as /muster, its dynamic loader and every
#        library ldd lists at the same paths, the host's CA bundle; user 65532:65532,
#        entrypoint /muster; labels org.opencontainers.image.source (--source, else
#        Cargo.toml's repository, else git's origin URL), .version (the workspace version) and
#        .revision (git HEAD, -dirty when tracked files differ from it)
#   hack/image.sh busybox   Debian's busybox-static (/bin/busybox, installed with apt-get when
#        missing and this is root) with one /bin symlink per applet, /tmp; Cmd ["sh"]
#   hack/image.sh pause     the pod sandbox image: hack/images/pause.c compiled with
#        gcc -static as /pause; user 65535, entrypoint /pause
#
#   --tag NAME:TAG   the name containerd gives the image (default localhost/muster:<workspace
#                    version>, localhost/busybox:muster, localhost/pause:muster); the name
#                    starts with a registry host (localhost/, or one with a dot or a port), so
#                    the CRI's reference normalisation leaves it as it is
#   --out FILE       the archive (default target/images/<what>.tar)
#
# One layer, reproducible: files sorted by name, owned by 0:0, modes set here (not taken from
# the host), every mtime SOURCE_DATE_EPOCH (default 0), gzip without name or time stamp, JSON
# with sorted keys. The same inputs give the same digests. The config's rootfs.diff_ids holds
# the digest of the uncompressed layer, the manifest the digest of the gzip'ed one.
# Prints one line at the end: the name, the archive, the layer's sizes, the manifest's digest
# and the build time. Needs bash, coreutils, tar, gzip, python3 (the JSON), ldd, git; gcc and
# glibc's static libc for pause. No network.
set -euo pipefail
export LC_ALL=C
umask 022

root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "image: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
began=${EPOCHREALTIME/./}

what=${1:-}
case "$what" in
  muster | busybox | pause) shift ;;
  -h | --help) usage ;;
  *) log "unknown image '$what' (muster, busybox or pause)"; usage ;;
esac
binary=$root/target/release/muster
tag='' out='' source_url=''
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) [ "$what" = muster ] || die "--binary is for the muster image"; binary=${2:?--binary needs a file}; shift 2 ;;
    --source) [ "$what" = muster ] || die "--source is for the muster image"; source_url=${2:?--source needs a URL}; shift 2 ;;
    --tag) tag=${2:?--tag needs NAME:TAG}; shift 2 ;;
    --out) out=${2:?--out needs a file}; shift 2 ;;
    -h | --help) usage ;;
    *) log "unknown option '$1'"; usage ;;
  esac
done

epoch=${SOURCE_DATE_EPOCH:-0}
[[ $epoch =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH must be seconds since 1970, not '$epoch'"

# The workspace's version and repository URL, from Cargo.toml.
cargo_field() {
  python3 - "$root/Cargo.toml" "$1" << 'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    manifest = tomllib.load(f)
print(manifest.get("workspace", {}).get("package", {}).get(sys.argv[2], ""))
EOF
}

version=''
if [ "$what" = muster ]; then
  version=$(cargo_field version) || die "cannot read the workspace version from $root/Cargo.toml"
  [ -n "$version" ] || die "no [workspace.package] version in $root/Cargo.toml"
fi
case "$what" in
  muster) tag=${tag:-localhost/muster:$version} ;;
  busybox) tag=${tag:-localhost/busybox:muster} ;;
  pause) tag=${tag:-localhost/pause:muster} ;;
esac
out=${out:-$root/target/images/$what.tar}

# NAME:TAG, NAME starting with a registry host: the reference CRI looks the image up by.
image_name=${tag%:*}
image_tag=${tag##*:}
component='[a-z0-9]([a-z0-9._-]*[a-z0-9])?'
[[ $tag == *:* && $image_tag != */* ]] || die "--tag '$tag' is not NAME:TAG"
[[ $image_name =~ ^$component(:[0-9]+)?(/$component)+$ ]] \
  || die "--tag '$tag': '$image_name' is not an image name (lower-case HOST/PATH, e.g. localhost/muster)"
[[ $image_tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "--tag '$tag': '$image_tag' is not a tag"
host=${image_name%%/*}
[[ $host == localhost || $host == localhost:* || $host == *.* || $host == *:* ]] \
  || die "--tag '$tag': the name must start with a registry host (localhost/...), or CRI normalises it to docker.io/..."

# OCI architecture of this machine (the binaries are this machine's, and checked to be).
case "$(uname -m)" in
  x86_64 | amd64) arch=amd64 elf_machine=62 ;;
  aarch64 | arm64) arch=arm64 elf_machine=183 ;;
  *) die "no OCI architecture known for $(uname -m)" ;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/muster-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/rootfs
mkdir -p "$stage"

# Fails unless FILE is an ELF executable for this machine's architecture.
check_elf() {
  local file=$1 magic machine
  magic=$(od -An -tx1 -N4 "$file" | tr -d ' \n')
  [ "$magic" = 7f454c46 ] || die "$file is not an ELF file"
  machine=$(od -An -tu2 -j18 -N2 --endian=little "$file" | tr -d ' \n')
  [ "$machine" = "$elf_machine" ] || die "$file is for ELF machine $machine, not this $arch machine ($elf_machine)"
}

# Copies the dynamic loader and every library ldd lists for FILE into the rootfs at the same
# paths, contents copied (symlinks dereferenced); nothing for a static executable.
copy_libraries() {
  local file=$1 listing line path
  if ! listing=$(ldd "$file" 2>&1); then
    [[ $listing == *"not a dynamic executable"* ]] || die "ldd $file failed: $listing"
    log "$file is static: no libraries"
    return 0
  fi
  [[ $listing != *"statically linked"* ]] || { log "$file is static: no libraries"; return 0; }
  while IFS= read -r line; do
    [[ $line != *"not found"* ]] || die "ldd $file: a library is missing on this host: $line"
    # "libc.so.6 => /lib/.../libc.so.6 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)"; the
    # vDSO ("linux-vdso.so.1 (0x...)") has no file.
    if [[ $line =~ (^|[[:space:]])(/[^[:space:]]+) ]]; then
      path=${BASH_REMATCH[2]}
      [ -e "$stage$path" ] && continue
      [ -f "$path" ] || die "ldd $file lists $path, which is not a file"
      install -D -m 0755 "$path" "$stage$path"
      log "  $path"
    fi
  done <<< "$listing"
}

# What each image holds, and its config.
user='' entrypoint=null cmd=null created_by="hack/image.sh $what"
labels=()
env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
case "$what" in
  muster)
    [ -f "$binary" ] || die "$binary not found: build it with 'cargo build --release --locked --bin muster' (or pass --binary)"
    check_elf "$binary"
    log "muster from $binary"
    install -D -m 0755 "$binary" "$stage/muster"
    copy_libraries "$binary"
    ca=/etc/ssl/certs/ca-certificates.crt
    [ -f "$ca" ] || die "$ca not found: install Debian's ca-certificates"
    install -D -m 0644 "$ca" "$stage$ca"
    user=65532:65532
    entrypoint='["/muster"]'
    if [ -z "$source_url" ]; then
      source_url=$(cargo_field repository) || die "cannot read $root/Cargo.toml"
    fi
    if [ -z "$source_url" ]; then
      source_url=$(git -C "$root" config --get remote.origin.url 2> /dev/null || true)
    fi
    if [ -n "$source_url" ]; then
      labels+=("org.opencontainers.image.source=$source_url")
    else
      log "warning: no source URL (--source, Cargo.toml's workspace repository or git's origin): no org.opencontainers.image.source label"
    fi
    revision=$(git -C "$root" rev-parse HEAD 2> /dev/null) || die "$root is not a git checkout: no revision for the image's label"
    # Tracked files that differ from HEAD (as `git describe --dirty` says), without taking
    # the index lock others may hold.
    if [ -n "$(git -C "$root" --no-optional-locks status --porcelain --untracked-files=no)" ]; then
      revision=$revision-dirty
    fi
    labels+=("org.opencontainers.image.version=$version" "org.opencontainers.image.revision=$revision")
    ;;
  busybox)
    busybox=/bin/busybox
    if [ ! -x "$busybox" ]; then
      install_cmd="apt-get update && apt-get install -y --no-install-recommends busybox-static"
      if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null; then
        die "$busybox not found: run '$install_cmd' (as root)"
      fi
      log "installing Debian's busybox-static"
      apt_log=$work/apt.log
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends busybox-static; } > "$apt_log" 2>&1 \
        || { tail -n 20 "$apt_log" >&2; die "apt-get failed: run '$install_cmd' yourself"; }
      [ -x "$busybox" ] || die "$busybox still missing after installing busybox-static"
    fi
    check_elf "$busybox"
    log "busybox from $busybox"
    install -D -m 0755 "$busybox" "$stage/bin/busybox"
    # Debian's busybox-static needs nothing; a dynamic busybox brings its libraries.
    copy_libraries "$busybox"
    applets=0
    while IFS= read -r applet; do
      [ -n "$applet" ] && [ "$applet" != busybox ] || continue
      [[ $applet =~ ^[][A-Za-z0-9_.+-]+$ ]] || die "busybox --list printed '$applet', not an applet name"
      [ -e "$stage/bin/$applet" ] || ln -s busybox "$stage/bin/$applet"
      applets=$((applets + 1))
    done < <("$busybox" --list)
    [ "$applets" -gt 0 ] || die "$busybox --list printed no applets"
    [ -L "$stage/bin/sh" ] || die "$busybox has no sh applet"
    log "  $applets applets in /bin"
    mkdir -p "$stage/tmp"
    cmd='["sh"]'
    ;;
  pause)
    src=$root/hack/images/pause.c
    command -v gcc > /dev/null || die "gcc not found: install Debian's gcc and libc6-dev"
    gcc -static -Os -s -Wall -Wextra -Werror -o "$stage/pause" "$src" 2> "$work/gcc.log" \
      || { cat "$work/gcc.log" >&2; die "gcc -static $src failed (glibc's static libc is Debian's libc6-dev)"; }
    chmod 0755 "$stage/pause"
    log "pause from $src"
    user=65535:65535
    entrypoint='["/pause"]'
    ;;
esac

# Modes are the image's, not the host's: directories 0755, /tmp sticky and world-writable.
find "$stage" -type d -exec chmod 0755 {} +
[ ! -d "$stage/tmp" ] || chmod 1777 "$stage/tmp"

# A reproducible tar of the given entries of directory DIR into FILE.
reproducible_tar() {
  local dir=$1 file=$2
  shift 2
  tar -C "$dir" --format=gnu --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner \
    -cf "$file" -- "$@"
}

blobs=$work/layout/blobs/sha256
mkdir -p "$blobs"
shopt -s dotglob nullglob
entries=()
for entry in "$stage"/*; do entries+=("${entry#"$stage"/}"); done
shopt -u dotglob nullglob
reproducible_tar "$stage" "$work/layer.tar" "${entries[@]}"
gzip -n -c "$work/layer.tar" > "$work/layer.tar.gz"
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
layer_digest=$(sha256sum "$work/layer.tar.gz" | cut -d' ' -f1)
layer_size=$(stat -c %s "$work/layer.tar.gz")
tar_size=$(stat -c %s "$work/layer.tar")
mv "$work/layer.tar.gz" "$blobs/$layer_digest"

# The config, the manifest and index.json (with the image's name for containerd).
label_args=()
for l in "${labels[@]}"; do label_args+=(--label "$l"); done
env_args=()
for e in "${env[@]}"; do env_args+=(--env "$e"); done
manifest_digest=$(python3 - --layout "$work/layout" --name "$image_name" --tag "$image_tag" \
  --arch "$arch" --epoch "$epoch" --user "$user" --entrypoint "$entrypoint" --cmd "$cmd" \
  --created-by "$created_by" --diff-id "sha256:$diff_id" --layer-digest "sha256:$layer_digest" \
  --layer-size "$layer_size" "${env_args[@]}" "${label_args[@]}" << 'EOF'
import argparse, datetime, hashlib, json, os

p = argparse.ArgumentParser()
for flag in ("layout", "name", "tag", "arch", "epoch", "user", "entrypoint", "cmd", "created-by",
             "diff-id", "layer-digest", "layer-size"):
    p.add_argument("--" + flag, required=True)
p.add_argument("--env", action="append", default=[])
p.add_argument("--label", action="append", default=[])
a = p.parse_args()


def encode(doc):
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def blob(doc, media_type):
    """Writes doc as a blob; returns its descriptor."""
    data = encode(doc)
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(a.layout, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return {"mediaType": media_type, "digest": "sha256:" + digest, "size": len(data)}


created = datetime.datetime.fromtimestamp(int(a.epoch), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
config = {"Env": a.env}
if a.user:
    config["User"] = a.user
for key, value in (("Entrypoint", a.entrypoint), ("Cmd", a.cmd)):
    value = json.loads(value)
    if value is not None:
        config[key] = value
if a.label:
    config["Labels"] = dict(l.split("=", 1) for l in a.label)
platform = {"architecture": a.arch, "os": "linux"}
image_config = blob(
    {
        **platform,
        "created": created,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [a.diff_id]},
        "history": [{"created": created, "created_by": a.created_by}],
    },
    "application/vnd.oci.image.config.v1+json",
)
manifest = blob(
    {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": image_config,
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": a.layer_digest,
                "size": int(a.layer_size),
            }
        ],
    },
    "application/vnd.oci.image.manifest.v1+json",
)
manifest["platform"] = platform
manifest["annotations"] = {
    "io.containerd.image.name": a.name + ":" + a.tag,
    "org.opencontainers.image.ref.name": a.tag,
}
with open(os.path.join(a.layout, "index.json"), "wb") as f:
    f.write(encode({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [manifest]}))
with open(os.path.join(a.layout, "oci-layout"), "wb") as f:
    f.write(encode({"imageLayoutVersion": "1.0.0"}))
print(manifest["digest"])
EOF
) || die "writing the image's JSON failed"

# The layout, tarred (reproducibly too), written in place at the end.
mkdir -p "$(dirname "$out")"
reproducible_tar "$work/layout" "$out.partial.$$" oci-layout index.json blobs
mv -f "$out.partial.$$" "$out"

mib() { local tenths=$((($1 * 10 + 524288) / 1048576)); echo "$((tenths / 10)).$((tenths % 10)) MiB"; }
ended=${EPOCHREALTIME/./}
ms=$(((ended - began) / 1000))
printf '%s:%s -> %s: layer %s gzip (%d bytes), %s uncompressed (%d bytes), archive %d bytes, manifest %s, built in %d.%03d s\n' \
  "$image_name" "$image_tag" "$out" "$(mib "$layer_size")" "$layer_size" "$(mib "$tar_size")" "$tar_size" \
  "$(stat -c %s "$out")" "$manifest_digest" $((ms / 1000)) $((ms % 1000))
