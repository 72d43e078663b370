#!/bin/bash
set -e
install -m 755 /app/logtidy.sh /usr/local/bin/logtidy
printf 'KEEP=3\nDRY_RUN=no\n' > /etc/logtidy.conf
chmod 644 /etc/logtidy.conf
logtidy /tmp   # no logs there: a check that the command and its settings are in place
