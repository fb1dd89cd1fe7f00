#!/bin/bash
set -euo pipefail
git init -q -b main site
cd site
printf 'Hello\nSee you soon\n' > greeting.txt
printf '<h1>Home</h1>\n' > index.html
git add . && git commit -qm "Initial site"
git checkout -q -b translations
printf 'Hola, mundo!\nSee you soon\n' > greeting.txt
printf '<h1>Inicio</h1>\n' > index.es.html
git add . && git commit -qm "Add Spanish"
git checkout -q main
printf 'Hello, world!\nSee you soon\n' > greeting.txt
git commit -qam "Friendlier greeting"
