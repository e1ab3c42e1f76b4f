# bosun-controller. Build it with deploy/images/build.sh, which compiles the static musl
# binary and stages this image's build context:
#
#   bosun-controller                     the binary (x86_64-unknown-linux-musl, stripped)
#   etc/passwd, etc/group                root and the unprivileged user 65532 ("nonroot")
#   etc/ssl/certs/ca-certificates.crt    the build machine's CA bundle
#
# FROM scratch: nothing is pulled from a registry, and the image holds no shell, no libc and
# no package manager: the binary is static. The CA bundle is there for completeness; in a Pod
# the controller trusts the cluster's CA from its service-account mount.
FROM scratch
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="bosun-controller" \
      org.opencontainers.image.description="Bosun's controller: plans Operations into NodeTasks and drives them in plan order" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY etc/ /etc/
COPY bosun-controller /usr/local/bin/bosun-controller
# Nothing in the image runs as root. deploy/controller/deployment.yaml adds a read-only root
# file system and drops every capability.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/bosun-controller"]
