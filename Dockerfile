# kvgate's container image: `make image` builds it (docker or podman).
#
# The build stage runs scripts/build-release.sh, the script `make test` runs too (a stripped,
# version-stamped cgo binary, its shared libraries checked by scripts/check-ldd.sh); the runtime
# stage is Debian slim with libzmq5 (the only library kvgate needs beyond libc), a non-root
# user and a writable HF_HOME for tokenizers fetched by hub id. Both stages are the same Debian
# release, so the libzmq the binary was linked against is the one it runs with.
ARG GO_VERSION=1.26.8
ARG DEBIAN_RELEASE=bookworm

FROM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libzmq3-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG COMMIT=unknown
ARG BUILD_DATE=
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    VERSION="$VERSION" COMMIT="$COMMIT" BUILD_DATE="$BUILD_DATE" scripts/build-release.sh /out/kvgate

FROM debian:${DEBIAN_RELEASE}-slim
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="kvgate" \
      org.opencontainers.image.description="OpenAI-compatible gateway with KV-cache-aware routing for vLLM fleets" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$COMMIT"
# The CA bundle (TLS to workers, NATS and the tokenizer hub) comes from the build stage: the
# ca-certificates package would pull openssl and libssl3 (~8 MB) that kvgate never loads. The
# user's uid is fixed (65532) so that a Kubernetes securityContext can name it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libzmq5 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 kvgate \
 && useradd --system --uid 65532 --gid kvgate --home-dir /var/lib/kvgate --create-home --shell /usr/sbin/nologin kvgate \
 && install -d -o kvgate -g kvgate -m 0755 /var/cache/kvgate/hf /etc/kvgate
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/kvgate /usr/local/bin/kvgate
COPY configs/kvgate.yaml /etc/kvgate/kvgate.example.yaml
# The client listener on every interface (the default config binds the loopback only); the
# admin listener (/debug, the worker-labelled /metrics) stays off until admin_listen is set,
# conventionally :8001. HF_HOME: the hub tokenizer cache (mount a volume to keep it across
# restarts; a read-only root filesystem needs one).
ENV KVGATE_LISTEN=0.0.0.0:8000 \
    HF_HOME=/var/cache/kvgate/hf
USER 65532:65532
WORKDIR /var/lib/kvgate
EXPOSE 8000 8001
# GET /live and /ready on the client listener (KVGATE_LISTEN); the image has no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["kvgate", "healthcheck"]
ENTRYPOINT ["kvgate"]
CMD ["serve"]
