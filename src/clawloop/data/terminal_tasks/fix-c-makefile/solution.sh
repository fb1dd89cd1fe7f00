#!/bin/bash
cd calc
cat > Makefile <<'EOF'
CC = gcc
CFLAGS = -O2 -Wall
OBJS = main.o ops.o

calc: $(OBJS)
	$(CC) $(CFLAGS) -o calc $(OBJS) -lm

%.o: %.c ops.h
	$(CC) $(CFLAGS) -c $<

clean:
	rm -f calc $(OBJS)
EOF
make
