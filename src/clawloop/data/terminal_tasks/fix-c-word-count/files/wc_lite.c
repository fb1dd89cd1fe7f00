#include <stdio.h>

int main(void) {
    int c;
    long words = 0
    while ((c = getchar()) != EOF) {
        if (c == ' ' || c == '\t' || c == '\n')
            words++;
    }
    printf("%ld\n", words);
    return 0;
}
