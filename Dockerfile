# syntax=docker/dockerfile:1
#
# One image for every Berth process: the API (the default command), the control-plane worker
# (`berth worker control`) and the node agents (`berth worker node --node-id N`). docker-compose.yml runs each with
# its own command; every setting comes from BERTH_* environment variables (config/settings.py).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed uid, so a volume written by one build stays writable by the next.
RUN groupadd --system --gid 10001 berth \
    && useradd --system --uid 10001 --gid berth --home-dir /var/lib/berth --no-create-home berth \
    && install --directory --owner berth --group berth --mode 0750 /var/lib/berth

WORKDIR /app
COPY . /app
RUN pip install . && rm -rf build ./*.egg-info

# Node agents keep their lease files here: mount a volume on it so leases outlive the container.
ENV BERTH_STATE_DIR=/var/lib/berth
USER berth
EXPOSE 8000
CMD ["uvicorn", "--factory", "api.app:create_app", "--host", "0.0.0.0", "--port", "8000"]
