#!/bin/bash
rm -rf build/zipapp && mkdir -p build/zipapp dist
cp -r greeter build/zipapp/
python3 -m zipapp build/zipapp -m "greeter.cli:main" -o dist/greeter.pyz -p "/usr/bin/env python3"
