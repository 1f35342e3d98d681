# muster: the README names two targets, `make demo` and `make test`; the rest serve them.
SHELL := /bin/bash
CARGO ?= cargo
BIN_DIR = $(shell bash tools/k8s/bindir.sh)

.PHONY: plugin all build release host-deps host-deps-demo host-deps-real test test-rest unit e2e e2e-real e2e-jobs e2e-placement e2e-compat chaos e2e-rbac e2e-service chart-lint chart-test crds crds-check fmt clippy bench bench-e2e bench-agents bench-writes controlplane cluster-up cluster-down run demo demo-down demo-check docs docs-ref docs-check

all: build

build:
	$(CARGO) build

release:
	$(CARGO) build --release

## The host packages the README's commands need (hack/host-deps.sh): installed when root and
## apt-get are there, otherwise make stops before any build, printing the exact command to run.
host-deps:
	@bash hack/host-deps.sh test

host-deps-demo:
	@bash hack/host-deps.sh demo

host-deps-real:
	@bash hack/host-deps.sh real

## Every test: formatting, lints, CRD drift, the chart's lint, unit and property tests, then the
## real control plane (the e2e suite, its controller tests again with muster as the chart's
## ServiceAccount, the webhooks through their Service, then the chart on a control plane of its
## own, then the demo in both modes). host-deps comes first, so a missing package stops it
## before anything is built. To stay within 15 minutes warm, it leaves out the e2e tests in
## E2E_LONG and runs e2e-rbac's short set (E2E_RBAC_SHORT); `make test-rest` runs what it left
## out, and CI (.ci/run) runs both.
test: host-deps
	$(MAKE) crds-check chart-lint
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) test --lib --bins
	$(MAKE) docs-check
	$(MAKE) e2e E2E_ARGS="$(addprefix --skip ,$(E2E_LONG))"
	$(MAKE) e2e-rbac E2E_RBAC_SET="$(E2E_RBAC_SHORT)"
	$(MAKE) e2e-service
	$(MAKE) chart-test
	MUSTER_DEMO_PROFILE=debug $(MAKE) demo-check
	MUSTER_DEMO_PROFILE=debug $(MAKE) demo-check MODE=upstream

## What `make test` leaves out for time: the e2e tests in E2E_LONG (each the second disruption
## mode of a rollback cause whose other mode `make test` runs), then every e2e-rbac test.
test-rest:
	$(MAKE) e2e E2E_ARGS="$(E2E_LONG)"
	$(MAKE) e2e-rbac

unit:
	$(CARGO) test --lib --bins

## The kubectl plugin is a crate of its own; the e2e tests run its binary from the folder of
## the muster binary under test, so the workspace's binaries are built (debug, as `cargo test`
## builds) before them. `--bins` of the whole workspace, not `-p kubectl-muster`: building the
## plugin alone resolves its dependencies' features apart and compiles them a second time.
plugin:
	$(CARGO) build --bins

