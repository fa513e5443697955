# Ferryman API + in-process worker. Point DATABASE_URL at your PostgreSQL (13+); without it the
# container starts the embedded PostgreSQL in /var/lib/ferryman (mount a volume there).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /srv/ferryman
COPY pyproject.toml README.md ./
COPY app ./app
# The migrations: the wheel that `pip install .` builds carries them as app/migrations.
COPY alembic ./alembic
# The SDK and the `ferryman` command: a distribution of its own, on no index, so installed from
# its folder in the same command as the server that requires it.
COPY clients/python ./clients/python
RUN pip install ./clients/python . && useradd --system --create-home ferryman \
    && mkdir -p /var/lib/ferryman && chown ferryman /var/lib/ferryman
USER ferryman
ENV FERRYMAN_DATA_DIR=/var/lib/ferryman FERRYMAN_HOST=0.0.0.0 FERRYMAN_AUTH=keys
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz')"
CMD ["ferryman", "serve"]
