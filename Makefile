# Two commands do everything on a fresh machine: `make run` and `make test`.
# Each target installs what it runs and nothing more, into one .venv (a stamp
# file per level) and, for system tools, with apt-get (Debian packages; apt-get
# update only when a command is missing):
#   run            the package alone: enough to run nodes, its core compiled
#                  when gcc and Python's headers are there (`tools-cc` installs
#                  them; without them the core runs as Python)
#   jepsen(-long)  + the test extra (its plots) + iproute2, iptables (netns mode),
#                  faketime (its clock fault)
#   test, venv     + the spark extra; test also a JDK (Spark), redis-tools,
#                  redis-server, iproute2, iptables, chromium,
#                  chromium-driver, faketime, systemd and memcached (`tools`)
#   bench          the venv of test + a JDK, redis-tools, redis-server, and
#                  the bench extra in .venv-bench (the worker comparison's peers)
#   extras         + the extras named in EXTRAS (make extras EXTRAS=spark)
VENV       := .venv
PY         := $(VENV)/bin/python
PYTHON3    ?= python3
RUN_STAMP  := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
STAMP      := $(VENV)/.installed

.PHONY: run test test-slow test-read-behind scale bench venv extras tools tools-cc tools-valgrind tools-strace tools-redis tools-java tools-net tools-browser tools-clock tools-systemd tools-memcached clean jepsen jepsen-long

# The modules setup.py compiles (disque/compiled.txt, its lines that are
# paths): the install is redone when one of them changes, so the extensions
# never lag behind their sources.
COMPILED   := $(shell grep '^disque/.*\.py$$' disque/compiled.txt)

# Four steps, each announced, a line at least every ten seconds: the
# editable install is a static path in site-packages (editable_mode=compat),
# which mypy follows too, and its core is compiled in place afterwards, one C
# file per CPU at once (setup.py), with the build's own tools in .venv.
$(RUN_STAMP): pyproject.toml setup.py disque/compiled.py disque/compiled.txt $(COMPILED) | tools-cc
	@test -x $(PY) || { echo "[1/4] creating the virtual environment $(VENV)"; $(PYTHON3) -m venv $(VENV); }
	@echo "[2/4] installing pip and the build's tools (setuptools, mypy) into $(VENV)"
	@$(call ticking,$(PY) -m pip install -q --upgrade pip && $(build_reqs) | xargs -d '\n' $(PY) -m pip install -q,installing)
	@echo "[3/4] installing the package (editable), its dependencies, and redis-py and pymemcache for the README's snippets"
	@$(call ticking,PYTHONWARNINGS=ignore DISQUE_PURE=1 $(PY) -m pip install -q --no-build-isolation --config-settings editable_mode=compat -e '.[clients]',installing)
	@echo "[4/4] compiling the core with mypyc (about a minute on two idle cores; docs/running.md)"
	@$(PY) setup.py -q build_ext --inplace --parallel $$(nproc)
	@touch $@

# `$(call ticking,command,what)`: run the command, saying `... what, N s`
# every ten seconds until it ends.
ticking = ( $(1) ) & pid=$$!; s=0; while kill -0 $$pid 2>/dev/null; do sleep 1; s=$$((s + 1)); \
	[ $$((s % 10)) -ne 0 ] || echo "    ... $(2), $$s s"; done; wait $$pid

# The build's requirements (pyproject.toml's build-system), one a line.
build_reqs = $(PY) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")'

# The requirements of extras ($(1): their names, comma-separated, as in
# EXTRAS), read from pyproject.toml, into the Python $(2) (.venv's by
# default): installing them alone spares a second build of the package.
extra = reqs=$$($(PY) -c 'import sys, tomllib; known = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]; \
	names = [n for n in sys.argv[1].split(",") if n]; bad = [n for n in names if n not in known] or not names; \
	sys.exit("EXTRAS: one or more of " + ", ".join(known) + ", comma-separated") if bad else print(*(r for n in names for r in known[n]), sep="\n")' '$(1)') && \
	echo "$$reqs" | xargs -d '\n' $(or $(2),$(PY)) -m pip install -q