## Tests against a real control plane (built once per machine, cached outside the repo).
## The harness's watchdog stops the cluster when the tests end; the loop waits for that here,
## so nothing is left running when make returns.
## The placement differential against kube-scheduler (tests/e2e/placement_diff.rs) runs a
## short, representative set here; `make e2e-placement` runs all of its scenarios.
PD_SHORT = anti-affinity-one-per-node,anti-affinity-one-per-rack-too-many,affinity-together-in-rack,spread-min-domains,symmetric-anti-affinity,host-port-too-many,pv-node-affinity,wffc-shared,missing-claim,sidecar-over
## The Job differential (tests/e2e/job_semantics.rs: batch/v1 Job vs MusterJob, all 44
## scenarios, about 90 s) and the JobSet scenarios run in full here; `make e2e-jobs` runs only
## them, and `MUSTER_JOB_DIFF=name,...` a subset of the differential.
## E2E_ARGS: libtest arguments (test name filters, `--skip NAME`). E2E_LONG: the slowest tests
## whose cause another test covers in the other disruption mode (about a minute of the suite's
## wall time at 4 threads); `make test` skips them, `make test-rest` runs them.
E2E_ARGS ?=
E2E_LONG = rollback::unmodelled_volume_limit_rolls_back_and_waits_all rollback::node_deleted_after_pinning_rolls_back_all rollback::capacity_taken_before_binding_rolls_back_single
e2e: controlplane plugin
	MUSTER_PD_SCENARIOS=$${MUSTER_PD_SCENARIOS:-$(PD_SHORT)} MUSTER_K8S_BIN=$(BIN_DIR) $(CARGO) test -p muster --test e2e -- --test-threads=4 $(E2E_ARGS); rc=$$?; \
	for d in target/e2e-cluster-*; do \
	  [ -d "$$d" ] && [ ! -e "/proc/$${d##*-}" ] && MUSTER_CLUSTER_DIR="$$d" bash hack/cluster-down.sh > /dev/null 2>&1; \
	done; exit $$rc

## Only the Job differential and the JobSet scenarios (about 3 min).
e2e-jobs: controlplane
	MUSTER_K8S_BIN=$(BIN_DIR) $(CARGO) test -p muster --test e2e -- --test-threads=4 job_semantics:: jobset_semantics::; rc=$$?; \
	for d in target/e2e-cluster-*; do \
	  [ -d "$$d" ] && [ ! -e "/proc/$${d##*-}" ] && MUSTER_CLUSTER_DIR="$$d" bash hack/cluster-down.sh > /dev/null 2>&1; \
	done; exit $$rc

## The real-node lane (tests/real, hack/real-node.sh; as root): a control plane with one real
## node (containerd, Debian's runc, kubelet and kube-proxy built at the control plane's version,
## a CNI bridge) beside kwok nodes; muster's image built from the release binary by
## hack/image.sh and imported into containerd; `helm install` of the chart; the test device
## plugin; gangs of real containers; the examples that fit; the leader killed mid-admission;
## `helm upgrade` to a rebuilt image; `helm uninstall`. Report in target/e2e-real/report.md.
## REAL_PROFILE=debug builds the image from the debug binary `make test` already built (.ci/run
## does, to stay within CI's time); the default is the release binary, as a release ships.
REAL_PROFILE ?= release
e2e-real: host-deps-real controlplane
	@bash tools/k8s/build-node.sh > /dev/null
	$(CARGO) build --locked --bin muster $(if $(filter release,$(REAL_PROFILE)),--release)
	MUSTER_REAL_BINARY=$(CURDIR)/target/$(REAL_PROFILE)/muster MUSTER_K8S_BIN=$(BIN_DIR) $(CARGO) test -p muster --test real -- --nocapture; rc=$$?; \
	for d in target/e2e-cluster-*; do \
	  [ -d "$$d" ] && [ ! -e "/proc/$${d##*-}" ] && MUSTER_CLUSTER_DIR="$$d" bash hack/cluster-down.sh > /dev/null 2>&1; \
	done; exit $$rc

## Every scenario of the placement differential against kube-scheduler (about 2.5 min).
e2e-placement: controlplane
	MUSTER_K8S_BIN=$(BIN_DIR) $(CARGO) test -p muster --test e2e -- --test-threads=4 placement_diff::; rc=$$?; \
	for d in target/e2e-cluster-*; do \
	  [ -d "$$d" ] && [ ! -e "/proc/$${d##*-}" ] && MUSTER_CLUSTER_DIR="$$d" bash hack/cluster-down.sh > /dev/null 2>&1; \
	done; exit $$rc

## Every Kubernetes version muster claims (hack/e2e-compat.sh): per version its control plane
## (built once, cached by version; a cold build is about 10-15 min each), the e2e subset that
## covers compile, webhooks, gang admission and GPU indices, the demo check and the chart tests;
## a table at the end (target/compat/summary.md). MUSTER_COMPAT_VERSIONS picks versions.
e2e-compat: host-deps
	bash hack/e2e-compat.sh

