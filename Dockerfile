# gpupool-webhook image: `gpupool serve`, configured by the GPUPOOL_* environment variables the
# Deployment in manifests/base sets (`gpupool serve --help` lists them all).
#   docker build -t ghcr.io/gpupool/gpupool-webhook:0.1.0 .
#
# Reproducible: both base images are pinned by digest (`make pin-images` re-pins them to their tags'
# current digests), and every Python package comes from requirements.lock at an exact version with its
# hashes (`make lock` re-resolves it from pyproject.toml); pip refuses anything else.
# Small: the builder installs the lock and gpupool into a venv with Debian 12's Python 3.11; the final
# stage is distroless Python of the same Debian release, so the venv's interpreter link
# (/usr/bin/python3) resolves unchanged, and it has no shell, no package manager and no pip.
# The wheel leaves out webhook.testing (the API simulator), so the image has no fake API server.

ARG BUILDER_IMAGE=debian:12-slim@sha256:ccb33c3ac5b02588fc1d9e4fc09b952e433d0c54d8618d0ee1afadf1f3cf2455
ARG RUNTIME_IMAGE=gcr.io/distroless/python3-debian12:nonroot@sha256:17b27c84c985a53d0cd2adef4f196ca327fa9b6755369be605cf45533b4e700b

FROM ${BUILDER_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# python3-venv: Debian's Python 3.11 (the runtime image's) with venv and the pip that bootstraps it.
RUN apt-get update \
 && apt-get install --yes --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/gpupool
WORKDIR /src
COPY requirements.lock ./
# Hash-checking mode: exactly the locked files, wheels only (nothing is compiled), no dependency the
# lock does not name. The lock includes the build backend (setuptools) that builds gpupool below.
RUN /opt/gpupool/bin/pip install --require-hashes --no-deps --only-binary=:all: -r requirements.lock
COPY pyproject.toml README.md ./
COPY webhook/ webhook/
# webhook/domain/default_policy.yaml is a symlink to this file (one policy for the code and the ConfigMap).
# COPY keeps the link as a link, so the target must be at the same relative place for the wheel
# build to read it; the wheel then holds its content as a regular file.
COPY manifests/base/policy.yaml manifests/base/policy.yaml
# The `test`s fail the build, not the first Pod: the default policy is packaged as a regular file, the
# simulator is not packaged, and neither pip nor setuptools is left in the venv.
RUN /opt/gpupool/bin/pip install --no-deps --no-build-isolation --no-index . \
 && /opt/gpupool/bin/pip uninstall --yes pip setuptools \
 && site=/opt/gpupool/lib/python3.11/site-packages \
 && test -f $site/webhook/domain/default_policy.yaml \
 && test ! -L $site/webhook/domain/default_policy.yaml \
 && test ! -e $site/webhook/testing \
 && test ! -e /opt/gpupool/bin/pip \
 && test ! -e $site/setuptools

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="gpupool-webhook" \
      org.opencontainers.image.description="Kubernetes mutating admission webhook that places GPU Pods on the best-fitting free GPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/gpupool /opt/gpupool
ENV PATH=/opt/gpupool/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GPUPOOL_CERT=/etc/gpupool/tls/tls.crt \
    GPUPOOL_KEY=/etc/gpupool/tls/tls.key \
    GPUPOOL_HOST=0.0.0.0
# No shell here, so the exec form: the venv's interpreter must resolve in this image and every module
# the server imports (C extensions included: cryptography, orjson, PyYAML) must load, or the build fails.
RUN ["/opt/gpupool/bin/python3", "-c", "import webhook.commands.serve, webhook.serving.app, webhook.serving.server, webhook.sources.live"]
# Numeric, so Kubernetes can check runAsNonRoot; the Deployment runs as the same 65532:65532 (distroless'
# nonroot). No account is needed: nothing reads a home directory, and the root filesystem is read-only.
USER 65532:65532
# 8443: admission over TLS (POST /mutate). 8080: /healthz, /readyz and /metrics over plain HTTP.
EXPOSE 8443 8080
# No HEALTHCHECK: Kubernetes ignores it and uses the Deployment's probes on port 8080.
ENTRYPOINT ["/opt/gpupool/bin/gpupool", "serve"]
