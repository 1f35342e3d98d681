# muster's image: one static (musl) binary on an empty base, run as a non-root user.
#
#   docker build -t <your-registry>/muster:<version> .
#   helm install muster charts/muster --set image.repository=<your-registry>/muster
#
# The entrypoint is the binary; the chart passes `run ...` as arguments. No shell, no package
# manager, nothing but the binary and the CA bundle (for an https --prometheus-url).

FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev ca-certificates
WORKDIR /src
COPY . .
# Rust's musl target links statically by default.
RUN cargo build --release --locked --bin muster \
    && cp target/release/muster /muster

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /muster /muster
USER 65532:65532
ENTRYPOINT ["/muster"]
