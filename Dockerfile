# fedhead image for a Flower 1.42 deployment: the SuperLink, the SuperNodes and the SuperExec
# processes that run the ServerApp / ClientApps ("process" isolation) all use this one image.
# See docker-compose.yml and docs/deployment.md, section 3.
#
# Built by scripts/docker_check.sh (or `scripts/docker_check.sh build`), which first fills
# .docker-build/ (kept out of git and out of the image):
#   .docker-build/wheels/                torch==2.14.1, torchvision==0.29.1 and their
#                                        dependencies (CUDA 13 runtime wheels included)
#   .docker-build/ca-certificates.crt    the CA bundle pip must trust to reach PyPI
#   .docker-build/pip.conf               the host's pip index settings, if any
# Base: BASE_IMAGE (default fedhead-base:bookworm, a Debian bookworm minbase made with
# debootstrap by the same script; debian:bookworm-slim works where images can be pulled).
ARG BASE_IMAGE=fedhead-base:bookworm

# ---- stage 1: a virtual environment with every dependency (the wheels stay in this stage) --
FROM ${BASE_IMAGE} AS deps
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/etc/fedhead/ca-certificates.crt REQUESTS_CA_BUNDLE=/etc/fedhead/ca-certificates.crt \
    PIP_CONFIG_FILE=/etc/fedhead/pip.conf PIP_DEFAULT_TIMEOUT=180
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY .docker-build/ca-certificates.crt .docker-build/pip.conf /etc/fedhead/
COPY .docker-build/wheels /wheels
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-index --find-links /wheels torch==2.14.1 torchvision==0.29.1
COPY pyproject.toml /tmp/fedhead/pyproject.toml
# the project's declared dependencies (not the project itself: its code is the last layer)
RUN python3 -c "import tomllib; d = tomllib.load(open('/tmp/fedhead/pyproject.toml', 'rb')); \
print('\n'.join(d['project']['dependencies']))" > /tmp/fedhead/requirements.txt \
    && /opt/venv/bin/pip install --find-links /wheels -r /tmp/fedhead/requirements.txt \
       torch==2.14.1 torchvision==0.29.1 wheel

# ---- stage 2: the runtime image ----------------------------------------------------------
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 \
    MUJOCO_GL=egl PYOPENGL_PLATFORM=egl FEDHEAD_CACHE=/data/cache
# python, and the OpenGL stack of the offscreen MuJoCo renderer (3D Shapes): EGL through
# Mesa's software rasteriser (libegl1 + libegl-mesa0 + libgl1-mesa-dri), OSMesa as fallback
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates \
       libgl1 libegl1 libegl-mesa0 libgl1-mesa-dri libgles2 libosmesa6 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=deps /opt/venv /opt/venv
WORKDIR /app
COPY pyproject.toml README.md ./
COPY fedhead ./fedhead
# setuptools (a torch dependency) is in the venv, so the build needs no network
RUN pip install --no-deps --no-build-isolation . \
    && python -c "import fedhead, flwr, torch; print('fedhead image:', flwr.__version__, torch.__version__)"
# every container runs as an unprivileged user (uid 1000); results, private client state and
# the data cache go to /data; /state holds the SuperLink database (with-state.yml)
RUN useradd --create-home --uid 1000 flwr && mkdir -p /data /state && chown flwr /data /state
USER flwr
WORKDIR /data