## The chaos suite's long profile (tests/e2e/chaos.rs; several minutes): 40 nodes, 60 gangs,
## 20 SIGKILLs of muster (single replica, then the leader of two), nodes removed, pods deleted.
## `make e2e` runs its short profile. It prints the seed and the figures; replay a run with
## `make chaos MUSTER_CHAOS_SEED=<seed>` (MUSTER_CHAOS_NODES, _GANGS, _KILLS, ... override sizes).
chaos: controlplane
	MUSTER_CHAOS_PROFILE=$${MUSTER_CHAOS_PROFILE:-long} MUSTER_K8S_BIN=$(BIN_DIR) $(CARGO) test -p muster --test e2e -- --test-threads=1 --nocapture chaos::; rc=$$?; \
	for d in target/e2e-cluster-*; do \
	  [ -d "$$d" ] && [ ! -e "/proc/$${d##*-}" ] && MUSTER_CLUSTER_DIR="$$d" bash hack/cluster-down.sh > /dev/null 2>&1; \
	done; exit $$rc

## The controller and webhook e2e tests again, with muster running as the Helm chart's
## ServiceAccount against the chart's RBAC and webhook configurations (tests/e2e/harness/rbac.rs);
## then hack/e2e-rbac-check.sh fails if the apiserver refused muster anything.
## E2E_RBAC_SHORT (what `make test` runs, about a quarter of the tests' time): per module the
## tests that reach each kind of request muster makes (compile, gate, pin, roll back and
## recreate, GPU indices, preempt, events, status, JobSet children, upstream objects, claims,
## limits), leaving out the slow ones whose requests another test makes too.
E2E_RBAC_TESTS = jobs:: webhook:: admission:: gpus:: differential:: upstream:: preemption:: hostile::
E2E_RBAC_SHORT = \
  admission::a_gang_that_fits_is_admitted_whole admission::a_composite_gang_is_admitted_only_when_every_child_fits \
  admission::a_pinned_pod_that_cannot_bind_rolls_the_attempt_back admission::a_gang_too_big_binds_nothing_says_why \
  gpus::gangs_admitted_together_get_disjoint_gpu_indices gpus::a_gpu_pod_bound_without_muster_still_gets_free_indices \
  gpus::gpu_gauges_and_conflicts_are_on_metrics gpus::a_finished_pod_frees_its_gpus_for_the_next_pod \
  preemption::a_high_priority_gang_preempts_lower_gangs_wholly preemption::a_pod_muster_does_not_manage_is_preempted \
  preemption::the_room_a_preemption_frees_is_held \
  upstream::upstream_claims_are_allocated_by_kube_scheduler upstream::an_upstream_musterjobset_is_admitted_by_kube_scheduler \
  jobs::jobset_compiles_a_composite_tree_and_child_jobs jobs::min_count_and_parallelism_changes_reach \
  jobs::metrics_count_reconciles_errors_and_durations jobs::a_failed_child_restarts_the_set \
  jobs::forged_delegation_joins_no_set jobs::succeeded_pods_complete_the_job jobs::a_jobset_template_resize_reaches \
  webhook::the_examples_are_admitted webhook::labelled_pods_are_gated webhook::pods_that_cannot_join_a_podgroup \
  webhook::compiled_workloads_and_podgroups_refuse webhook::a_hand_made_pod_groups_priority \
  webhook::with_muster_stopped_only_opted_in_objects_are_refused \
  hostile::a_lowered_cluster_limit_refuses_new_jobs hostile::gpu_indices_on_a_pod_asking_for_no_gpu \
  hostile::muster_keys_in_a_pod_template_are_refused hostile::a_tenant_cannot_remove_the_admission_gate \
  differential::jobs_and_upstream_musterjobs_compile differential::jobs_and_musterjobs_compile_to_the_same_workload
