#!/bin/bash
set -e
cd /app
cat > Makefile <<'MK'
CC = gcc
CFLAGS = -O2 -Wall -Wextra
# -MMD writes build/NAME.d next to each object; -MP adds empty rules for headers so a deleted
# header does not break the build.
DEPFLAGS = -MMD -MP

SRCS = $(wildcard src/*.c)
OBJS = $(SRCS:src/%.c=build/%.o)

app: $(OBJS)
	$(CC) -o $@ $(OBJS)

build/%.o: src/%.c | build
	$(CC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

build:
	mkdir -p build

clean:
	rm -rf build app

.PHONY: clean

-include $(OBJS:.o=.d)
MK
make clean
make
./app