$(TEST_STAMP): $(RUN_STAMP)
	$(call extra,test)
	touch $@

$(STAMP): $(TEST_STAMP)
	$(call extra,spark)
	touch $@

# Everything the test suite imports.
venv: $(STAMP)

# `make extras EXTRAS=spark,dramatiq`: the requirements of optional extras
# into .venv, next to the editable install (`pip install '.[spark]'` would
# replace it with a copy).  The package is installed first only when it is
# not yet: this target never rebuilds it.
extras:
	@test -e $(RUN_STAMP) || $(MAKE) --no-print-directory $(RUN_STAMP)
	@echo "installing the requirements of the extra(s) $(EXTRAS) into $(VENV)"
	@$(call extra,$(EXTRAS))

# `$(call apt,command:package ...)`: apt-get install the packages of the
# commands that are missing, quietly and without questions.
apt = missing=; $(foreach need,$(1),command -v $(word 1,$(subst :, ,$(need))) >/dev/null || missing="$$missing $(word 2,$(subst :, ,$(need)))";) \
	[ -z "$$missing" ] || { echo "apt-get install$$missing"; apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; }

# gcc and Python's headers, for the compiled core (setup.py); without them
# the install builds the pure-Python core.
tools-cc:
	@$(call apt,gcc:gcc)
	@$(PY3_HEADERS) || { echo "apt-get install python3-dev"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-dev >/dev/null; }

PY3_HEADERS = $(PYTHON3) -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'

# redis-cli for the compatibility tests; redis-server and redis-benchmark (in
# redis-tools) for the reference figures of the benchmarks.
tools-redis:
	@$(call apt,redis-cli:redis-tools redis-server:redis-server)

# The JVM Spark runs on (tests/spark, bench/spark.py).
tools-java:
	@$(call apt,java:openjdk-17-jre-headless)

# jepsen-lite's netns mode (ip and tc of iproute2; iptables-restore).  Without
# them it runs in its proxy mode, so a failed install only warns.
tools-net:
	@$(call apt,ip:iproute2 iptables-restore:iptables) || \
		echo "could not install iproute2 and iptables: jepsen-lite will use its proxy mode"

# Headless Chromium and its driver for the dashboard's browser test.
tools-browser:
	@$(call apt,chromium:chromium chromedriver:chromium-driver)

# libfaketime (the faketime package) for the clock-step tests and jepsen-lite's clock fault.
tools-clock:
	@$(call apt,faketime:faketime)

# memcached, the reference of the memcache port's tests and benchmark (bench/memcache.py).
tools-memcached:
	@$(call apt,memcached:memcached)

# valgrind, for the instruction counts of bench/instructions.py and
# bench/codec_frames.py (docs/performance.md, and `make bench`); not part of `make tools`.
tools-valgrind:
	@$(call apt,valgrind:valgrind)

# strace, for the system calls per request of bench/request_path.py.
tools-strace:
	@$(call apt,strace:strace)

# systemd-analyze (the systemd package) verifies examples/disque@.service.
tools-systemd:
	@$(call apt,systemd-analyze:systemd)

# Every system tool the test suite runs.
tools: tools-redis tools-java tools-net tools-browser tools-clock tools-systemd tools-memcached

# A local cluster on 127.0.0.1:7711-7713 with the embedded default config; Ctrl-C stops it.
run: $(RUN_STAMP)
	$(PY) -m disque.testing.devcluster --nodes 3 --port 7711 --metrics-port 9711 --memcache-port 22133

