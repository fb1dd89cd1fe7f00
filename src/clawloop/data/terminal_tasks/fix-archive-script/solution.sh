#!/bin/bash
cat > archive_reports.sh <<'EOF'
#!/bin/bash
# Copy the CSV reports of SRC into DEST.
SRC=$1
DEST=$2
mkdir -p "$DEST"
count=0
for f in "$SRC"/*.csv; do
    [ -f "$f" ] || continue
    cp "$f" "$DEST/"
    count=$((count + 1))
done
echo "archived $count files"
EOF
chmod +x archive_reports.sh
./archive_reports.sh reports archive
