#!/bin/sh
# Prepares the Temporal namespace Berth runs in: creates it if missing and registers Berth's custom search
# attributes, which the control worker refuses to start without. Runs in the temporalio/admin-tools image once the
# server answers; safe to run again (it only adds what is missing).
#
# The attributes must match workflows/search_attributes.py: tests/test_compose.py compares the two lists.
set -eu

address="${BERTH_TEMPORAL_ADDRESS:?set BERTH_TEMPORAL_ADDRESS to the Temporal frontend, host:port}"
namespace="${BERTH_TEMPORAL_NAMESPACE:-default}"
retention="${NAMESPACE_RETENTION:-7d}"

until temporal operator cluster health --address "$address" 2>/dev/null | grep -q SERVING; do
    echo "waiting for the Temporal frontend at $address ..."
    sleep 2
done

if temporal operator namespace describe --address "$address" --namespace "$namespace" >/dev/null 2>&1; then
    echo "namespace $namespace exists"
else
    temporal operator namespace create --address "$address" --namespace "$namespace" --retention "$retention"
fi

ensure_search_attribute() {
    name="$1"
    type="$2"
    # A new namespace takes a few seconds to reach every frontend cache: retry the listing until it answers.
    until existing=$(temporal operator search-attribute list --address "$address" --namespace "$namespace" 2>&1); do
        echo "waiting for namespace $namespace to be visible ..."
        sleep 2
    done
    if echo "$existing" | grep -qw "$name"; then
        echo "search attribute $name exists"
    else
        temporal operator search-attribute create --address "$address" --namespace "$namespace" \
            --name "$name" --type "$type"
    fi
}

ensure_search_attribute BerthKind Keyword
ensure_search_attribute BerthState Keyword
ensure_search_attribute BerthRegion Keyword
ensure_search_attribute BerthNode Keyword
ensure_search_attribute BerthTenant Keyword
ensure_search_attribute BerthGpuCount Int
ensure_search_attribute BerthEndsAt Datetime
ensure_search_attribute BerthExpiring Bool
ensure_search_attribute BerthActor Keyword