# Three runs at once, which share the cores (the real-process tests mostly
# wait on their nodes): the real-process tests (tests/integration) and the
# rest of the suite on the compiled core, and the in-process tests on the
# pure-Python core, which they must cover fully (pyproject.toml; the
# simulations of random fault plans run on the compiled core only).  The
# reports of the other two follow the first's.
test: $(STAMP) tools
	@DISQUE_PURE=1 $(PY) -m pytest -p no:cacheprovider --cov --cov-report=term-missing -m "not random_plans" tests/inprocess tests/sim \
		> $(VENV)/pure-core.log 2>&1 & pure=$$!; \
	$(PY) -m pytest -p no:cacheprovider tests --ignore=tests/integration > $(VENV)/compiled-core.log 2>&1 & rest=$$!; \
	$(PY) -m pytest tests/integration; processes=$$?; \
	wait $$rest; compiled=$$?; \
	wait $$pure; covered=$$?; \
	echo "=== the rest of the suite on the compiled core (tests but tests/integration)"; \
	cat $(VENV)/compiled-core.log; \
	echo "=== the in-process tests on the pure-Python core, with coverage (tests/inprocess, tests/sim)"; \
	cat $(VENV)/pure-core.log; \
	exit $$(( processes || compiled || covered ))

# The tests marked `slow` alone (tests/conftest.py skips them elsewhere):
# the long hypothesis and simulation runs, read-behind at 100k jobs, Spark's
# own driver, jepsen-lite's admin run, the metrics of 10,000 queues.
test-slow: $(STAMP) tools
	$(PY) -m pytest -p no:cacheprovider -m slow

# The suite again with read-behind forced on (docs/read-behind.md): every
# queue keeps two jobs in memory, every replica waits on disk.
test-read-behind: $(STAMP) tools
	DISQUE_TEST_READ_BEHIND=force $(PY) -m pytest -p no:cacheprovider

# Clusters of many nodes (docs/performance.md, "Scale"): 24, 48 and 100 idle
# local nodes joined, their join time, CPU and memory, and any fail flag
# (next to C Disque's when DISQUE_C names its binary).
scale: $(STAMP)
	$(PY) bench/scale.py --nodes 24,48,100 --idle 60

# Benchmarks print figures (ratios against redis-server measured in the same run).
# The worker comparison's peers (the bench extra) live in .venv-bench, apart
# from .venv: their redis-py pin would break the test extra's.
BENCH_VENV := .venv-bench
$(BENCH_VENV)/.installed: pyproject.toml
	@test -x $(BENCH_VENV)/bin/python || $(PYTHON3) -m venv $(BENCH_VENV)
	@echo "installing the bench extra (Celery, RQ, Dramatiq, huey, arq, taskiq) into $(BENCH_VENV)"
	@$(call extra,bench,$(BENCH_VENV)/bin/python)
	@touch $@

bench: $(STAMP) $(BENCH_VENV)/.installed tools-redis tools-java tools-memcached tools-strace tools-valgrind
	$(PY) bench/run.py

# Fault injection against 5 real nodes (network namespaces as root, else TCP
# proxies); results in jepsen-lite/runs/latest/.  See jepsen-lite/README.md.
jepsen: $(TEST_STAMP) tools-net tools-clock
	$(PY) jepsen-lite/run.py --extensions --faults halves,majority,bridge,kill,clock --duration 60 --fault-s 8 --gap-s 4 --seed 1

jepsen-long: $(TEST_STAMP) tools-net tools-clock
	$(PY) jepsen-lite/run.py --faults all --duration 540 --fault-s 10 --gap-s 5 --seed 1
	$(PY) jepsen-lite/run.py --nodes 6 --zones 3 --min-zones 2 --replicate 3 --faults zone,halves,kill --duration 240 --fault-s 10 --gap-s 5 --seed 1
	$(PY) jepsen-lite/run.py --schedules 3 --faults halves,majority,bridge,kill,pause,clock --nodes 3 --duration 192 --fault-s 4 --gap-s 12 --seed 1
	$(PY) jepsen-lite/run.py --faults disk --workload at-least-once --duration 240 --fault-s 5 --gap-s 3 --seed 1

clean:
	rm -rf $(VENV) build *.egg-info
