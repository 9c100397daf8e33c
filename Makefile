# clrscope developer and CI entry points. The test-bed logic lives in tests/testbed/*.sh.
#
#   make check         fmt, clippy and the tests that need no .NET (unit, golden, fixtures): minutes
#   make test          setup + build + every test against real .NET 10 processes
#   make test-matrix   the runtime-dependent tests on every runtime of the test bed (8, 9, 10, 11)
#   make demo          the agent, the sample service under load, and what clrscope sees of it
#   make setup         install what the tests use if missing (the offline mirror when ../shared/mirror
#                      exists, the .NET runtimes 8/9/10/11 side by side, go, prometheus, chromium, npm
#                      and Python peers; see tests/testbed/setup.sh) and build tests/targets
#   make build         cargo build --workspace --all-targets
#   make fmt           check formatting        make lint   clippy with warnings as errors
#
# CLRSCOPE_DOTNET=8 make test runs the whole suite on another runtime of the matrix.

SHELL := /bin/bash
CARGO ?= cargo
SETUP := tests/testbed/setup.sh
RUN_TESTS := tests/testbed/run-tests.sh

.PHONY: all mirror setup build check test test-matrix demo fmt lint
all: build

# Points cargo and pip at ../shared/mirror when it exists beside the clone (no registry here).
mirror:
	@bash $(SETUP) mirror

setup:
	@bash $(SETUP) all

build: mirror
	$(CARGO) build --workspace --all-targets

check: mirror fmt lint
	@CARGO=$(CARGO) bash $(RUN_TESTS) check

test: setup build
	@CARGO=$(CARGO) bash $(RUN_TESTS) test

test-matrix: setup build
	@CARGO=$(CARGO) bash $(RUN_TESTS) matrix

demo:
	@bash $(SETUP) demo
	@CARGO=$(CARGO) bash tests/testbed/build.sh
	@bash tests/testbed/demo.sh

fmt: mirror
	$(CARGO) fmt --all -- --check

lint: mirror
	$(CARGO) clippy --workspace --all-targets -- -D warnings
