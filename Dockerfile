# The image docker-compose.yml runs as migrate, api and worker.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY service ./service
COPY migrations ./migrations
# Editable: service.store.migrate finds migrations/ beside the package.
RUN pip install --no-cache-dir -e .
ENV PYTHONUNBUFFERED=1
