#!/bin/bash
set -e
cd /app
cat > /app/summarize.sh <<'SH'
#!/bin/bash
# Usage: summarize.sh LOGFILE   -- prints a summary of a web access log.
export LC_ALL=C
log=$1
bad='($0 ~ /^[ \t]*$/ || $0 ~ /^[ \t]*#/ || NF != 7 || $5 !~ /^[0-9][0-9][0-9]$/)'
awk "$bad"' { skipped++; next }
    { total++; ips[$2]++; cls[substr($5, 1, 1)]++; bytes += $6 }
    END {
        n = 0; for (ip in ips) n++
        printf "total_requests: %d\nskipped_lines: %d\nunique_ips: %d\n", total, skipped, n
        for (c = 2; c <= 5; c++) printf "status_%dxx: %d\n", c, cls[c]
        printf "total_bytes: %.0f\n", bytes
    }' "$log"
# field N of the well-formed lines, ranked by count desc then value asc: "count value"
ranked() { awk "!$bad"' { print $'"$1"' }' "$log" | sort | uniq -c | awk '{ print $1, $2 }' | sort -k1,1nr -k2,2; }
ranked 2 | head -n 1 | awk '{ print "top_ip: " $2 " " $1 }'
echo "top_paths:"
ranked 4 | head -n 3 | awk '{ print "  " $2 " " $1 }'
SH
chmod +x /app/summarize.sh
/app/summarize.sh /app/logs/access.log > /app/summary.txt
cat /app/summary.txt
