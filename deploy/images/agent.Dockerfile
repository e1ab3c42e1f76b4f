# bosun-agent. Build it with deploy/images/build.sh, which compiles the static musl binary
# and stages this image's build context:
#
#   bosun-agent                          the binary (x86_64-unknown-linux-musl, stripped)
#   etc/passwd, etc/group                root and the unprivileged user 65532 ("nonroot")
#   etc/ssl/certs/ca-certificates.crt    the build machine's CA bundle: plugin sources over
#                                        https and OCI registries are verified against it
#
# FROM scratch: nothing is pulled from a registry, and the image holds nothing but the binary
# and those files. Host commands a plugin is granted come from the node (/host), never from
# the image.
FROM scratch
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="bosun-agent" \
      org.opencontainers.image.description="Bosun's node agent: runs its node's steps as signed WebAssembly plugins" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY etc/ /etc/
COPY bosun-agent /usr/local/bin/bosun-agent
# Root (uid 0), because its job is host maintenance: the files it changes for plugins
# (/etc/kubernetes/pki, static Pod manifests, the package database, /usr/bin) belong to root
# on the host, it chroot(2)s into the host root to run granted commands, and systemd takes
# unit commands on its private socket only from root. deploy/agent/daemonset.yaml narrows
# root to the fixed capability set docs/security.md lists; plugins get only their grants,
# inside wasmtime.
USER 0:0
ENTRYPOINT ["/usr/local/bin/bosun-agent"]
