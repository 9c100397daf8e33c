# The clrscope agent as a container image (a Kubernetes sidecar or node agent: deploy/kubernetes/).
#
#   docker build -t clrscope --build-arg GIT_REVISION="$(git rev-parse --short=12 HEAD)" .
#   docker run --rm clrscope --version
#
# Stage 1 builds the release binary with the official Rust image; stage 2 runs it on distroless
# (glibc and libgcc, no shell, no package manager) as the non-root uid 1654, the `app` user of
# Microsoft's .NET images: a sidecar and its service share the diagnostic socket (mode 0600) when
# they run as the same user. The build context
# has no .git (.dockerignore), so `clrscope --version` names the revision passed as a build
# argument, or says "unknown revision".
ARG RUST_VERSION=1.88

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
ARG GIT_REVISION=""
ENV GIT_REVISION=${GIT_REVISION}
RUN cargo build --release --locked --bin clrscope \
    && install -D -m 0755 target/release/clrscope /out/clrscope \
    && install -d -m 0700 /out/data

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/clrscope /usr/local/bin/clrscope
# The store: mount a volume here to keep profiles across restarts (created 0700, owned by 1654).
COPY --from=build --chown=1654:1654 /out/data /var/lib/clrscope
USER 1654:1654
# 52323: the API and web UI; 52325: Prometheus metrics.
EXPOSE 52323 52325
ENTRYPOINT ["/usr/local/bin/clrscope"]
CMD ["agent", "--urls", "http://0.0.0.0:52323", "--metrics-urls", "http://0.0.0.0:52325", "--data-dir", "/var/lib/clrscope"]