E2E_RBAC_SET ?= $(E2E_RBAC_TESTS)
e2e-rbac: controlplane plugin
	MUSTER_E2E_RBAC=chart MUSTER_K8S_BIN=$(BIN_DIR) $(CARGO) test -p muster --test e2e -- --test-threads=4 $(E2E_RBAC_SET); rc=$$?; \
	bash hack/e2e-rbac-check.sh "$$(ls -td target/e2e-cluster-*/ | head -1)" || rc=1; \
	for d in target/e2e-cluster-*; do \
	  [ -d "$$d" ] && [ ! -e "/proc/$${d##*-}" ] && MUSTER_CLUSTER_DIR="$$d" bash hack/cluster-down.sh > /dev/null 2>&1; \
	done; exit $$rc

## The webhooks as the apiserver calls them inside a cluster, through their Service
## (tests/service): a control plane of its own whose apiserver routes to endpoints, and muster in
## a network namespace behind the Service's EndpointSlice (hack/testhost.sh: root and iproute2).
e2e-service: controlplane
	MUSTER_K8S_BIN=$(BIN_DIR) $(CARGO) test -p muster --test service; rc=$$?; \
	for d in target/e2e-cluster-*; do \
	  [ -d "$$d" ] && [ ! -e "/proc/$${d##*-}" ] && MUSTER_CLUSTER_DIR="$$d" bash hack/cluster-down.sh > /dev/null 2>&1; \
	done; exit $$rc

## The Helm chart without a cluster: lint (default and full values), render, CRD copy up to date.
chart-lint: controlplane
	$(BIN_DIR)/helm lint --strict --quiet charts/muster
	$(BIN_DIR)/helm lint --strict --quiet charts/muster -f charts/muster/ci/full-values.yaml
	$(BIN_DIR)/helm template muster charts/muster > /dev/null
	$(BIN_DIR)/helm template muster charts/muster -f charts/muster/ci/full-values.yaml > /dev/null
	@diff -q crds/muster.yaml charts/muster/crds/muster.yaml > /dev/null || { echo "charts/muster/crds/ is stale: run 'make crds'"; exit 1; }

## The chart on a control plane of its own (tests/chart): server-side dry-run, install, muster
## running with only the chart's RBAC, refusals outside it, upgrades with a changed CRD. Its
## kube-apiserver runs API Priority and Fairness with the default seats (the test clusters
## otherwise have it off), so the chart's FlowSchema is checked as production classifies.
APF_ON = --enable-priority-and-fairness=true --max-requests-inflight=400 --max-mutating-requests-inflight=200
chart-test: controlplane
	MUSTER_APISERVER_EXTRA_ARGS="$(APF_ON) $${MUSTER_APISERVER_EXTRA_ARGS:-}" MUSTER_K8S_BIN=$(BIN_DIR) $(CARGO) test -p muster --test chart; rc=$$?; \
	for d in target/e2e-cluster-*; do \
	  [ -d "$$d" ] && [ ! -e "/proc/$${d##*-}" ] && MUSTER_CLUSTER_DIR="$$d" bash hack/cluster-down.sh > /dev/null 2>&1; \
	done; exit $$rc

## Regenerate crds/ from the Rust types, and the chart's copy of it.
crds:
	$(CARGO) run --quiet --bin muster -- crds > crds/muster.yaml
	cp crds/muster.yaml charts/muster/crds/muster.yaml

## Fail when crds/ or the chart's copy is stale.
crds-check:
	$(CARGO) run --quiet --bin muster -- crds | diff -u crds/muster.yaml - > /dev/null || { echo "crds/ is stale: run 'make crds'"; exit 1; }
	@diff -q crds/muster.yaml charts/muster/crds/muster.yaml > /dev/null || { echo "charts/muster/crds/ is stale: run 'make crds'"; exit 1; }

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --all-targets -- -D warnings

