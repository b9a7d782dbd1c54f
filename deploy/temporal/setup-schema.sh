#!/bin/sh
# Creates or upgrades Temporal's two schemas (history and visibility) in the databases that
# deploy/postgres/init-databases.sh created. Runs in the temporalio/admin-tools image before the server starts.
#
# Safe on every `docker compose up`: setup-schema leaves a database that is already past version 0.0 alone, and
# update-schema applies only the versions a database lacks, which is also how a newer server image gets its schema.
set -eu

schemas=/etc/temporal/schema/postgresql/v12

sql_tool() {
    # The password comes from SQL_PASSWORD in the environment, so it never shows in the process list.
    temporal-sql-tool --plugin "$DB" --ep "$POSTGRES_SEEDS" -p "$DB_PORT" -u "$POSTGRES_USER" "$@"
}

migrate() {
    database="$1"
    versions="$2"
    echo "temporal schema: $database"
    sql_tool --db "$database" setup-schema -v 0.0
    sql_tool --db "$database" update-schema -d "$schemas/$versions/versioned"
}

migrate temporal temporal
migrate temporal_visibility visibility
