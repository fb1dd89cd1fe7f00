#!/bin/bash
grep -rlw --include='*.py' get_user pyapp | grep -v '^pyapp/vendor/' | xargs sed -i -E 's/\bget_user\b/fetch_user/g'
sed -i 's/from vendor.legacy import fetch_user as legacy_get_user/from vendor.legacy import get_user as legacy_get_user/' pyapp/main.py
