# syntax=docker/dockerfile:1
# bosun-agent, built from this workspace. From the repository root:
#
#   docker build -f deploy/images/agent.Dockerfile -t bosun-agent:0.1.0 .
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
    cargo build --release --locked --target x86_64-unknown-linux-musl -p bosun-agent \
 && install -D -m 0755 /target/x86_64-unknown-linux-musl/release/bosun-agent /out/bosun-agent \
 && touch -d "@${SOURCE_DATE_EPOCH}" /out/bosun-agent

# Runtime: distroless "static", run as root (uid 0). The agent is root because its job is
# host maintenance: the files it changes for plugins (/etc/kubernetes/pki, static Pod
# manifests, the package database, /usr/bin) belong to root on the host, it chroot(2)s into
# the host root to run granted commands, and systemd takes unit commands on its private
# socket only from root. The DaemonSet (deploy/agent/daemonset.yaml) narrows root to a fixed
# capability set; plugins get only their grants, inside wasmtime. The image itself holds
# nothing but the binary: host commands come from the node (/host), never from the image.
FROM gcr.io/distroless/static-debian12
COPY --from=build /out/bosun-agent /usr/local/bin/bosun-agent
USER 0:0
ENTRYPOINT ["/usr/local/bin/bosun-agent"]
