#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ops.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: calc add|mul|hyp A B\n");
        return 2;
    }
    double a = atof(argv[2]), b = atof(argv[3]);
    if (strcmp(argv[1], "add") == 0) printf("%.2f\n", op_add(a, b));
    else if (strcmp(argv[1], "mul") == 0) printf("%.2f\n", op_mul(a, b));
    else if (strcmp(argv[1], "hyp") == 0) printf("%.2f\n", op_hyp(a, b));
    else { fprintf(stderr, "unknown op %s\n", argv[1]); return 2; }
    return 0;
}
