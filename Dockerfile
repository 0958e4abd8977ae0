# Four images from one file:
#   docker build --target operator    -t atom-operator:0.1.0 .     the operator, without torch
#   docker build --target engine      -t atom-engine:0.1.0 .       the serving engine, torch on the CPU by default
#   docker build --target engine-rngd -t atom-engine-rngd:0.1.0 .  the engine for rngd prefill pods: FuriosaAI's
#                                                                  furiosa-torch and the torch 2.10 it pins
#   docker build --target epp         -t atom-epp:v1.5.0 .         the Gateway API Inference Extension's endpoint
#                                                                  picker (spec.routing.inferencePool); needs the
#                                                                  pinned binary at build/epp/epp
# `make docker-build` builds all four (python -m atom_localcluster.docker build ...), also where nothing
# can be pulled and the package index is not reachable from containers (see localcluster/atom_localcluster/docker.py).
#
# Build arguments:
#   BASE_IMAGE         any image with Python 3.11, `python3 -m venv` and `useradd` (a Debian/Ubuntu family image)
#   ENGINE_BASE_IMAGE  the engine's base; defaults to BASE_IMAGE. For ATOM NPUs, a Rebellions RBLN SDK image whose
#                      Python 3.11 carries the vendor SDK (`rebel`) and its torch: the engine's venv sees the base's
#                      site-packages and installs only the locked packages the base lacks
#                      (requirements/base_lacks.py), so the SDK and its torch are used as installed there.
#   WHEELS_URL         a --find-links URL holding every wheel of the lock (then no index is used); empty: the
#                      default package index
#
# Layers, from least to most often changed: base, venv + locked dependencies (requirements/<target>.lock, exact
# pins, installed with --no-deps because the lock is the complete closure), the project's source, the user.
# The legacy builder builds the stages in file order, so the small operator stage comes first.

ARG BASE_IMAGE=python:3.11-slim
ARG ENGINE_BASE_IMAGE=${BASE_IMAGE}

# ---------------------------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS operator
ARG WHEELS_URL=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/atom \
    PATH=/opt/atom/bin:$PATH
RUN python3 -m venv /opt/atom
COPY requirements/operator.lock /tmp/requirements.lock
RUN pip install --quiet --no-deps ${WHEELS_URL:+--no-index --find-links "$WHEELS_URL"} -r /tmp/requirements.lock \
 && rm /tmp/requirements.lock
# The operator imports the spec models and limits from the engine's torch-free base install.
COPY engine/ /tmp/src/engine/
COPY operator/ /tmp/src/operator/
# --no-build-isolation: setuptools comes from the lock rather than from an index at build time.
RUN pip install --quiet --no-deps --no-build-isolation /tmp/src/engine /tmp/src/operator && rm -rf /tmp/src
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin atom
# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 10001:10001
ENTRYPOINT ["atom-operator"]

# ---------------------------------------------------------------------------------------------------------------
FROM ${ENGINE_BASE_IMAGE} AS engine
ARG WHEELS_URL=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/atom \
    PATH=/opt/atom/bin:$PATH \
    HOME=/tmp
# tcmalloc, which the engine preloads into itself at start (engine/atom_engine/malloc.py; faster than glibc's malloc
# for eager torch). A base that has it already (the local debootstrap base) skips the install; one where apt cannot
# reach a package index builds anyway, and the engine runs on glibc's malloc.
RUN ldconfig -p | grep -q libtcmalloc_minimal.so.4 \
 || { apt-get update && apt-get install -y --no-install-recommends libtcmalloc-minimal4 \
      && rm -rf /var/lib/apt/lists/*; } \
 || echo "no libtcmalloc-minimal4: the engine will run on glibc's malloc"
# --system-site-packages: on an RBLN base the vendor SDK lives in the base's Python and is not on a public index.
RUN python3 -m venv --system-site-packages /opt/atom
COPY requirements/engine.lock requirements/base_lacks.py /tmp/
# Only what the base lacks: an SDK base's own torch (and the SDK) stay the ones imported.
RUN python /tmp/base_lacks.py /tmp/engine.lock > /tmp/needed.lock \
 && pip install --quiet --no-deps ${WHEELS_URL:+--no-index --find-links "$WHEELS_URL"} -r /tmp/needed.lock \
 && rm /tmp/engine.lock /tmp/needed.lock /tmp/base_lacks.py
COPY engine/ /tmp/src/engine/
RUN pip install --quiet --no-deps --no-build-isolation /tmp/src/engine && rm -rf /tmp/src
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin atom
# Where builtin:<name> checkpoints are looked for (atom_engine.model.builtin): an image built FROM this one bakes a
# converted model in with `COPY <dir printed by: python -m atom_engine.model.builtin path smollm2-135m>
# /opt/atom/models/<that dir's name>`; without one, serve a checkpoint by path from a volume instead.
ENV ATOM_MODELS_DIR=/opt/atom/models
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["atom-engine"]

# ---------------------------------------------------------------------------------------------------------------
# The engine of rngd prefill pods (FuriosaAI RNGD). furiosa-torch pins torch 2.10, so this image has its own lock
# (requirements/engine-rngd.lock, pinned by requirements/rngd.lock, which its tests run with). The device's
# driver-side library and kernel driver come from the node (Furiosa's device plugin mounts them), not the image.
FROM ${BASE_IMAGE} AS engine-rngd
ARG WHEELS_URL=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/atom \
    PATH=/opt/atom/bin:$PATH \
    HOME=/tmp
# furiosa-torch's compiler shells out to aarch64-linux-gnu-gcc, which its wheel does not declare; a pod with no
# compiled artifact yet compiles at start. A base that has the cross compiler already (the local debootstrap base
# for this target) skips the install.
RUN command -v aarch64-linux-gnu-gcc >/dev/null \
 || { apt-get update && apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
      && rm -rf /var/lib/apt/lists/*; }
RUN python3 -m venv /opt/atom
COPY requirements/engine-rngd.lock /tmp/requirements.lock
RUN pip install --quiet --no-deps ${WHEELS_URL:+--no-index --find-links "$WHEELS_URL"} -r /tmp/requirements.lock \
 && rm /tmp/requirements.lock
COPY engine/ /tmp/src/engine/
RUN pip install --quiet --no-deps --no-build-isolation /tmp/src/engine && rm -rf /tmp/src
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin atom
ENV ATOM_MODELS_DIR=/opt/atom/models
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["atom-engine"]

# ---------------------------------------------------------------------------------------------------------------
# The endpoint picker: GIE's cmd/epp at the version hack/tools/epp pins, a static pure-Go build (CGO_ENABLED=0) made
# on the host from the Go module proxy into the tools cache (atom_localcluster/tools.py), then staged into the context
# at build/epp/epp by atom_localcluster.docker: the build needs no Go toolchain and no network. On our base, like
# the other images, rather than upstream's distroless one, which cannot be pulled here.
FROM ${BASE_IMAGE} AS epp
COPY build/epp/epp /usr/local/bin/epp
# The uid the operator's <name>-epp Deployment runs it as (children/inferencepool.py).
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["/usr/local/bin/epp"]
