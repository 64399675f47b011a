# keyrange-proxy developer targets.  `make test` and `make demo` work from a clean clone on
# Debian/Ubuntu: they install missing system packages (scripts/install-system-deps), create
# the virtualenv and fetch the Kafka jars on first use.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_FLAGS ?= -q -p no:cacheprovider --durations=15
# Re-dated by the script only when it installed packages (e.g. the xxHash header the C
# split kernel needs), so the virtualenv and its C accelerators are rebuilt exactly then.
SYSDEPS := build/system-deps.stamp

.PHONY: venv jars toxiproxy lint stubs test unit demo clean system-deps image FORCE

system-deps: $(SYSDEPS)

$(SYSDEPS): FORCE
	@PYTHON=$(PYTHON) scripts/install-system-deps

FORCE:

venv: $(STAMP)

# The C accelerators setup.py builds in place (records, native relay, range commits): a
# changed source rebuilds them, so no test runs against a stale extension.
CSOURCES := $(sort $(wildcard proxy/*.c proxy/*.h proxy/*/*.c proxy/*/*.h proxy/*/*/*.c proxy/*/*/*.h))

$(STAMP): pyproject.toml setup.py $(CSOURCES) proxy/net/native_table.py proxy/protocol/constants.py $(SYSDEPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	KEYRANGE_ACCELERATORS=$$(command -v cc >/dev/null && echo required || echo optional) \
		$(PY) -m pip install --quiet -e '.[test,bench,spark]'
	touch $(STAMP)

# Downloads every jar the suite needs (the Kafka broker, Spark's Kafka connector, Kafka's Java
# tools) from Maven Central into ${KEYRANGE_CACHE:-~/.cache/keyrange-proxy} once; skips Maven
# entirely when the cache is complete.
jars: $(STAMP)
	$(PY) -m harness.kafka_cluster fetch-jars

# Builds the Toxiproxy server (network fault injection for the fault tests) with `go install`
# into ${KEYRANGE_CACHE:-~/.cache/keyrange-proxy}/toxiproxy-<version> once; silent when there.
toxiproxy: $(STAMP)
	@$(PY) -m harness.toxiproxy install

# ruff (style, imports, likely bugs) and mypy (types) over the code; before the suite, so a
# slip fails in seconds rather than after it.
lint: $(STAMP)
	$(VENV)/bin/ruff check proxy harness tests benchmarks fuzz chaos experiments
	$(PY) -m proxy.protocol.stubs --check
	$(VENV)/bin/mypy

# The typed view of the messages (proxy/protocol/message_types.pyi) and the version
# constants (message_versions.py), generated from the message definitions: run after a
# schema change (kafka-python bump, protocol_schemas/ edit) and commit the result.
stubs: $(STAMP)
	$(PY) -m proxy.protocol.stubs

test: venv jars toxiproxy lint
	$(PY) -m pytest $(PYTEST_FLAGS)

# Only tests/unit: no broker, no JVM, no network faults (the quick check while editing).
unit: venv
	$(PY) -m pytest $(PYTEST_FLAGS) tests/unit

# Fetches only the product's jars (the Kafka broker, Spark's Kafka connector for the pipeline
# example), not the tests' Java tools.
demo: venv
	$(PY) -m proxy.local_kafka fetch-jars
	$(PY) -m proxy.demo

# The comparison benchmarks against share groups, Parallel Consumer, Kroxylicious and a bare
# relay (python -m benchmarks; about 35 minutes on 2 cores); writes benchmarks/results/.
.PHONY: bench
bench: venv jars
	$(PY) -m benchmarks

# Coverage-guided fuzzing of everything that parses bytes from clients, brokers or the
# configuration (python -m fuzz; one target at a time, FUZZ_RUNS executions each); writes
# benchmarks/results/fuzz.json and saves crashes to fuzz/crashes/. Not part of `make test`.
FUZZ_RUNS ?= 1000000
.PHONY: fuzz
fuzz: venv
	$(PY) -m pip install --quiet -e '.[fuzz]'
	$(PY) -m fuzz all --runs $(FUZZ_RUNS)

# The chaos matrix (python -m chaos): every workload under every fault, with live production,
# on a three-node cluster with a sidecar proxy per broker; writes
# benchmarks/results/reliability.json and docs/reliability.md. Its smoke (chaos.matrix.SMOKE)
# is part of `make test`. CHAOS_ARGS: cell globs or --seed N, e.g. CHAOS_ARGS='group-*:* --seed 7'.
CHAOS_ARGS ?=
.PHONY: chaos
chaos: venv jars toxiproxy
	$(PY) -m chaos $(CHAOS_ARGS)

# The container image (Containerfile, deploy/README.md): the wheel with its C accelerators
# built in a first stage, a runtime stage with a user without privileges and keyrange-proxy
# as entrypoint. BASE_IMAGE is both stages' base (a Debian-based Python 3.11+ image); the
# chroot isolation runs the build's steps without cgroups (nested containers, CI machines).
# IMAGE_BUILD_FLAGS adds podman build options, e.g. --build-arg PIP_CERT=... with --volume.
IMAGE ?= localhost/keyrange-proxy:latest
BASE_IMAGE ?= docker.io/library/python:3.11-slim
IMAGE_BUILD_FLAGS ?=
image:
	podman build --isolation=chroot --build-arg BASE=$(BASE_IMAGE) $(IMAGE_BUILD_FLAGS) -t $(IMAGE) .

clean:
	rm -rf $(VENV) build *.egg-info
