# muster's image: one glibc binary on an empty base, with only the dynamic loader and the shared
# libraries it links next to it, run as a non-root user.
#
#   docker build -t <your-registry>/muster:<version> .
#   helm install muster charts/muster --set image.repository=<your-registry>/muster
#
# The entrypoint is the binary; the chart passes `run ...` (the controller manager) or
# `node-agent ...` (the DaemonSet, which runs it as root to reach kubelet's socket) as arguments.
# glibc, not a static musl binary: the node agent loads NVML (libnvidia-ml.so.1, from the host's
# NVIDIA driver) with dlopen, which a static musl binary cannot do. No shell, no package manager,
# nothing but the binary, its loader and libraries, and the CA bundle (for an https
# --prometheus-url).
#
# Building the image without Docker: hack/image.sh writes the same image (same files, user,
# entrypoint) as a reproducible OCI archive from the release binary, which containerd imports:
#
#   cargo build --release --locked --bin muster
#   hack/image.sh muster                      # target/images/muster.tar, localhost/muster:<version>
#   ctr -n k8s.io images import target/images/muster.tar
#
# (`--tag` names it otherwise; skopeo or crane can push the archive to a registry.)

FROM rust:1.95-slim-trixie AS build
WORKDIR /src
COPY . .
# The binary, then its dynamic loader and every library ldd lists, copied (symlinks resolved) to
# the same paths under /rootfs: whatever the architecture, the paths come from ldd's output.
RUN cargo build --release --locked --bin muster \
    && cp target/release/muster /muster \
    && mkdir /rootfs \
    && ldd /muster | grep -o '/[^ ]*' | sort -u | xargs -I '{}' cp --parents --dereference '{}' /rootfs/

FROM scratch
COPY --from=build /rootfs/ /
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /muster /muster
USER 65532:65532
ENTRYPOINT ["/muster"]
