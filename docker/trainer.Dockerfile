# syntax=docker/dockerfile:1
# image: ghcr.io/autopar/autopar:<version>
#
# The planner and trainer pods the operator creates (`autopar plan`, `autopar operator
# publish-plan`, `torchrun -m autopar.cli train`, `autopar operator report-progress`): CUDA
# PyTorch.  PyPI's torch==2.13.0 wheel for Linux carries the CUDA runtime, cuDNN and NCCL as
# nvidia-* wheels, so a slim Python base is enough; the GPU driver comes from the node (NVIDIA
# container toolkit).  Runs as uid 1000, the user the operator's pods run as
# (operator/resources.py RUN_AS_USER).
#
#   docker build -f docker/trainer.Dockerfile -t ghcr.io/autopar/autopar:0.1.0 .

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/autopar
ENV PATH=/opt/autopar/bin:$PATH
RUN pip install torch==2.13.0
COPY docker/requirements.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt
COPY pyproject.toml README.md /src/
COPY autopar /src/autopar
COPY planner /src/planner
COPY trainer /src/trainer
COPY job /src/job
COPY operator /src/operator
RUN pip install --no-deps /src && python -m compileall -q /opt/autopar

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="autopar" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 1000 autopar && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/autopar autopar \
    && mkdir -p /var/cache/autopar /var/lib/autopar/checkpoints \
    && chown 1000:1000 /var/cache/autopar /var/lib/autopar/checkpoints
COPY --from=build /opt/autopar /opt/autopar
ENV PATH=/opt/autopar/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    AUTOPAR_CACHE_DIR=/var/cache/autopar \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 1000:1000
WORKDIR /home/autopar
ENTRYPOINT []
CMD ["autopar", "--help"]
