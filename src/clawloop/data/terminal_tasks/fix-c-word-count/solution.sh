#!/bin/bash
cat > wc_lite.c <<'EOF'
#include <stdio.h>

int main(void) {
    int c, in_word = 0;
    long words = 0;
    while ((c = getchar()) != EOF) {
        if (c == ' ' || c == '\t' || c == '\n') {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            words++;
        }
    }
    printf("%ld\n", words);
    return 0;
}
EOF
gcc -O2 -Wall -o wc_lite wc_lite.c
