# Sourced by the tests that mount a /dev/shm of their own in a private mount
# namespace (tests/huge_shm_namespace.sh, tests/shm_full.sh).
# require_mount_namespace: returns when this process may make one (root,
# unshare -m); otherwise reports the test skipped (exit 77) with the reason.
require_mount_namespace() {
  if [ "$(id -u)" != 0 ]; then
    echo "skipped: needs root (a mount namespace with a /dev/shm of its own)"
    exit 77
  fi
  if ! unshare -m --propagation private true 2>/dev/null; then
    echo "skipped: cannot make a mount namespace (unshare -m)"
    exit 77
  fi
}
