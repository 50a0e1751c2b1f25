#!/usr/bin/env bash
# Installs what building, testing and running kibotos needs on a fresh
# Debian 12 machine of this project's kind: Debian packages and Go modules.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
# iproute2, nftables: network-namespace cluster tests; qemu, busybox, lz4, cpio,
# kmod, e2fsprogs, file: Platforms and micro-VMs; qemu-utils (qemu-img): retained
# writable layers; systemd: the private systemd
# the node runtime uses on hosts whose PID 1 is not systemd; debootstrap,
# debian-archive-keyring: Debian templates (`template build --debootstrap`);
# wget, ca-certificates: the busybox template's wget and the CA bundle it
# verifies with, copied from the host (busybox's wget crashes on -T);
# dnsmasq-base (the binary alone, no service): the resolver of network tests;
# microsocks: the SOCKS5 server egress tests carry guest connections through;
# zsh, fish: the completion scripts are run by the real shells; dpkg, apt,
# passwd, util-linux (nsenter): the Debian package test installs, upgrades
# and removes the package under a booted systemd.
for pkg in dpkg apt passwd util-linux iproute2 nftables ca-certificates git qemu-system-x86 qemu-utils busybox-static lz4 cpio kmod systemd e2fsprogs file debootstrap debian-archive-keyring wget dnsmasq-base microsocks zsh fish; do
	dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# nodejs, npm: the official E2B SDK (npm package e2b) drives the E2B API in
# e2e; a Node.js of the machine's own (with its npm) is used when present.
command -v npm >/dev/null 2>&1 || need+=(nodejs npm)
if [ "${KIBOTOS_BENCH:-0}" = 1 ]; then
	for pkg in etcd-server etcd-client hyperfine; do
		dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
	done
fi
export DEBIAN_FRONTEND=noninteractive
# `kibotos platform build` resolves and downloads the kernel .deb with apt,
# so the package lists must be there even when nothing is to be installed.
if [ ${#need[@]} -gt 0 ] || ! ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1; then
	apt-get update -qq
fi
if [ ${#need[@]} -gt 0 ]; then
	apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

export PATH=/usr/local/go/bin:$PATH
go version
go mod download
# nfpm for scripts/package.sh, built from the module proxy (not in go.mod:
# only packaging uses it).
(cd / && go run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2 --version >/dev/null)
# The E2B SDK at the version e2e/e2bsdk/package-lock.json pins, from the
# npm registry.
npm ci --prefix e2e/e2bsdk --no-audit --no-fund --loglevel=error
