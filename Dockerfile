# syntax=docker/dockerfile:1
# gpupool-webhook image: `gpupool serve`, configured by the GPUPOOL_* environment variables the
# Deployment in manifests/base sets (`gpupool serve --help` lists them all).
#   docker build -t ghcr.io/gpupool/gpupool-webhook:0.1.0 .
# The builder stage makes a wheel of gpupool and of every dependency and installs them into a venv;
# the final stage gets only that venv on the same slim base: no compiler, no pip, no build files.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY webhook/ webhook/
# webhook/domain/default_policy.yaml is a symlink to this file (one policy for the code and the ConfigMap).
# COPY keeps the link as a link, so the target must be at the same relative place for the wheel
# build to read it; the wheel then holds its content as a regular file.
COPY manifests/base/policy.yaml manifests/base/policy.yaml
# The two `test`s fail the build, not the first Pod, if the default policy did not make it into the
# package as a regular file.
RUN python -m pip wheel --wheel-dir /wheels . \
 && python -m venv /opt/gpupool \
 && /opt/gpupool/bin/pip install --no-index --find-links /wheels gpupool-webhook \
 && /opt/gpupool/bin/pip uninstall --yes pip setuptools \
 && test -f /opt/gpupool/lib/python3.*/site-packages/webhook/domain/default_policy.yaml \
 && test ! -L /opt/gpupool/lib/python3.*/site-packages/webhook/domain/default_policy.yaml \
 && /opt/gpupool/bin/gpupool --help > /dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpupool-webhook" \
      org.opencontainers.image.description="Kubernetes mutating admission webhook that places GPU Pods on the best-fitting free GPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
# Same base image, so the venv's interpreter link (/usr/local/bin/python3.11) resolves unchanged.
COPY --from=builder /opt/gpupool /opt/gpupool
ENV PATH=/opt/gpupool/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GPUPOOL_CERT=/etc/gpupool/tls/tls.crt \
    GPUPOOL_KEY=/etc/gpupool/tls/tls.key \
    GPUPOOL_HOST=0.0.0.0
# Numeric, so Kubernetes can check runAsNonRoot; the Deployment runs as the same 65532:65532.
# No account is needed: nothing reads a home directory, and the root filesystem is read-only in the Pod.
USER 65532:65532
# 8443: admission over TLS (POST /mutate). 8080: /healthz, /readyz and /metrics over plain HTTP.
EXPOSE 8443 8080
# No HEALTHCHECK: Kubernetes ignores it and uses the Deployment's probes on port 8080.
ENTRYPOINT ["gpupool", "serve"]
