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
    # busybox's own resolver (a static glibc getaddrinfo has no NSS modules here).
    ns=$(sed -n 's/^nameserver //p' /etc/resolv.conf | head -n 1)
    # Any HTTP answer proves the way out and back (busybox wget's --header crashes). A
    # bridge that has just come up may drop the first packets, and a busy uplink the odd
    # connection: eight tries, about half a minute between the first and the last even when
    # each is refused at once (five within ten seconds once failed a test host whose
    # uplink was busy with another host's installs).
    addr="" status=""
    for try in 1 2 3 4 5 6 7 8; do
      [ -n "$addr" ] ||
        addr=$(nslookup deb.debian.org "$ns" 2>/dev/null | sed -n 's/^Address: *\([0-9.]*\)$/\1/p' | head -n 1)
      if [ -n "$addr" ]; then
        status=$(printf 'HEAD /debian/dists/bookworm/Release HTTP/1.0\r\nHost: deb.debian.org\r\n\r\n' |
          nc -w 10 "$addr" 80 2>/dev/null | head -n 1)
      fi
      case "$status" in
        HTTP/*) break ;;
      esac
      [ "$try" -eq 8 ] || sleep "$try"
    done
    if [ -z "$addr" ]; then
      say "no egress: could not resolve deb.debian.org through ${ns:-no nameserver}"
      exit 4
    fi
    case "$status" in
      HTTP/*) ;;
      *)
        say "no egress: deb.debian.org ($addr) did not answer over HTTP${status:+ (it said: $status)}"
        exit 4
        ;;
    esac
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