bench:
	$(CARGO) bench

## The side-by-side scale benchmark (hack/bench-e2e.sh; not part of `make test`): muster in
## release against a control plane of its own, kwok GPU nodes, then the same gangs as plain Jobs,
## upstream gang Jobs and MusterJobs; prints pods bound/s, admission latency, muster's RSS and
## CPU, and writes them to BENCH_OUT. Defaults: 1,000 nodes / 200 gangs of 3;
## `make bench-e2e BENCH_NODES=5000 BENCH_GANGS=1000` for the large run.
BENCH_NODES ?= 1000
BENCH_GANGS ?= 200
BENCH_SIZE ?= 3
BENCH_PATHS ?= plain,gang,muster,muster-upstream
BENCH_OUT ?= target/bench-e2e.json
BENCH_APF ?= chart
bench-e2e: controlplane
	BENCH_NODES=$(BENCH_NODES) BENCH_GANGS=$(BENCH_GANGS) BENCH_SIZE=$(BENCH_SIZE) BENCH_PATHS=$(BENCH_PATHS) \
	  BENCH_OUT=$(BENCH_OUT) BENCH_APF=$(BENCH_APF) MUSTER_K8S_BIN=$(BIN_DIR) bash hack/bench-e2e.sh

## GPU health's watch traffic (hack/bench-agents.sh; not part of `make test`): a control plane of
## its own, AGENTS_NODES kwok GPU nodes and as many simulated node agents writing health every
## AGENTS_PERIOD s for AGENTS_DURATION s, on the Node (old) and in NodeGPUReports (new); prints
## the API server's watch events and bytes per second for nodes and nodegpureports.
AGENTS_NODES ?= 1000
AGENTS_PERIOD ?= 30
AGENTS_DURATION ?= 60
bench-agents: controlplane
	AGENTS_NODES=$(AGENTS_NODES) AGENTS_PERIOD=$(AGENTS_PERIOD) AGENTS_DURATION=$(AGENTS_DURATION) \
	  MUSTER_K8S_BIN=$(BIN_DIR) bash hack/bench-agents.sh

## What one write of each kind costs kube-apiserver (hack/bench-writes.sh; not part of
## `make test`): a control plane of its own, WRITES_OBJECTS objects per kind (a MusterJob and a
## PodGroup, each also without its CRD's CEL rules, a Workload, a NodeGPUReport, a ConfigMap, a
## batch/v1 Job), WRITES_ROUNDS rounds of label and status merge patches and status applies;
## prints kube-apiserver's CPU ms per write.
WRITES_OBJECTS ?= 400
WRITES_ROUNDS ?= 5
bench-writes: controlplane
	WRITES_OBJECTS=$(WRITES_OBJECTS) WRITES_ROUNDS=$(WRITES_ROUNDS) MUSTER_K8S_BIN=$(BIN_DIR) bash hack/bench-writes.sh

## Build the control plane binaries into the cache (does nothing when present).
controlplane:
	@bash tools/k8s/build.sh > /dev/null

## A local cluster in target/cluster (MUSTER_CLUSTER_DIR), CRDs installed; then `muster dev add-nodes`.
cluster-up: controlplane
	@MUSTER_K8S_BIN=$(BIN_DIR) bash hack/cluster-up.sh

cluster-down:
	@bash hack/cluster-down.sh

