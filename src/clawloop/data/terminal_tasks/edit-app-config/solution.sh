#!/bin/bash
sed -i -e 's/^listen_port = .*/listen_port = 9090/' -e 's/^debug = .*/debug = true/' \
  -e 's/^log_level = .*/log_level = warning/' -e 's/^cache_dir = /# cache_dir = /' app.conf
