#!/bin/bash
set -e
cd /app
cat > /app/report.sh <<'SH'
#!/bin/bash
# Usage: report.sh ORDERS.json
exec jq '
  [.orders[] | select(.status == "paid")] as $paid
  | {
      customers: ($paid
        | group_by(.customer)
        | map({customer: .[0].customer,
               paid_orders: length,
               revenue_cents: (map(.items[] | .qty * .unit_price_cents) | add // 0)})
        | sort_by(-.revenue_cents, .customer)),
      top_sku: ([$paid[].items[]]
        | group_by(.sku)
        | map({sku: .[0].sku, qty: (map(.qty) | add)})
        | sort_by(-.qty, .sku)
        | (.[0].sku // null)),
      pending_order_ids: ([.orders[] | select(.status == "pending") | .id] | sort)
    }' "$1"
SH
chmod +x /app/report.sh
/app/report.sh /app/data/orders.json > /app/report.json
jq -c '.top_sku, (.customers | length)' /app/report.json
