# syntax=docker/dockerfile:1
# bosun-controller, built from this workspace. From the repository root:
#
#   docker build -f deploy/images/controller.Dockerfile -t bosun-controller:0.1.0 .
#
# Reproducible: the toolchain and base images are pinned (replace the tags by their digests
# when you mirror them: `docker buildx imagetools inspect IMAGE`), dependencies come from
# Cargo.lock (--locked), paths are remapped out of the binary, and the binary's mtime is
# SOURCE_DATE_EPOCH, so two builds of one commit are meant to give the same binary. Not
# verified here: the development machine has the docker client but no daemon and no access
# to the image registries (docs/install.md, "Images").

# Build: a static musl binary (no glibc at run time, so the runtime image needs no libc).
FROM docker.io/library/rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
ARG SOURCE_DATE_EPOCH=0
ENV CARGO_TARGET_DIR=/target \
    CARGO_INCREMENTAL=0 \
    RUSTFLAGS="--remap-path-prefix=/src=/bosun --remap-path-prefix=/usr/local/cargo=/cargo"
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo build --release --locked --target x86_64-unknown-linux-musl -p bosun-controller \
 && install -D -m 0755 /target/x86_64-unknown-linux-musl/release/bosun-controller /out/bosun-controller \
 && touch -d "@${SOURCE_DATE_EPOCH}" /out/bosun-controller

# Runtime: distroless "static" with its nonroot user (65532). The controller needs no shell,
# no libc (the binary is static) and no system CA bundle (in a Pod it trusts the cluster CA
# from its service-account mount). Nothing in the image runs as root.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/bosun-controller /usr/local/bin/bosun-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/bosun-controller"]
