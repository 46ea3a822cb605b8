# syntax=docker/dockerfile:1
# image: ghcr.io/autopar/autopar-operator:<version>
#
# The operator (`autopar operator run`), also able to run the planner (`autopar plan`, which
# traces models with torch.fx on fake tensors: CPU-only torch is enough).  Small: slim Python,
# the CPU build of torch, no compilers; runs as a non-root user with a read-only root filesystem
# (the chart mounts an emptyDir at /tmp).
#
#   docker build -f docker/operator.Dockerfile -t ghcr.io/autopar/autopar-operator:0.1.0 .

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/autopar
ENV PATH=/opt/autopar/bin:$PATH
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu
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
LABEL org.opencontainers.image.title="autopar-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 1000 autopar && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /tmp autopar
COPY --from=build /opt/autopar /opt/autopar
ENV PATH=/opt/autopar/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
USER 1000:1000
EXPOSE 8080
ENTRYPOINT ["autopar"]
CMD ["operator", "run"]
