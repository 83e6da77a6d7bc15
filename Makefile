# Two commands do everything on a fresh machine: `make run` and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
PYTHON3 ?= python3

.PHONY: run test bench venv tools clean jepsen jepsen-long

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	command -v java >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null)
	$(PY) -m pip install -q -e '.[test,spark]'
	touch $(STAMP)

venv: $(STAMP)

# A local cluster on 127.0.0.1:7711-7713 with the embedded default config; Ctrl-C stops it.
run: venv
	$(PY) -m disque.devcluster --nodes 3 --port 7711

# System tools the tests and benchmarks use (redis-cli for compatibility tests,
# redis-benchmark/redis-server for the reference figures).
tools:
	@command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null && command -v redis-server >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-tools redis-server >/dev/null)

# The whole suite; the sans-IO core must stay fully covered (pyproject.toml).
test: venv tools
	$(PY) -m pytest --cov --cov-report=term-missing

# Benchmarks print figures (ratios against redis-server measured in the same run).
bench: venv tools
	$(PY) bench/run.py

# Fault injection against 5 real nodes (network namespaces as root, else TCP
# proxies); results in jepsen-lite/runs/latest/.  See jepsen-lite/README.md.
jepsen: venv
	$(PY) jepsen-lite/run.py --faults halves,majority,bridge,kill --duration 48 --fault-s 8 --gap-s 4 --seed 1

jepsen-long: venv
	$(PY) jepsen-lite/run.py --faults all --duration 540 --fault-s 10 --gap-s 5 --seed 1

clean:
	rm -rf $(VENV) build *.egg-info
