#!/bin/bash
set -euo pipefail
mkdir -p stage/bundle/conf stage/bundle/bin stage/bundle/docs stage/bundle/share/locale
for i in $(seq 1 40); do printf 'msgid "line %d"\n' "$i" > "stage/bundle/share/locale/m$i.po"; done
printf '#!/bin/sh\necho run\n' > stage/bundle/bin/run.sh
printf '[server]\nport = 8443\n# license_key = EXAMPLE-0000-0000\n' > stage/bundle/docs/example.ini
printf '[server]\nhost = 0.0.0.0\n\n[license]\nowner = ACME Corp\nlicense_key = QX7-44K-P9Z-001\n' > stage/bundle/conf/prod.ini
printf '[server]\nhost = 127.0.0.1\n' > stage/bundle/conf/dev.ini
tar -czf release.tar.gz -C stage bundle
rm -rf stage
