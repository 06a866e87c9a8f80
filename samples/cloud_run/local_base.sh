#!/bin/sh
# Make the base image locally where no image registry is reachable: a minimal Debian
# root file system (debootstrap, from Debian's package mirror) with python3 and its venv
# module, imported as pubsub-worker-base:bookworm. The machine's CA bundle goes in, so
# that pip inside the build reaches the package index this machine trusts.
#   sudo sh samples/cloud_run/local_base.sh          (needs debootstrap and docker)
# then: DOCKER_BUILDKIT=1 docker build --network host \
#         --build-arg BASE=pubsub-worker-base:bookworm -f samples/cloud_run/Dockerfile -t pubsub-worker-sample .
set -eu
ROOTFS=$(mktemp -d)
trap 'rm -rf "$ROOTFS"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$ROOTFS" http://deb.debian.org/debian
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
tar -C "$ROOTFS" -c . | docker import - pubsub-worker-base:bookworm
