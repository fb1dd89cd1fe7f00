#!/bin/bash
set -euo pipefail
mkdir -p bin secrets shared/uploads shared/tmp
for s in deploy start stop; do printf '#!/bin/sh\necho %s\n' "$s" > "bin/$s.sh"; chmod 644 "bin/$s.sh"; done
printf 'notes\n' > bin/README; chmod 644 bin/README
printf 'KEY\n' > secrets/id_ed25519; printf 'token\n' > secrets/api.token
chmod 644 secrets/*; chmod 755 secrets
printf 'a\n' > shared/uploads/a.txt; printf 'b\n' > shared/tmp/b.txt; printf 'c\n' > shared/index.html
chmod 666 shared/uploads/a.txt shared/tmp/b.txt; chmod 664 shared/index.html
chmod 777 shared shared/uploads; chmod 775 shared/tmp