## muster (debug build) against the cluster of `make cluster-up` (MUSTER_CLUSTER_DIR, default
## target/cluster), registering its webhooks there; Ctrl-C stops it. Its addresses are variables:
## `make run RUN_METRICS_ADDRESS=127.0.0.1:18080 RUN_WEBHOOK_ADDRESS=127.0.0.1:19443` when
## 8080 or 9443 is taken (the apiserver calls the webhooks at https://RUN_WEBHOOK_ADDRESS).
RUN_KUBECONFIG ?= $(or $(MUSTER_CLUSTER_DIR),target/cluster)/kubeconfig
RUN_METRICS_ADDRESS ?= 127.0.0.1:8080
RUN_WEBHOOK_ADDRESS ?= 127.0.0.1:9443
run: build controlplane
	@$(BIN_DIR)/kubectl --kubeconfig $(RUN_KUBECONFIG) create namespace muster-system --dry-run=client -o yaml \
	  | $(BIN_DIR)/kubectl --kubeconfig $(RUN_KUBECONFIG) apply -f - > /dev/null
	$(CARGO) run --bin muster -- run --kubeconfig $(RUN_KUBECONFIG) --namespace muster-system \
	  --metrics-bind-address $(RUN_METRICS_ADDRESS) --webhook-bind-address $(RUN_WEBHOOK_ADDRESS) \
	  --webhook-url https://$(RUN_WEBHOOK_ADDRESS) --webhook-manage-configurations=true

## A local GPU cluster running muster end to end (left running; stop with `make demo-down`).
## `make demo MODE=upstream`: the upstream workload-scheduling gates on, muster in upstream
## mode, the same examples admitted by kube-scheduler.
MODE ?= muster
demo: host-deps-demo
	@MUSTER_DEMO_MODE=$(MODE) bash hack/demo.sh

demo-down:
	@bash hack/demo.sh --down

## The demo, non-interactively: exit 0 only when its promises hold (then stops it). It runs in
## its own folder (DEMO_CHECK_DIR), so a demo left running by `make demo` (target/demo) is
## neither reused nor stopped.
DEMO_CHECK_DIR ?= $(CURDIR)/target/demo-check
demo-check:
	@MUSTER_DEMO_MODE=$(MODE) MUSTER_DEMO_DIR=$(DEMO_CHECK_DIR) bash hack/demo.sh --check

## The documentation as a book (mdBook, docs/book.toml; pages in docs/src) into target/book.
## hack/mdbook.sh installs the pinned mdBook once per machine (cargo install, about 2 min).
docs:
	@mdbook=$$(bash hack/mdbook.sh) && $$mdbook build docs && echo "The book: $(CURDIR)/target/book/index.html"

## Regenerate the generated reference from the code (docs/src/reference: every CRD from its
## schema, the flags of `muster run` and `muster node-agent` from clap, the metrics, labels,
## annotations, events and conditions).
docs-ref:
	$(CARGO) run --quiet --bin muster -- docs reference --out docs/src/reference

## The docs cannot rot: the book builds with no warning or error from mdBook (a missing page, a
## broken include), then tests/docs checks README.md, charts/muster/README.md and docs/src:
## relative links and anchors resolve, every page is in SUMMARY.md, every YAML block passes
## `muster validate` (or is refused, when marked `yaml,invalid`), renders the chart
## (`yaml,values`) or parses (`yaml,excerpt`); and the generated reference matches the code
## (`muster docs reference --check`). All three run; any failing fails the target.
docs-check: controlplane
	@mdbook=$$(bash hack/mdbook.sh) || exit 1; \
	echo "docs-check: $$mdbook build docs"; \
	log=$$(set -o pipefail; NO_COLOR=1 $$mdbook build docs 2>&1 | sed 's/\x1b\[[0-9;]*m//g'); rc=$$?; \
	printf '%s\n' "$$log"; \
	if [ $$rc -ne 0 ] || printf '%s\n' "$$log" | grep -Eq '^ *(WARN|ERROR)'; then \
	  echo "docs-check: mdbook build docs reported the problems above"; rc=1; fi; \
	echo "docs-check: muster docs reference --check, then tests/docs"; \
	$(CARGO) run --quiet --bin muster -- docs reference --out docs/src/reference --check || rc=1; \
	MUSTER_K8S_BIN=$(BIN_DIR) $(CARGO) test -p muster --test docs -- --nocapture || rc=1; \
	exit $$rc
