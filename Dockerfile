# cm-scheduler on `scratch`: a statically linked binary, a non-root user, nothing else.
#
# Built from a prebuilt binary (no registry needed; this is what CI does, see .ci/image):
#   RUSTFLAGS="-C target-feature=+crt-static" \
#     cargo build --release -p cm-scheduler --bin cm-scheduler --target x86_64-unknown-linux-gnu
#   cp /etc/ssl/certs/ca-certificates.crt docker/    (not in the repository)
#   docker build -t cm-scheduler .
# or from a context holding only those files (.ci/image).
# Or entirely inside Docker, from the source: Dockerfile.build (docs/deploying/image.md).
FROM scratch
ARG BINARY=target/x86_64-unknown-linux-gnu/release/cm-scheduler
COPY docker/passwd /etc/passwd
COPY docker/group /etc/group
# For HTTPS webhooks and NATS over TLS (rustls reads the system's roots).
COPY docker/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY ${BINARY} /cm-scheduler
USER 65532:65532
# The HTTP listener: /livez, /readyz, /metrics. On loopback by default (a non-loopback address
# needs --http-token-file for the status page); see docs/deploying/image.md to publish it.
ENV CM_LISTEN=127.0.0.1:8080
EXPOSE 8080
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/cm-scheduler", "health"]
ENTRYPOINT ["/cm-scheduler"]
CMD ["run"]
