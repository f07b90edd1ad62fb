# fedhead image for a Flower 1.42 deployment (SuperLink, SuperNodes and the SuperExec processes
# that run the ServerApp / ClientApps in "process" isolation). See docker-compose.yml.
#
#   docker compose build && docker compose up -d
#   flwr run . <connection>     # from the host, with a [superlink.<connection>] entry in
#                               # ~/.flwr/config.toml pointing at 127.0.0.1:8000 (insecure)
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    MUJOCO_GL=egl \
    FEDHEAD_CACHE=/data/cache

RUN apt-get update \
    && apt-get install -y --no-install-recommends libgl1 libegl1 libglib2.0-0 git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY fedhead ./fedhead
COPY strategies ./strategies
COPY clients ./clients
COPY conf ./conf
RUN pip install --upgrade pip && pip install .

# every container runs as an unprivileged user; results and private client state go to /data
RUN useradd --create-home --uid 1000 flwr && mkdir -p /data && chown flwr /data
USER flwr
WORKDIR /data
