#!/bin/bash
mkdir -p bin
cat > bin/greet <<'EOF'
#!/bin/bash
upper=0
if [ "${1:-}" = "-u" ]; then upper=1; shift; fi
if [ $# -lt 1 ]; then
  echo "usage: greet [-u] NAME" >&2
  exit 2
fi
msg="Hello, $1!"
if [ $upper = 1 ]; then msg=$(printf '%s' "$msg" | tr 'a-z' 'A-Z'); fi
printf '%s\n' "$msg"
EOF
chmod +x bin/greet
