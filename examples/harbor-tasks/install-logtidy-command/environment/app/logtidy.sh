#!/bin/bash
# logtidy DIR: keep the KEEP newest *.log files of DIR (by modification time) and delete the others.
# Settings come from /etc/logtidy.conf, lines of KEY=VALUE: KEEP=<number>, DRY_RUN=<yes|no>.
set -eu
conf=/etc/logtidy.conf
if [ ! -r "$conf" ]; then echo "logtidy: $conf is missing" >&2; exit 2; fi
KEEP="" DRY_RUN=no
. "$conf"
case "$KEEP" in ''|*[!0-9]*) echo "logtidy: KEEP in $conf must be a number" >&2; exit 2 ;; esac
dir=${1:?usage: logtidy DIR}
ls -1t -- "$dir"/*.log 2>/dev/null | tail -n +$((KEEP + 1)) | while IFS= read -r old; do
    if [ "$DRY_RUN" = yes ]; then echo "would remove $old"; else rm -f -- "$old"; echo "removed $old"; fi
done
