#!/bin/bash
# Copy the CSV reports of SRC into DEST.
SRC=$1
DEST=$2
count=0
ls $SRC/*.csv | while read f; do
    cp $f $DEST/
    count=$((count + 1))
done
echo "archived $count files"
