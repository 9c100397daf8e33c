# clrscope developer and CI entry points. The test-bed logic lives in tests/testbed/*.sh.
#
#   make setup   install what the tests use if missing (.NET >= 8, mcs, go, curl, chromium,
#                playwright-core, the Connect client's npm packages; see tests/testbed/setup.sh);
#                compile tests/targets/*.cs
#   make build   cargo build --workspace --all-targets
#   make test    setup + build + cargo test --workspace
#   make demo    the agent, the sample Bookstore under load, and what clrscope sees of it (tests/testbed/demo.sh);
#                installs only what the demo uses (.NET, mcs, curl); builds quietly (tests/testbed/build.sh)
#   make fmt     check formatting        make lint   clippy with warnings as errors

SHELL := /bin/bash
CARGO ?= cargo
TESTBED := $(or $(CLRSCOPE_TESTBED_DIR),.testbed)
SETUP := tests/testbed/setup.sh

TARGET_SRCS := $(wildcard tests/targets/*.cs)
COMMON_SRCS := $(wildcard tests/targets/common/*.cs)
TARGET_NAMES := $(basename $(notdir $(TARGET_SRCS)))
TARGET_DLLS := $(foreach n,$(TARGET_NAMES),$(TESTBED)/targets/$(n)/$(n).dll)
# What `setup.sh` installs before targets compile: everything the tests use, or the demo's part.
SETUP_MODE := runtime

.PHONY: all setup build test demo fmt lint FORCE
all: build

setup: $(TESTBED)/runtime.env $(TARGET_DLLS)

# Always checked (fast when installed); the script rewrites runtime.env only when it changes, so
# targets are recompiled only when their .cs, the setup script or the runtime changed.
$(TESTBED)/runtime.env: FORCE
	@bash $(SETUP) $(SETUP_MODE)

.SECONDEXPANSION:
$(TESTBED)/targets/%.dll: tests/targets/$$(notdir $$*).cs $(COMMON_SRCS) $(SETUP) $(TESTBED)/runtime.env
	@bash $(SETUP) compile $<

build:
	$(CARGO) build --workspace --all-targets

test: setup build
	@CARGO=$(CARGO) bash tests/testbed/run-tests.sh

demo: SETUP_MODE := demo
demo: $(TESTBED)/runtime.env $(TESTBED)/targets/Bookstore/Bookstore.dll
	@CARGO=$(CARGO) bash tests/testbed/build.sh
	@bash tests/testbed/demo.sh

fmt:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
