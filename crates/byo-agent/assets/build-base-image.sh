#!/bin/sh
# Builds lofispark-base inside a throwaway instance; run by byo-agent's base-image step,
# which carries this script in its binary (a BYO host has nobody to copy it there).
#
#   build-base-image.sh FLAVOUR CUDA_REPO_ARCH
#
# FLAVOUR is ubuntu (a GB10 Spark: NVIDIA's CUDA repository for CUDA_REPO_ARCH, which must
# be the profile's: the repository's default, sbsa, is arm64's and wrong everywhere else)
# or minimal (the staff-only test profile: busybox, proving egress only).
set -eu

flavour=${1:?flavour: ubuntu or minimal}
cuda_repo_arch=${2:?the profile\'s cuda_repo_arch}

say() { printf 'build-base-image: %s\n' "$*"; }

install_banner() {
  if [ -f /root/login-banner.txt ]; then
    cp /root/login-banner.txt /etc/motd
    rm -f /root/login-banner.txt
  fi
}

case "$flavour" in
  minimal)
    /bin/busybox --install -s
    # Busybox has no network manager: lease an address from the bridge's dnsmasq.
    udhcpc -i eth0 -n -q -t 5 -T 2 -s /usr/share/udhcpc/default.script >/dev/null 2>&1 ||
      { say "no DHCP lease on eth0 from the bridge"; exit 3; }
    # Egress through lxdbr0's NAT: what Docker's FORWARD DROP and a default-deny ufw break.
    if ! wget -q -T 10 -O /dev/null http://deb.debian.org/debian/dists/bookworm/Release; then
      say "no egress: could not fetch from deb.debian.org (resolving or connecting failed)"
      exit 4
    fi
    install_banner
    echo "minimal $cuda_repo_arch" >/etc/enverge-image
    ;;
  ubuntu)
    export DEBIAN_FRONTEND=noninteractive
    # cloud-init brings eth0 up; wait for it rather than racing it.
    cloud-init status --wait >/dev/null 2>&1 || true
    if ! apt-get update -q; then
      say "no egress: apt-get update failed (resolving or connecting to archive.ubuntu.com)"
      exit 4
    fi
    apt-get install -y -q --no-install-recommends ca-certificates curl gnupg openssh-server
    # shellcheck source=/dev/null
    . /etc/os-release
    repo="https://developer.download.nvidia.com/compute/cuda/repos/ubuntu${VERSION_ID%%.*}${VERSION_ID#*.}/${cuda_repo_arch}"
    curl -fsSL -o /tmp/cuda-keyring.deb "$repo/cuda-keyring_1.1-1_all.deb"
    dpkg -i /tmp/cuda-keyring.deb
    rm -f /tmp/cuda-keyring.deb
    apt-get update -q
    apt-get install -y -q --no-install-recommends cuda-toolkit nvidia-container-toolkit-base
    install_banner
    echo "ubuntu $cuda_repo_arch" >/etc/enverge-image
    apt-get clean
    rm -rf /var/lib/apt/lists/*
    ;;
  *)
    say "unknown flavour $flavour"
    exit 2
    ;;
esac
say "done"
