#!/bin/bash
# Runs once, when the postgres image initialises an empty data volume (docker-entrypoint-initdb.d).
#
# Berth and Temporal share one PostgreSQL server but not one role: each owns only its own databases, so neither can
# read or damage the other's data. Changing a password later takes ALTER ROLE; this script never runs again.
set -euo pipefail

psql --username "$POSTGRES_USER" --dbname postgres --set ON_ERROR_STOP=1 \
    --set berth_password="$DB_BERTH_PASSWORD" --set temporal_password="$DB_TEMPORAL_PASSWORD" <<'SQL'
CREATE ROLE berth LOGIN PASSWORD :'berth_password';
CREATE DATABASE berth OWNER berth;
CREATE ROLE temporal LOGIN PASSWORD :'temporal_password';
CREATE DATABASE temporal OWNER temporal;
CREATE DATABASE temporal_visibility OWNER temporal;
SQL
