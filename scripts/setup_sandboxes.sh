#!/usr/bin/env bash
# Prepares the machine for trace-gym's sandboxes (run as root; safe to run again):
#   - installs bubblewrap (ProcessSandbox isolation) and docker.io (DockerSandbox) with apt-get,
#   - starts dockerd in the background if no Docker engine answers (log: /var/log/trace-gym-dockerd.log),
#   - builds the local image trace-gym-sandbox:latest without a registry.
# The image is a minimal root file system (a passwd entry for the unprivileged `sandbox` user, empty
# mount points, symlinks for /bin and /lib); the Python interpreter and /usr come from the host,
# mounted read-only by DockerSandbox. Its labels tell DockerSandbox which interpreter to run and
# which host paths to mount, so `DockerSandbox()` works with no arguments.
#   bash scripts/setup_sandboxes.sh             # everything
#   PYTHON=/path/to/python bash scripts/setup_sandboxes.sh
#   TRACE_GYM_SKIP_DOCKER=1 bash scripts/setup_sandboxes.sh   # bubblewrap only (Docker tests then skip)
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "run this as root (it uses apt-get and starts dockerd)" >&2; exit 1; }
  SUDO=sudo
fi
IMAGE="${TRACE_GYM_SANDBOX_IMAGE:-trace-gym-sandbox:latest}"
IMAGE_VERSION=4  # bump when the image's contents below change
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
DOCKER="$SUDO docker"
LOG=/var/log/trace-gym-dockerd.log

need_install=()
command -v bwrap >/dev/null || need_install+=(bubblewrap)
if [ -z "${TRACE_GYM_SKIP_DOCKER:-}" ]; then
  command -v dockerd >/dev/null || need_install+=(docker.io)
fi
if ((${#need_install[@]})); then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_install[@]}"
fi
if [ -n "${TRACE_GYM_SKIP_DOCKER:-}" ]; then
  echo "bubblewrap ready; Docker skipped (TRACE_GYM_SKIP_DOCKER is set)"
  exit 0
fi

if ! $DOCKER info >/dev/null 2>&1; then
  echo "starting dockerd (log: $LOG)"
  $SUDO sh -c "nohup dockerd >'$LOG' 2>&1 &"
  for _ in $(seq 1 60); do
    $DOCKER info >/dev/null 2>&1 && break
    sleep 1
  done
  $DOCKER info >/dev/null 2>&1 || {
    echo "dockerd did not start; see $LOG (set TRACE_GYM_SKIP_DOCKER=1 to go on without Docker)" >&2
    tail -20 "$LOG" >&2
    exit 1
  }
fi

# The interpreter, its prefix and (for a virtual environment) its base prefix, as the host sees them.
read -r PY_EXE PY_MOUNTS < <("$PYTHON" -c 'import sys; print(sys.executable, ":".join(dict.fromkeys([sys.base_prefix, sys.prefix])))')

label() { $DOCKER image inspect -f "{{index .Config.Labels \"$1\"}}" "$IMAGE" 2>/dev/null || true; }
if [ "$(label trace_gym.python)" = "$PY_EXE" ] && [ "$(label trace_gym.image_version)" = "$IMAGE_VERSION" ]; then
  echo "image $IMAGE is up to date"
  exit 0
fi

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{etc,usr,tmp,scratch,proc,dev,sys,run,home/sandbox}
for prefix in ${PY_MOUNTS//:/ }; do mkdir -p "$root$prefix"; done
chmod 1777 "$root/tmp" "$root/scratch"  # Docker copies a tmpfs mount point's mode from the image
ln -s usr/bin "$root/bin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
ln -s usr/sbin "$root/sbin"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:1000:1000:sandbox:/home/sandbox:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'hosts: files\n' >"$root/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n' >"$root/etc/hosts"
tar -C "$root" -c . | $DOCKER import \
  --change "LABEL trace_gym.python=$PY_EXE" \
  --change "LABEL trace_gym.mounts=/usr:$PY_MOUNTS" \
  --change "LABEL trace_gym.image_version=$IMAGE_VERSION" \
  --change 'USER 1000:1000' \
  --change 'WORKDIR /scratch' \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  - "$IMAGE" >/dev/null
$DOCKER image prune -f --filter label=trace_gym.image_version >/dev/null || true  # earlier builds
echo "built $IMAGE (python $PY_EXE; host paths mounted read-only: /usr:$PY_MOUNTS)"
