#!/usr/bin/env bash
# Installs sparkd as a system service: binaries, units, the sparkd user and group, the
# config file, then enables socket activation. Run as root from the repository root
# after `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
install -Dm755 target/release/sparkd "$PREFIX/bin/sparkd"
install -Dm755 target/release/spark "$PREFIX/bin/spark"
install -Dm644 systemd/sparkd.service /etc/systemd/system/sparkd.service
install -Dm644 systemd/sparkd.socket /etc/systemd/system/sparkd.socket
install -Dm644 systemd/sparkd.sysusers /usr/lib/sysusers.d/sparkd.conf
install -Dm644 systemd/sparkd.tmpfiles /usr/lib/tmpfiles.d/sparkd.conf
[ -f /etc/sparkd/sparkd.toml ] || install -Dm644 systemd/sparkd.toml /etc/sparkd/sparkd.toml
systemd-sysusers /usr/lib/sysusers.d/sparkd.conf
systemd-tmpfiles --create /usr/lib/tmpfiles.d/sparkd.conf
SPARKD_MODELS=/var/lib/sparkd/models "$PREFIX/bin/sparkd" pull
chown -R sparkd:sparkd /var/lib/sparkd
systemctl daemon-reload
systemctl enable --now sparkd.socket
echo "sparkd installed; add users to the 'sparkd' group to let them use /run/sparkd/sparkd.sock"
